"""Token ids and loss masks for whole conversations (SFT data, `--loss-mask-type`).

`MultiTurnLossMaskGenerator(tokenizer, tokenizer_type)` has slime's constructor and methods; the mask is 1
on the tokens an assistant turn contributes (after its generation header) and 0 elsewhere, and a message
with `step_loss_mask != 1` contributes zeros. The modes reproduce slime's token layout:

- `qwen`: each message rendered on its own; the default system prompt the template inserts in front of a
  lone message (Qwen2.5, SmolLM2, other ChatML templates) is cut from every message after the first.
  A tokenizer with DeepSeek-distill's `<｜Assistant｜>` token switches to `distill_qwen`.
- `qwen3`: each message (consecutive tool results as one group) rendered as the delta after/before a fixed
  anchor user turn, which is what Qwen3's context-dependent template needs.
- `qwen3_5`: the conversation rendered once; assistant spans found in the text and mapped to tokens through
  character offsets (needs a fast tokenizer).
- `distill_qwen`: first message as prompt (with generation prompt), last message's content as response.

Only the tokenizer's `apply_chat_template`, `__call__`, `decode` and `get_added_vocab` are used.
"""

from __future__ import annotations

from typing import Any

LOSS_MASK_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")

_ANCHOR = {"role": "user", "content": "FOR CALCULATING LOSS MASK ONLY"}
_PROBE = {"role": "user", "content": "FOR TESTING ONLY"}
_DISTILL_ASSISTANT_TOKEN = "<｜Assistant｜>"
_QWEN35_HEADER = "<|im_start|>assistant\n"
_QWEN35_THINK = "<think>\n"
_QWEN35_END = "<|im_end|>"


def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
    """Per mask: tokens from the first 1 to the end (0 when nothing is trainable)."""
    lengths = []
    for mask in loss_masks:
        first = next((i for i, m in enumerate(mask) if m == 1), None)
        lengths.append(0 if first is None else len(mask) - first)
    return lengths


def _ids(rendered: Any) -> list[int]:
    """Token ids from `apply_chat_template(tokenize=True)` whatever container this transformers returns."""
    if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
        rendered = rendered["input_ids"]
    return [int(t) for t in rendered]


def _trainable(message: dict) -> bool:
    return message.get("step_loss_mask", 1) == 1


