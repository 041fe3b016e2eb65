"""The engine's own decoder forward (slime.engine.decoder_lm) against transformers' classes, family by family.

The engine's log-probs must be the trainer's (which runs transformers' model): every served family is built
tiny and random with transformers, saved, and loaded both ways; the prefill's logits and every step of a
left-padded continuous batch (rows joining and leaving) must be equal, and the tensors a trainer pushes must
have the same names, shapes and dtypes. A checkpoint outside the checked set is left to transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.engine.decoder_lm import DecoderLM, load_decoder_lm, unsupported
from slime.engine.model_loading import load_model
from slime.engine.running_batch import RunningBatch
from slime.weights.receive import model_tensors

ROOT = Path(__file__).resolve().parents[1]


def _tiny(family: str, **overrides):
    import transformers

    common = dict(
        vocab_size=97,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=3,
    )
    cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }[family]
    torch.manual_seed(7)
    model = model_cls(cls(**{**common, **overrides}))
    with torch.no_grad():  # RMSNorm weights start at 1 and biases at 0: make every parameter count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


CASES = {
    "llama, tied, GQA": ("llama", dict(tie_word_embeddings=True)),
    "llama, biases, own head_dim, MHA": (
        "llama",
        dict(attention_bias=True, mlp_bias=True, head_dim=12, num_key_value_heads=6, tie_word_embeddings=False),
    ),
    "qwen2, q/k/v biases": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen3, q/k norms, untied": ("qwen3", dict(head_dim=16, tie_word_embeddings=False)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def checkpoint(request, tmp_path_factory) -> Path:
    family, overrides = CASES[request.param]
    out = tmp_path_factory.mktemp(family)
    # small shards: the loader must follow the index
    _tiny(family, **overrides).save_pretrained(str(out), max_shard_size="40KB")
    return out


def _both(path: Path, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    ours, why = load_decoder_lm(path, dtype)
    assert why is None and isinstance(ours, DecoderLM)
    theirs = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    return ours, theirs


def test_the_shards_were_many(checkpoint):
    assert (checkpoint / "model.safetensors.index.json").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_logits_equal_transformers(checkpoint, dtype):
    ours, theirs = _both(checkpoint, dtype)
    ids = torch.randint(0, 97, (1, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = ours(input_ids=ids, use_cache=True, logits_to_keep=4)
        b = theirs(input_ids=ids, use_cache=True, logits_to_keep=4)
        full_a, full_b = ours(input_ids=ids).logits, theirs(input_ids=ids).logits
    assert a.logits.dtype == b.logits.dtype == dtype
    assert torch.equal(a.logits, b.logits)
    assert torch.equal(full_a, full_b)
    assert full_a.shape == (1, 29, 97)
    for la, lb in zip(a.past_key_values.layers, b.past_key_values.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def _decode_trace(model, prompts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """A continuous batch as the decode thread runs it: each prompt prefilled alone and joining after the
    previous rows decoded a step, the second row leaving half way; the logits of every step."""
    batch, trace = RunningBatch(), []
    rows = []
    for k in range(steps):
        if k < len(prompts):
            req = SimpleNamespace(done=False, position_delta=0)
            out = model(input_ids=torch.tensor([prompts[k]]), use_cache=True, logits_to_keep=1)
            trace.append(out.logits[0, -1])
            batch.add(req, out.past_key_values, len(prompts[k]), int(out.logits[0, -1].argmax()))
            rows.append(req)
        if k == steps // 2 and len(rows) > 1:
            rows[1].done = True
            batch.drop_finished()
        logits = batch.forward(model)
        trace.append(logits)
        batch.pending = logits.argmax(-1)
    return trace


def test_a_left_padded_batch_decodes_as_transformers_does(checkpoint):
    ours, theirs = _both(checkpoint)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (5, 17, 9)]
    with torch.no_grad():
        a, b = _decode_trace(ours, prompts, 8), _decode_trace(theirs, prompts, 8)
    assert len(a) == len(b) == 11
    for step, (x, y) in enumerate(zip(a, b)):
        assert x.shape == y.shape, step
        torch.testing.assert_close(x, y, rtol=0, atol=2e-6, msg=f"step {step}")


@settings(max_examples=12)
@given(
    family=st.sampled_from(["llama", "qwen2", "qwen3"]),
    kv_heads=st.sampled_from([1, 2, 4]),
    groups=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([8, 12, 16]),
    tied=st.booleans(),
    lengths=st.lists(st.integers(1, 24), min_size=1, max_size=4),
    steps=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_any_shape_and_batch_decodes_as_transformers_does(
    family, kv_heads, groups, head_dim, tied, lengths, steps, seed
):
    """The same property over generated shapes (heads per key/value head, head sizes, tying) and batches
    (prompt lengths, how many steps before the next row joins)."""
    import tempfile

    heads = kv_heads * groups
    model = _tiny(
        family,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=heads * head_dim,
        tie_word_embeddings=tied,
    )
    with tempfile.TemporaryDirectory() as out:
        model.save_pretrained(out)
        ours, theirs = _both(Path(out))
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 97, (n,), generator=g).tolist() for n in lengths]
    with torch.no_grad():
        a, b = _decode_trace(ours, prompts, len(prompts) + steps), _decode_trace(theirs, prompts, len(prompts) + steps)
    assert torch.equal(a[0], b[0])  # a solo prefill: the same numbers
    for step, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x, y, rtol=0, atol=2e-6, msg=f"step {step}")


def test_a_trainer_pushes_the_same_tensors_to_either(checkpoint):
    ours, theirs = _both(checkpoint)
    a, b = model_tensors(ours), model_tensors(theirs)
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name].shape, a[name].dtype) == (b[name].shape, b[name].dtype), name
        assert torch.equal(a[name], b[name]), name
    config = json.loads((checkpoint / "config.json").read_text())
    if config.get("tie_word_embeddings"):  # one tensor under both names: a push to either moves both
        assert a["lm_head.weight"] is a["model.embed_tokens.weight"]
    assert ours.get_input_embeddings().weight.shape[0] == 97
    assert ours.config.eos_token_id == 3 and ours.config.max_position_embeddings == 256


def test_load_model_serves_the_checked_families_itself(checkpoint):
    assert isinstance(load_model(str(checkpoint), torch.float32), DecoderLM)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}, "rope_type 'llama3'"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_theta": 1e4}, "rope_type 'linear'"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding-window"),
        ({"model_type": "gpt2"}, "model_type 'gpt2'"),
        ({"auto_map": {"AutoModelForCausalLM": "x.Y"}}, "remote code"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ],
)
def test_a_checkpoint_outside_the_checked_set_is_named_and_left_to_transformers(change, reason):
    config = {"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    config = {k: v for k, v in config.items() if not (k == "rope_parameters" and "rope_scaling" in change)}
    assert reason in (unsupported({**config, **change}) or "")


def test_an_unsupported_checkpoint_loads_through_transformers(tmp_path):
    model = _tiny("qwen3", layer_types=["full_attention", "sliding_attention"], use_sliding_window=True)
    model.save_pretrained(str(tmp_path))
    ours, why = load_decoder_lm(tmp_path, torch.float32)
    assert ours is None and "sliding-window" in why
    served = load_model(str(tmp_path), torch.float32)
    assert type(served).__name__ == "Qwen3ForCausalLM"


def test_a_config_without_a_shape_field_is_left_to_transformers(tmp_path):
    _tiny("llama").save_pretrained(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours, why = load_decoder_lm(tmp_path, torch.float32)
    assert ours is None and "intermediate_size" in why


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_field_left_out_means_what_transformers_makes_of_it(family):
    """Every combination of optional fields left out: either the shapes and switches are transformers' own
    defaults, or the checkpoint is left to transformers."""
    import itertools

    import transformers

    from slime.engine.decoder_lm import model_config

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}
    required = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6)
    optional = dict(
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        rope_theta=5e5,
    )
    served = 0
    for n in range(len(optional) + 1):
        for keys in itertools.combinations(optional, n):
            fields = {**required, **{k: optional[k] for k in keys}}
            config = {"model_type": family, **fields}
            if unsupported(config):
                continue
            try:
                ours = model_config(config)
            except KeyError:
                continue
            served += 1
            hf = cls[family](**fields)
            hd = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
            attention_bias = getattr(hf, "attention_bias", None)
            assert (ours.num_key_value_heads, ours.head_dim, ours.rms_norm_eps) == (
                hf.num_key_value_heads,
                hd,
                hf.rms_norm_eps,
            ), keys
            assert ours.tie_word_embeddings == hf.tie_word_embeddings, keys
            assert ours.rope_theta == hf.rope_parameters["rope_theta"], keys
            if family == "qwen2":  # its modeling code biases q, k and v, never o, whatever `attention_bias` says
                assert (ours.qkv_bias, ours.o_bias) == (True, False), keys
            else:
                assert ours.qkv_bias == ours.o_bias == attention_bias, keys
            # (a config keeps any field it is given; only Llama's modeling code reads `mlp_bias`)
            assert ours.mlp_bias == (family == "llama" and bool(hf.mlp_bias)), keys
    assert served > 0


def test_weights_named_otherwise_are_left_to_transformers(tmp_path):
    from safetensors.torch import load_file, save_file

    _tiny("llama", tie_word_embeddings=True).save_pretrained(str(tmp_path))
    state = load_file(str(tmp_path / "model.safetensors"))
    state["model.extra.weight"] = torch.zeros(2)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ours, why = load_decoder_lm(tmp_path, torch.float32)
    assert ours is None and "model.extra.weight" in why


def test_the_engine_preload_imports_no_compiler_or_sharding_code(tmp_path):
    """The point of the module: the fork server's preload (tokenizers, serving modules, this model) leaves
    transformers' modeling integrations, torch._dynamo and torch.distributed.tensor unimported."""
    ckpt = tmp_path / "ckpt"
    from slime.testing.tiny_model import build_tiny_model

    build_tiny_model(ckpt)
    code = (
        "import sys, json\n"
        "from slime.engine.warm_start import preload\n"
        f"p = preload({str(ckpt)!r})\n"
        "print(json.dumps([type(p.model).__name__] + sorted(m for m in "
        "('torch._dynamo', 'torch.distributed.tensor', 'transformers.activations', 'transformers.modeling_utils', "
        "'sympy') if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, check=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == ["DecoderLM"]
