"""A rollout module written the way slime users write them (imports and signature of slime;
like most slime plugins it never sets `loss_mask`),
used to prove it runs unchanged through --rollout-function-path."""

import asyncio

from slime.utils.async_utils import run
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample


async def _one(args, sample: Sample, url: str, tok) -> Sample:
    ids = tok(sample.prompt, add_special_tokens=False)["input_ids"]
    out = await post(
        url,
        {
            "input_ids": ids,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": args.rollout_max_response_len, "temperature": 1.0},
        },
    )
    pairs = out["meta_info"]["output_token_logprobs"]
    sample.tokens = ids + [p[1] for p in pairs]
    sample.response_length = len(pairs)
    sample.rollout_log_probs = [p[0] for p in pairs]
    sample.response = out["text"]
    sample.status = {"length": Sample.Status.TRUNCATED, "stop": Sample.Status.COMPLETED}.get(
        out["meta_info"]["finish_reason"]["type"], Sample.Status.ABORTED
    )
    sample.reward = float(len(pairs) % 2)
    sample.metadata["custom"] = True
    return sample


async def _rollout(args, data_source):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    groups = data_source.get_samples(args.rollout_batch_size)
    return [list(await asyncio.gather(*(_one(args, s, url, tok) for s in g))) for g in groups]


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    assert load_function("slime.utils.types.Sample") is Sample
    if evaluation:
        raise NotImplementedError
    return run(_rollout(args, data_source))
