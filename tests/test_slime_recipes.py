"""slime's example recipes with their plugin files unchanged (`examples/search-r1`, `examples/retool`,
`examples/multi_agent`, copied from THUDM/slime@624b824a), run by our default rollout function through
the real sglang-router in front of a scripted engine, with the flags of their run scripts; and every
upstream run script (`tests/data/slime_run_scripts`, same commit) parses whole with our parser.

The scripted engine answers what each recipe's loop waits for (a search, a code call, a rewrite, a
judgment), so every token, mask, log-prob and reward below is known exactly."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slime.cli.args import parse_args
from slime.rollout.data_source import DataSource
from slime.rollout.sglang_rollout import generate_rollout
from slime.testing.replying_stack import replying_stack
from slime.testing.runtime import bind_runtime
from slime.testing.scripted_engine import default_log_prob
from slime.utils.async_utils import run
from slime.utils.types import Sample

ROOT = Path(__file__).resolve().parents[1]
RUN_SCRIPTS = ROOT / "tests/data/slime_run_scripts"

SEARCH_PROMPT = (
    "<|im_start|>user\nsearch task: capital of france? Answer as <answer> x </answer>.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
SEARCH_1 = "<think>look it up</think>\n<search>capital of france</search>"
SEARCH_2 = "<think>found it</think>\n<answer>Paris</answer>"
RETOOL_1 = "<code>print(6 * 7)</code>"
RETOOL_2 = "So Answer: \\boxed{42}"
SOLVER = "</think>I think \\boxed{2}"
REWRITER = "</think>rewritten: \\boxed{2}"
SELECTOR = "</think>Judgment: 1"


def reply(prompt: str) -> str:
    """What the scripted engine says, from the text it is shown."""
    if "Candidate Solutions" in prompt:
        return SELECTOR
    if "Solution Rewriting" in prompt:
        return REWRITER
    if "multi agent task" in prompt:
        return SOLVER
    if "<information>" in prompt:
        return SEARCH_2
    if "search task" in prompt:
        return SEARCH_1
    if "<interpreter>" in prompt:
        return RETOOL_2
    if "retool task" in prompt:
        return RETOOL_1
    return "plain"


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    with replying_stack(str(tiny_model_dir), reply) as stack:
        yield stack


def run_recipe(tmp_path, cluster, model, rows, *flags) -> list[list[Sample]]:
    router, engine, retriever, tok = cluster
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--sglang-router-ip",
            router.host,
            "--sglang-router-port",
            str(router.port),
            "--rollout-batch-size",
            str(len(rows)),
            *flags,
        ]
    )
    runtime = bind_runtime(args, tokenizer=tok)
    try:
        return generate_rollout(args, 0, DataSource.from_args(args, tok)).samples
    finally:
        run(runtime.client.close())  # its HTTP session lives on the shared loop


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def sampled(n: int) -> list[float]:
    return [default_log_prob(i) for i in range(n)]


# ---------------------------------------------------------------- examples/search-r1


@pytest.fixture
def search_r1(monkeypatch, cluster):
    """The recipe's module as its run script loads it (its directory on PYTHONPATH), pointed at the
    test's retriever the way its README says: by editing SEARCH_R1_CONFIGS."""
    monkeypatch.syspath_prepend(str(ROOT / "examples/search-r1"))
    import generate_with_search

    monkeypatch.setitem(generate_with_search.SEARCH_R1_CONFIGS["local"], "search_url", cluster[2].url)
    return generate_with_search


def test_search_r1_recipe_searches_answers_and_scores_exact_match(tmp_path, cluster, tiny_model_dir, search_r1):
    router, engine, retriever, tok = cluster
    first = len(retriever.requests)
    [[s]] = run_recipe(
        tmp_path,
        cluster,
        tiny_model_dir,
        [{"prompt": SEARCH_PROMPT, "reward_model": {"ground_truth": {"target": ["Paris"]}}}],
        "--label-key",
        "reward_model",
        "--custom-generate-function-path",
        "generate_with_search.generate",
        "--custom-rm-path",
        "generate_with_search.reward_func",
        "--rollout-max-response-len",
        "64",
    )
    info = (
        "\n\n<information>"
        + search_r1._passages2string(
            [
                {"document": {"contents": "Paris\nParis is the capital of France."}},
                {"document": {"contents": "Berlin\nBerlin is in Germany."}},
            ]
        ).strip()
        + "</information>\n\n"
    )
    one, obs, two = ids(tok, SEARCH_1), ids(tok, info), ids(tok, SEARCH_2)
    assert retriever.requests[first:] == [{"queries": ["capital of france"], "topk": 3, "return_scores": False}]
    assert s.tokens == ids(tok, SEARCH_PROMPT) + one + obs + two
    assert s.loss_mask == [1] * len(one) + [0] * len(obs) + [1] * len(two)
    assert s.rollout_log_probs == sampled(len(one)) + [0.0] * len(obs) + sampled(len(two))
    assert s.response == SEARCH_1 + info + SEARCH_2 and s.response_length == len(one + obs + two)
    assert s.status == Sample.Status.COMPLETED and s.reward == 1.0  # valid format, exact match


