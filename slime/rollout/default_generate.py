"""The default per-sample generate: one engine call, token-in/token-out.

`tokens` = prompt ids + exactly the ids the engine returned, with their log-probs and a loss mask of
ones, appended as one segment (`Sample.append_segment`). A sample with images (`--multimodal-keys`) is
expanded by the checkpoint's processor (`multimodal_prompt`): its image tokens are prompt tokens, and the
images go to the engine as `image_data`. With `--partial-rollout` an ABORTED sample
with a partial response is continued (`partial_rollout`). The engine client is the process's bound
runtime's (`slime.rollout.runtime.current`); slime's path for it is `slime.rollout.sglang_rollout.generate`.
"""

from __future__ import annotations

from typing import Any

from slime.rollout import partial_rollout as partial
from slime.rollout.current_rollout import current_rollout_id
from slime.rollout.multimodal_prompt import multimodal_prompt, sample_images
from slime.rollout.runtime import RolloutRuntime, current
from slime.utils.images import encode_png_data_uri
from slime.utils.types import Sample
from slime.utils.plugin_args import completed


def prompt_ids(args: Any, sample: Sample, runtime: RolloutRuntime | None = None) -> list[int]:
    """The prompt's token ids: pre-tokenised by the data source, else tokenised once here."""
    if sample.tokens and sample.response_length == 0:
        return list(sample.tokens)
    prompt = sample.prompt
    if not isinstance(prompt, (str, list)):
        raise TypeError(
            f"sample {sample.index}: the prompt is {type(prompt).__name__}, not text or messages; the "
            "default generate cannot tokenise it (set --custom-generate-function-path to a function "
            "that reads it)"
        )
    tok = (runtime or current(args)).tokenizer
    if isinstance(prompt, list):
        prompt = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tok(prompt, add_special_tokens=False)["input_ids"]


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Default per-sample generation: one engine call, token-in/token-out, the answer appended to the
    sample as one segment (`Sample.append_segment`). With `--partial-rollout` an ABORTED sample with a
    partial response is continued (see `partial_rollout`). The engine client is the process's
    runtime's (`current(args)`)."""
    args = completed(args)
    runtime = current(args)
    continued = bool(args.partial_rollout) and sample.is_partial
    image_data = None
    # `params` is the caller's dict until a value changes (then a copy): the engine client's body copies it
    if continued:  # --partial-rollout: prompt + partial response, the remaining budget
        ids, params = partial.continuation_input(sample, sampling_params)
        images = sample_images(sample) if sample.multimodal_inputs else None
        if images:
            image_data = [encode_png_data_uri(img) for img in images]
    elif sample.multimodal_inputs and sample_images(sample):  # --multimodal-keys: the processor's expanded ids
        (ids, image_data), params = multimodal_prompt(sample, runtime), sampling_params
    elif sample.tokens and sample.response_length == 0:  # pre-tokenised (`prompt_ids`, without its copy:
        ids, params = sample.tokens, sampling_params  # the body and `start_response` copy the ids)
    else:
        ids, params = prompt_ids(args, sample, runtime), sampling_params
    if args.rollout_max_context_len is not None:
        room = args.rollout_max_context_len - len(ids)
        if room <= 0 and not continued:
            sample.start_response(ids)
            sample.status = Sample.Status.TRUNCATED
            sample.metadata["finish_reason"] = "prompt_fills_context"
            return sample
        params = {**params, "max_new_tokens": min(params["max_new_tokens"], room)}
    if params["max_new_tokens"] <= 0:  # a continued sample whose budget is spent
        sample.status = Sample.Status.TRUNCATED
        sample.metadata["finish_reason"] = "length"
        return sample
    if runtime.client.gate.closed:  # the rollout is aborting: no new request
        if not continued:
            sample.start_response(ids)
        sample.status = Sample.Status.ABORTED
        return sample
    out = await runtime.client.generate(ids, params, image_data=image_data)
    if not continued:
        sample.start_response(ids)
    return sample.append_segment(
        out.token_ids,
        out.log_probs,
        text=out.text or "",
        finish_reason=out.finish_type,
        weight_version=out.weight_version,
        rollout_id=current_rollout_id(),
        continued=continued,
    )


generate.supports_partial_rollout = True  # continues ABORTED samples from their tokens
