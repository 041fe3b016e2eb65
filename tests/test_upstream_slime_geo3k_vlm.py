"""slime's `examples/geo3k_vlm_multi_turn` (its `rollout.py`, `env_geo3k.py`, `base_env.py` and config YAML,
unchanged in `tests/upstream_slime/examples/`) as a user runs it: `--custom-generate-function-path
examples.geo3k_vlm_multi_turn.rollout.generate --custom-config-path .../geo3k_vlm_multi_turn_config.yaml`,
`--multimodal-keys '{"image": "images"}'`, a parquet in geo3k_imgurl's layout, on the tiny Qwen2-VL behind the
real router. Its generate runs the processor itself, sends the expanded ids with `image_data`, and keeps only the
processor's `torch.Tensor` outputs as `multimodal_train_inputs`; the samples must be token-exact: the trainer's
forward over the sample's tokens and pictures gives the log-probs the engine sampled with.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from slime.cli.args import parse_args
from tests.test_vlm_rollout import picture

UPSTREAM = Path(__file__).parent / "upstream_slime"
RECIPE = UPSTREAM / "examples" / "geo3k_vlm_multi_turn"


def geometry_parquet(directory: Path) -> Path:
    """Two rows as geo3k_imgurl has them: `problem` with its `<image>`, `answer`, `images` as image structs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for color, (a, b) in (("red", (3, 4)), ("blue", (5, 12))):
        buf = io.BytesIO()
        picture(color).save(buf, format="PNG")
        rows.append(
            {
                "problem": f"<image>The legs of the right triangle are {a} and {b}. Find the hypotenuse.",
                "answer": str(int((a * a + b * b) ** 0.5)),
                "images": [{"bytes": buf.getvalue(), "path": None}],
            }
        )
    path = directory / "geo3k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def rollout(tiny_vlm_dir, tmp_path, engine_fork_server, *recipe: str, env: dict | None = None) -> list:
    """One rollout of 2 samples with the recipe's flags through our RolloutManager, the samples as dumped."""
    import ray

    from slime.ray.rollout_manager import RolloutManager
    from slime.rollout.debug_data import load_debug_rollout

    dump = str(tmp_path / "r_{rollout_id}.pt")
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_vlm_dir),
            "--rollout-num-engines",
            "1",
            "--rollout-num-cpus-per-engine",
            "0.5",
            "--engine-threads",
            "1",
            "--prompt-data",
            str(geometry_parquet(tmp_path)),
            "--input-key",
            "problem",
            "--label-key",
            "answer",
            "--apply-chat-template",
            "--rollout-shuffle",
            "--multimodal-keys",
            '{"image": "images"}',
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "1",
            "--rollout-max-response-len",
            "120",
            "--num-rollout",
            "1",
            "--save-debug-rollout-data",
            dump,
            *recipe,
        ]
    )
    options = {"num_cpus": 0, **({"runtime_env": {"env_vars": env}} if env else {})}
    manager = ray.remote(RolloutManager).options(**options).remote(args, engine_fork_server)
    try:
        ray.get(manager.start.remote())
        ray.get(ray.get(manager.generate.remote(0)).inner)
    finally:
        ray.get(manager.shutdown.remote())
    return load_debug_rollout(dump, 0)


def assert_token_exact_with_pictures(samples: list, tiny_vlm_dir: Path, temperature: float) -> None:
    """slime-train's forward (its logits over `--rollout-temperature`, as the engine's log-probs are) over each
    sample's tokens and pictures gives the log-probs the engine sampled with."""
    from slime.train.model import PolicyModel, pack
    from slime.utils.vision_model import load_hf_model

    model = PolicyModel(load_hf_model(tiny_vlm_dir, torch.float32).eval(), temperature)
    image_token = 151655  # <|image_pad|>
    assert len(samples) == 2
    for s in samples:
        images = s.multimodal_train_inputs or {}
        assert set(images) >= {"pixel_values", "image_grid_thw"}, "the sample lost its picture"
        grid = torch.as_tensor(images["image_grid_thw"])
        prompt = s.tokens[: len(s.tokens) - s.response_length]
        assert prompt.count(image_token) == int(grid.prod()) // 4 > 1  # expanded in the prompt (merge size 2)
        assert s.response_length > 0 and len(s.rollout_log_probs) == s.response_length
        mb = pack([torch.tensor(s.tokens)], [s.response_length], images=[images])
        with torch.no_grad():
            trained, _ = model.run(mb)
        sampled = torch.tensor(s.rollout_log_probs)
        mask = torch.tensor(s.loss_mask if s.loss_mask is not None else [1] * s.response_length, dtype=torch.bool)
        assert mask.any()
        assert torch.allclose(trained[mask], sampled[mask], atol=1e-4), float(
            (trained[mask] - sampled[mask]).abs().max()
        )


def test_slimes_geo3k_vlm_multi_turn_recipe_runs_unchanged_and_its_samples_are_token_exact(
    ray_cluster, engine_fork_server, tiny_vlm_dir, tmp_path
):
    config = RECIPE / "geo3k_vlm_multi_turn_config.yaml"
    # the recipe's package `examples` is importable where its generate runs, as slime's checkout puts it
    env = {"PYTHONPATH": f"{UPSTREAM}:{Path(__file__).parents[1]}"}
    samples = rollout(
        tiny_vlm_dir,
        tmp_path,
        engine_fork_server,
        "--rm-type",
        "math",
        "--rollout-temperature",
        "1",
        "--custom-generate-function-path",
        "examples.geo3k_vlm_multi_turn.rollout.generate",
        "--custom-config-path",
        str(config),
        env=env,
    )
    assert_token_exact_with_pictures(samples, tiny_vlm_dir, 1.0)


def test_slimes_geo3k_vlm_recipe_flags_give_token_exact_samples_with_their_pictures(
    ray_cluster, engine_fork_server, tiny_vlm_dir, tmp_path
):
    """geo3k_vlm (single turn) is flags on the default generate (`run_geo3k_qwen35.sh`'s rollout flags)."""
    samples = rollout(
        tiny_vlm_dir, tmp_path, engine_fork_server, "--rm-type", "deepscaler", "--rollout-temperature", "0.8"
    )
    assert_token_exact_with_pictures(samples, tiny_vlm_dir, 0.8)