# ---------------------------------------------------------------- examples/retool


def test_retool_recipe_runs_the_code_tool_and_grades_with_dapo(tmp_path, cluster, tiny_model_dir, monkeypatch):
    router, engine, retriever, tok = cluster
    monkeypatch.syspath_prepend(str(ROOT / "examples/retool"))
    import generate_with_retool

    # flags of retool_qwen3_4b_rl.sh that the recipe reads: its context budget and the reward key
    [[s]] = run_recipe(
        tmp_path,
        cluster,
        tiny_model_dir,
        [{"prompt": "retool task: 6*7?", "label": "42"}],
        "--label-key",
        "label",
        "--custom-generate-function-path",
        "generate_with_retool.generate",
        "--custom-rm-path",
        "generate_with_retool.reward_func",
        "--reward-key",
        "score",
        "--context-parallel-size",
        "2",
        "--max-tokens-per-gpu",
        "1024",
        "--rollout-max-response-len",
        "64",
    )
    prompt = generate_with_retool.format_conversation_with_tools(
        prompt="retool task: 6*7?", tools=generate_with_retool.tool_registry.get_tool_specs()
    )
    obs = "\n\n<interpreter>\nOutput:\n42\n</interpreter>\n\n"  # the sandbox ran print(6 * 7)
    one, obs_ids, two = ids(tok, RETOOL_1), ids(tok, obs), ids(tok, RETOOL_2)
    assert s.tokens == ids(tok, prompt) + one + obs_ids + two
    assert s.loss_mask == [1] * len(one) + [0] * len(obs_ids) + [1] * len(two)
    assert s.rollout_log_probs == sampled(len(one)) + [0.0] * len(obs_ids) + sampled(len(two))
    assert s.response == RETOOL_1 + obs + RETOOL_2 and s.tool_call_count == 1
    assert s.status == Sample.Status.COMPLETED
    assert s.reward == {"score": 1.0, "acc": True, "pred": "42"}


# ---------------------------------------------------------------- examples/multi_agent