class MultiTurnLossMaskGenerator:
    def __init__(self, tokenizer: Any, tokenizer_type: str = "qwen"):
        if tokenizer_type not in LOSS_MASK_TYPES:
            raise ValueError(
                f"--loss-mask-type {tokenizer_type!r} is not supported; choose one of {', '.join(LOSS_MASK_TYPES)}"
            )
        self.tokenizer = tokenizer
        self.tokenizer_type = tokenizer_type
        self.system_message_length = 0
        self.gen_token_length = 0
        if tokenizer_type in ("qwen", "qwen3"):
            self.system_message_length, self.gen_token_length = self.get_system_message_length()

    # ------------------------------------------------------------ template probes

    def _render(self, messages: list[dict], tools: list[dict] | None = None, **kwargs) -> list[int]:
        try:
            return _ids(
                self.tokenizer.apply_chat_template(messages, tokenize=True, tools=tools, return_dict=False, **kwargs)
            )
        except Exception as e:  # noqa: BLE001 - template errors are re-raised with the mode that caused them
            roles = [m.get("role") for m in messages]
            raise ValueError(
                f"loss mask ({self.tokenizer_type}): the chat template cannot render messages with "
                f"roles {roles}: {type(e).__name__}: {e} (try another --loss-mask-type)"
            ) from e

    def get_system_message_length(self) -> tuple[int, int]:
        """(tokens the template puts before a lone first message, tokens of the generation prompt).

        Rendering one and two identical user turns: the second adds exactly one user turn, so whatever
        precedes the first turn is `len(one) - (len(two) - len(one))`."""
        one = self._render([_PROBE])
        two = self._render([_PROBE, _PROBE])
        with_prompt = self._render([_PROBE, _PROBE], add_generation_prompt=True)
        user_turn = len(two) - len(one)
        return len(one) - user_turn, len(with_prompt) - len(two)

    def find_all_sublist_indices(self, main_list: list, sublist: list) -> list[int]:
        n = len(sublist)
        if n == 0:
            return []
        first = sublist[0]
        return [i for i in range(len(main_list) - n + 1) if main_list[i] == first and main_list[i : i + n] == sublist]

    def get_response_lengths(self, loss_masks: list[list[int]]) -> list[int]:
        return get_response_lengths(loss_masks)

    def _message_mask(self, message: dict, n_tokens: int) -> list[int]:
        if message["role"] != "assistant" or not _trainable(message):
            return [0] * n_tokens
        header = min(self.gen_token_length, n_tokens)
        return [0] * header + [1] * (n_tokens - header)

    # ------------------------------------------------------------ modes

    def gen_multi_turn_loss_mask_qwen(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        token_ids: list[int] = []
        loss_mask: list[int] = []
        for i, message in enumerate(messages):
            ids = self._render([message], tools=tools if i == 0 else None)
            if i > 0 and message["role"] != "system":
                ids = ids[self.system_message_length :]
            token_ids += ids
            loss_mask += self._message_mask(message, len(ids))
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_qwen3(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        anchor = self._render([_ANCHOR])
        # length of the anchor turn when it follows other messages (no default system prompt in it)
        anchor_turn = len(self._render([_ANCHOR, _ANCHOR])) - len(anchor)
        token_ids: list[int] = []
        loss_mask: list[int] = []
        i = 0
        while i < len(messages):
            end = i + 1
            if messages[i]["role"] == "tool":  # Qwen templates wrap consecutive tool results in one user turn
                while end < len(messages) and messages[end]["role"] == "tool":
                    end += 1
            group = messages[i:end]
            if i == 0:
                rendered = self._render(group + [_ANCHOR], tools=tools)
                ids = rendered[: len(rendered) - anchor_turn]
            else:
                ids = self._render([_ANCHOR] + group)[len(anchor) :]
            token_ids += ids
            loss_mask += self._message_mask(messages[i], len(ids))
            i = end
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_qwen3_5(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, tools=tools, return_dict=False)
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        token_ids = list(encoded["input_ids"])
        offsets = encoded.get("offset_mapping")
        if offsets is None:
            raise ValueError(
                "Qwen3.5 loss mask generation requires a fast tokenizer with `return_offsets_mapping` support."
            )
        if token_ids != self._render(messages, tools=tools):
            raise ValueError(
                "Qwen3.5 rendered text tokenization does not match `apply_chat_template(..., tokenize=True)` output."
            )

        # Character spans [start, end) that are trainable: assistant content (after an opening <think>\n)
        # through <|im_end|> and the newline after it.
        spans: list[tuple[int, int]] = []
        cursor = 0
        for message in messages:
            if message["role"] != "assistant":
                continue
            header = text.find(_QWEN35_HEADER, cursor)
            if header < 0:
                raise ValueError("Failed to locate assistant message in rendered Qwen3.5 chat template output.")
            start = header + len(_QWEN35_HEADER)
            end = text.find(_QWEN35_END, start)
            if end < 0:
                raise ValueError("Failed to locate <|im_end|> for assistant message in rendered text.")
            end += len(_QWEN35_END)
            if text[end : end + 1] == "\n":
                end += 1
            cursor = end
            if _trainable(message):
                if text.startswith(_QWEN35_THINK, start):
                    start += len(_QWEN35_THINK)
                spans.append((start, end))

        loss_mask = []
        for tok_start, tok_end in offsets:
            overlaps = tok_end > tok_start and any(tok_start < e and s < tok_end for s, e in spans)
            loss_mask.append(1 if overlaps else 0)
        return token_ids, loss_mask

    def gen_multi_turn_loss_mask_distill_qwen(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        prompt = self.tokenizer.apply_chat_template(
            messages[:1], tokenize=False, add_generation_prompt=True, tools=tools
        )
        prompt_ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        response_ids = list(self.tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"])
        token_ids = prompt_ids + response_ids
        if not _trainable(messages[-1]):
            return token_ids, [0] * len(token_ids)
        return token_ids, [0] * len(prompt_ids) + [1] * len(response_ids)

    # ------------------------------------------------------------ entry points

    def get_loss_mask(self, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
        """(token_ids, loss_mask) of equal length for a whole conversation."""
        mode = self.tokenizer_type
        if mode == "qwen":
            added = self.tokenizer.get_added_vocab() if hasattr(self.tokenizer, "get_added_vocab") else {}
            if _DISTILL_ASSISTANT_TOKEN in added:
                mode = "distill_qwen"
        return getattr(self, f"gen_multi_turn_loss_mask_{mode}")(messages, tools)

    def get_loss_mask_with_multimodal_alignment(
        self, messages: list[dict], input_ids: list[int], tools: list[dict] | None = None
    ) -> tuple[list[int], list[int]]:
        """Mask for processor-built `input_ids` (image tokens expand the prompt): text-only mask, left-padded
        with zeros to the processor's length."""
        text_messages = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                parts = [
                    item.get("text", "") if isinstance(item, dict) else item
                    for item in content
                    if isinstance(item, str) or (isinstance(item, dict) and item.get("type") == "text")
                ]
                message = {"role": message["role"], "content": " ".join(parts)}
            text_messages.append(message)
        _, text_mask = self.get_loss_mask(text_messages, tools=tools)
        pad = len(input_ids) - len(text_mask)
        if pad < 0:
            raise ValueError(
                f"input_ids (length={len(input_ids)}) is shorter than text loss_mask "
                f"(length={len(text_mask)}): processor and tokenizer tokenize differently"
            )
        return input_ids, [0] * pad + text_mask

    def get_text_from_loss_mask(self, token_ids: list[int], loss_masks: list[int]) -> list[str]:
        """Decoded text of each run of trainable tokens (for checking a mask by eye)."""
        texts, run = [], []
        for token, mask in zip(token_ids, loss_masks):
            if mask == 1:
                run.append(token)
            elif run:
                texts.append(self.tokenizer.decode(run))
                run = []
        if run:
            texts.append(self.tokenizer.decode(run))
        return texts