def test_multi_agent_recipe_returns_solver_rewriter_and_selector_samples(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    # flags of run-qwen3-30B-A3B-multi-agent.sh that the recipe reads
    [group] = run_recipe(
        tmp_path,
        cluster,
        tiny_model_dir,
        [{"prompt": "multi agent task: 1+1?", "label": "2"}],
        "--label-key",
        "label",
        "--custom-generate-function-path",
        "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents",
        "--rm-type",
        "deepscaler",
        "--rollout-max-context-len",
        "4096",
        "--rollout-max-response-len",
        "64",
    )
    roles = {SOLVER: "solver", REWRITER: "rewriter", SELECTOR: "selector"}
    by_role: dict[str, list[Sample]] = {}
    for s in group:
        by_role.setdefault(roles[s.response], []).append(s)
    assert {r: len(v) for r, v in by_role.items()} == {"solver": 5, "rewriter": 5, "selector": 1}
    for s in group:
        response = ids(tok, s.response)
        assert s.tokens == ids(tok, s.prompt) + response
        assert s.loss_mask == [1] * len(response) and s.rollout_log_probs == sampled(len(response))
        assert s.status == Sample.Status.COMPLETED and s.rollout_id == group[0].rollout_id
    # every answer is right and the selector picked a right one: all rewards x correct_reward_weight
    assert sorted(s.reward for s in group) == [1.2] * 11
    assert by_role["selector"][0].prompt.startswith("You will be given a challenging math problem followed by 5")


# ---------------------------------------------------------------- every upstream run script parses


# what a run script may really run: text tools only; every other command (pip, hf, git, ssh, mkdir,
# tee, python3, ...) is a no-op, so reading a script's argv installs, downloads and writes nothing
SAFE_TOOLS = ("awk", "basename", "cat", "date", "dirname", "grep", "head", "hostname", "sed", "seq", "tail", "tr", "wc")


def script_argv(tree: Path, name: str) -> tuple[list[str], set[str]]:
    """The argv the run script `tree/name` hands to train.py. It runs in bash with PATH holding only
    SAFE_TOOLS and any other command a no-op; `ray job submit ... -- python3 X` prints what follows X,
    NUL-separated. `/root/slime/` (the scripts' checkout) is `tree`, and a file a script sources
    must be there (its MODEL_ARGS would be missing otherwise). Also: the commands it did not run."""
    bin_dir = tree / ".safe-bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in SAFE_TOOLS:
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    fake = r"""
command_not_found_handle() { printf '%s\n' "$1" >> .skipped-commands; }
ray() { if [ "$1" = job ]; then while [ "$1" != -- ]; do shift; done; shift 2; printf '%s\0' "$@" >&3; fi; }
source() { [ -f "$1" ] || { echo "sources a missing file: $1" >&2; exit 3; }; builtin source "$@"; }
export WANDB_KEY=KEY
"""
    script = tree / name
    text = script.read_text().replace("/root/slime/", f"{tree}/").replace("set -ex", "")
    copy = script.with_name(f".argv_of_{script.name}")  # next to it: scripts find their files relative to it
    copy.write_text(fake + text)
    out = subprocess.run(
        [shutil.which("bash"), "-c", f'source "{copy}" 3>&1 >/dev/null 2>&1'],
        cwd=tree,
        env={"PATH": str(bin_dir), "HOME": str(tree)},
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()
    argv = [a for a in out.split("\0") if a]
    while argv and not argv[0].startswith("--"):  # the entry point (train.py, train_async.py)
        argv.pop(0)
    skipped = tree / ".skipped-commands"
    return argv, set(skipped.read_text().split()) if skipped.exists() else set()


def local_paths(argv: list[str], model: Path, data: Path) -> list[str]:
    """The scripts' model and data paths (on a GPU box) replaced by the test's."""
    out, flag = [], None
    for a in argv:
        if a.startswith("--"):
            flag = a
        elif a.startswith(("/", "./")) and not os.path.exists(a.split("@[")[0]):
            path = a.split("@[")[0]
            if flag == "--hf-checkpoint":
                a = str(model)
            elif path.endswith((".jsonl", ".parquet")):
                a = str(data) + a[len(path) :]
        out.append(a)
    return out


SCRIPTS = sorted(p.relative_to(RUN_SCRIPTS).as_posix() for p in RUN_SCRIPTS.glob("examples/*/*.sh"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_upstream_run_script_parses_whole(name, tmp_path, monkeypatch):
    model, data = tmp_path / "hf", tmp_path / "d.jsonl"
    model.mkdir()
    data.write_text('{"prompt": "q", "label": "1", "input": "q", "messages": [{"role": "user", "content": "q"}]}\n')
    tree = tmp_path / "slime"
    shutil.copytree(RUN_SCRIPTS, tree)
    argv, skipped = script_argv(tree, name)
    assert "--hf-checkpoint" in argv and len(argv) > 30
    assert "ray" not in skipped and ("pip" in skipped) == name.startswith("examples/geo3k_vlm/")  # it upgrades
    # the eval-config file names GPU-box datasets: point them at the test's file
    cfg = tree / "examples/eval_multi_task/multi_task.yaml"
    if str(cfg) in argv:
        local = tmp_path / "multi_task.yaml"
        text = cfg.read_text()
        for path in (
            "/root/aime-2024/aime-2024.jsonl",
            "/root/gpqa/gpqa_eval.jsonl",
            "/root/ifbench/IFBench_eval.jsonl",
        ):
            text = text.replace(path, str(data))
        local.write_text(text.replace("rm_type: ifbench", "rm_type: math"))  # ifbench needs a package
        argv[argv.index(str(cfg))] = str(local)
    monkeypatch.chdir(tree)  # --custom-config-path examples/... is relative to slime's checkout
    args = parse_args(["--rollout-backend", "hf", *local_paths(argv, model, data)])
    assert args.hf_checkpoint == str(model)


# ---------------------------------------------------------------- examples/train_infer_mismatch_helper


def test_mis_recipe_reweights_and_rejects_tokens_in_the_policy_loss(tmp_path, monkeypatch):
    """mis.py's `compute_mis_weights_with_cp` (unchanged) as --custom-tis-function-path with its
    mis.yaml: token-level truncation at 2, rejection outside [0.5, 2] and batch normalisation change
    the loss exactly as slime's loss applies them (rejected tokens drop out of the sum, the
    denominators stay the rollouts' mask totals)."""
    import torch

    from slime.train.flags import LossConfig
    from slime.train.loss import LossHooks, check_loss_args, policy_loss, sample_reducer

    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    monkeypatch.chdir(ROOT)  # the run script's --custom-config-path is relative to the checkout
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--prompt-data",
            str(data),
            "--use-tis",
            "--custom-config-path",
            "examples/train_infer_mismatch_helper/mis.yaml",
            "--custom-tis-function-path",
            "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp",
        ]
    )
    config = LossConfig.from_args(args)
    check_loss_args(config)
    lengths, masks, denoms = [3, 2], [torch.ones(3), torch.ones(2)], torch.tensor([3.0, 2.0])
    old = torch.zeros(5)
    rollout = -torch.log(torch.tensor([1.0, 3.0, 0.25, 1.0, 1.5]))  # train/rollout ratios 1, 3, 0.25 | 1, 1.5
    out = policy_loss(
        config,
        log_probs=old.clone(),
        entropy=torch.zeros(5),
        old_log_probs=old,
        advantages=torch.ones(5),
        rollout_log_probs=rollout,
        ref_log_probs=None,
        response_lengths=lengths,
        loss_masks=masks,
        reduce=sample_reducer(lengths, masks, denoms),
        denominators=denoms,
        total_lengths=[7, 6],
        hooks=LossHooks.of(config, args),
    )
    # weights truncated at 2: (1, 2, .25 | 1, 1.5), mean 1.15 -> divided by it; ratios 3 and .25 rejected
    expected = -(1 / 3 + (1 + 1.5) / 2) / 1.15
    assert out.metrics["pg_loss"].item() == pytest.approx(expected, rel=1e-6)
    assert out.metrics["mis_batch_norm_factor"].item() == pytest.approx(1.15 * 2, rel=1e-6)  # one per sample
    vanilla = parse_args(["--rollout-backend", "hf", "--prompt-data", str(data), "--use-tis"])
    plain = policy_loss(
        LossConfig.from_args(vanilla),
        log_probs=old.clone(),
        entropy=torch.zeros(5),
        old_log_probs=old,
        advantages=torch.ones(5),
        rollout_log_probs=rollout,
        ref_log_probs=None,
        response_lengths=lengths,
        loss_masks=masks,
        reduce=sample_reducer(lengths, masks, denoms),
    )
    assert plain.metrics["pg_loss"].item() == pytest.approx(-((1 + 2 + 0.25) / 3 + 2.5 / 2), rel=1e-6)
    assert plain.metrics["tis_clipfrac"].item() == pytest.approx(1 / 3, rel=1e-6)  # ratio 3 clipped to 2


def test_the_tis_function_resolved_once_is_the_one_the_loss_uses(tmp_path, monkeypatch):
    """The worker resolves --custom-tis-function-path once (`LossHooks.of(config, args)`) and passes it to
    every micro-batch's `policy_loss`, which then loads nothing: the mis recipe's exact loss, twice, with
    plugin loading made to fail after the one resolution; a call not given it is refused, naming the flag,
    rather than computing the vanilla TIS in its place."""
    import torch

    from slime.train import loss
    from slime.train.flags import LossConfig
    from slime.utils.misc import PluginLoadError

    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    monkeypatch.chdir(ROOT)
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--prompt-data",
            str(data),
            "--use-tis",
            "--custom-config-path",
            "examples/train_infer_mismatch_helper/mis.yaml",
            "--custom-tis-function-path",
            "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp",
        ]
    )
    config = LossConfig.from_args(args)
    hooks = loss.LossHooks.of(config, args)
    assert hooks.custom_tis.__name__ == "compute_mis_weights_with_cp" and hooks.args is args

    def no_loading(path, flag=None):
        raise PluginLoadError(f"{flag} {path!r} loaded again")

    monkeypatch.setattr(loss, "load_function", no_loading)
    lengths, masks, denoms = [3, 2], [torch.ones(3), torch.ones(2)], torch.tensor([3.0, 2.0])
    old = torch.zeros(5)
    rollout = -torch.log(torch.tensor([1.0, 3.0, 0.25, 1.0, 1.5]))
    for _ in range(2):  # two micro-batches
        out = loss.policy_loss(
            config,
            log_probs=old.clone(),
            entropy=torch.zeros(5),
            old_log_probs=old,
            advantages=torch.ones(5),
            rollout_log_probs=rollout,
            ref_log_probs=None,
            response_lengths=lengths,
            loss_masks=masks,
            reduce=loss.sample_reducer(lengths, masks, denoms),
            denominators=denoms,
            total_lengths=[7, 6],
            hooks=hooks,
        )
        assert out.metrics["pg_loss"].item() == pytest.approx(-(1 / 3 + (1 + 1.5) / 2) / 1.15, rel=1e-6)
    with pytest.raises(loss.LossConfigError, match="--custom-tis-function-path .* not resolved"):
        loss.policy_loss(
            config,
            log_probs=old.clone(),
            entropy=torch.zeros(5),
            old_log_probs=old,
            advantages=torch.ones(5),
            rollout_log_probs=rollout,
            ref_log_probs=None,
            response_lengths=lengths,
            loss_masks=masks,
            reduce=loss.sample_reducer(lengths, masks, denoms),
            denominators=denoms,
        )


def test_mismatch_metrics_need_the_function_that_computes_them(tmp_path):
    from slime.train.flags import LossConfig
    from slime.train.loss import LossConfigError, check_loss_args
    from slime.utils.misc import PluginLoadError

    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    args = parse_args(["--rollout-backend", "hf", "--prompt-data", str(data), "--get-mismatch-metrics"])
    with pytest.raises(LossConfigError, match="--get-mismatch-metrics needs --custom-tis-function-path"):
        check_loss_args(LossConfig.from_args(args))
    args.custom_tis_function_path = "examples.train_infer_mismatch_helper.mis.no_such_function"
    with pytest.raises(PluginLoadError, match="--custom-tis-function-path"):
        check_loss_args(LossConfig.from_args(args))


# ---------------------------------------------------------------- what plugins size their pools by


def test_rollout_num_gpus_is_a_number_as_in_slime(tmp_path):
    """Plugins compute pools from it (strands-sglang's `get_client_from_slime_args`:
    concurrency x rollout_num_gpus // rollout_num_gpus_per_engine); slime always has a number."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    (tmp_path / "hf").mkdir()
    base = ["--prompt-data", str(data), "--hf-checkpoint", str(tmp_path / "hf")]
    args = parse_args(["--rollout-backend", "hf", "--rollout-num-engines", "3", *base])
    assert (args.rollout_num_gpus, args.rollout_num_engines, args.rollout_num_gpus_per_engine) == (3, 3, 1)
    assert (
        args.sglang_server_concurrency * args.rollout_num_gpus // args.rollout_num_gpus_per_engine
        == args.sglang_server_concurrency * 3
    )
    # slime: colocated engines use the actors' GPUs
    args = parse_args(
        [
            "--rollout-backend",
            "sglang",
            "--colocate",
            "--actor-num-nodes",
            "2",
            "--actor-num-gpus-per-node",
            "4",
            "--rollout-num-gpus-per-engine",
            "2",
            *base,
        ]
    )
    assert (args.rollout_num_gpus, args.rollout_num_engines) == (8, 4)
    assert parse_args(["--rollout-backend", "sglang", "--rollout-num-gpus", "2", *base]).rollout_num_gpus == 2


# ---------------------------------------------------------------- a recipe's log-probs with holes


def test_log_probs_left_none_at_untrained_tokens_train_as_slimes_zero(tmp_path):
    """slime's strands_sglang recipe copies strands-sglang's record, which holds None at tool-output
    tokens (mask 0): the batch holds 0.0 there (slime's value for tokens appended untrainable) and
    becomes a tensor; a None at a trained token is an error naming the sample and position."""
    import torch

    from slime.rollout.controller import BatchError, convert_samples_to_train_data
    from slime.train_batch.rank_batches import to_cpu_tensor

    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "q"}\n')
    args = parse_args(["--rollout-backend", "hf", "--prompt-data", str(data)])
    s = Sample(
        prompt="p",
        tokens=[1, 2, 3, 4, 5],
        response_length=4,
        loss_mask=[1, 0, 0, 1],
        rollout_log_probs=[-0.1, None, None, -0.2],
        reward=1.0,
        group_index=0,
        index=0,
    )
    batch = convert_samples_to_train_data(args, [s])
    assert batch["rollout_log_probs"] == [[-0.1, 0.0, 0.0, -0.2]] and s.rollout_log_probs[1] is None
    assert to_cpu_tensor(batch["rollout_log_probs"][0], torch.float32).tolist() == pytest.approx([-0.1, 0.0, 0.0, -0.2])
    s.loss_mask = [1, 1, 0, 1]
    with pytest.raises(
        BatchError,
        match=r"sample index=0 group=0: rollout_log_probs\[1\] is None at a token "
        r"the loss trains",
    ):
        convert_samples_to_train_data(args, [s])
