"""One sample's trajectory: its token buffers (appended to, never re-rendered), set-up, run and finish.

`run` is the whole life of a sample: choose its tools, build or resume the prompt, create the tool
instances and start the interaction, run the turns (`turn_loop`), then tool rewards and the drift
check; tools and interaction are released on every path and the sample is filled from the buffers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from rollout_plugins.multi_turn.budgets import EndReason, TokenBudgets
from rollout_plugins.multi_turn.context import MultiTurnContext
from slime.interactions.sample_interaction import SampleInteraction
from slime.rollout.current_rollout import current_rollout_id
from slime.rollout.engine_answer import EngineOutput
from slime.tools.chat_format import ParseError, ToolCall, conversation_drift
from slime.tools.trajectory_tools import ToolCallLimits, TrajectoryTools
from slime.rollout.multimodal_prompt import sample_images
from slime.utils.http_retry import HttpError
from slime.utils.prompt_images import PreparedImage, collapse, train_inputs
from slime.utils.trajectory import TrajectoryRecord, TurnSpan
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

RESUME_KEY = "multi_turn_resume"  # sample.metadata: what a partial trajectory needs to resume


class Trajectory:
    """One sample's conversation: token buffers, tool instances and its `TrajectoryRecord`."""

    def __init__(self, ctx: MultiTurnContext, args: Any, sample: Sample, sampling_params: dict[str, Any]):
        self.ctx, self.args, self.sample = ctx, args, sample
        self.params = {k: v for k, v in sampling_params.items() if k != "max_new_tokens"}
        self.budgets = TokenBudgets.from_args(args, sampling_params)
        self.ids: list[int] = []
        self.prompt_len = 0
        self.mask: list[int] = []
        self.logps: list[float] = []
        self.messages: list[dict[str, Any]] | None = None
        self.status, self.reason = Sample.Status.PENDING, ""
        self.rollout_id = current_rollout_id()
        # --partial-rollout: an aborted trajectory resumes where it stopped
        self.resumed = (
            bool(args.partial_rollout)
            and sample.is_partial
            and RESUME_KEY in sample.metadata
            and TrajectoryRecord.of(sample) is not None
        )
        if self.resumed:
            self.record = TrajectoryRecord.of(sample)
        else:  # a fresh start: drop what an earlier (aborted, recycled) attempt left
            TrajectoryRecord.clear(sample)
            sample.metadata.pop(RESUME_KEY, None)
            sample.clear_segments()
            sample.reward = None
            self.record = TrajectoryRecord()  # stored into sample.metadata by fill_sample
        self.tools = TrajectoryTools(
            ctx.tools, self.record, ctx.delta, ToolCallLimits.from_args(args), reads_images=ctx.images is not None
        )
        self.images: list[PreparedImage] = []  # every image of `ids`, in placeholder order (image_data)
        self.aborted_turn = False  # the trajectory stopped inside an engine turn (resumed inside it)
        self.interaction: SampleInteraction | None = None  # the sample's simulated user, if any

    # ---- set-up -------------------------------------------------------------------------------
    def active_tools(self) -> list[str]:
        """The sample's tools (`--tool-key`: slime's schema list and/or verl's tools_kwargs)."""
        md = self.sample.metadata
        return self.tools.select(md.get("tools"), md.get("tools_kwargs"))

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tool schemas the sample's prompt shows."""
        return self.tools.schemas

    @property
    def instances(self) -> dict[str, str]:
        """Tool name -> instance id, for every tool created."""
        return self.tools.instances

    def resume(self) -> None:
        """Pick the trajectory up where an abort left it (see the package docstring)."""
        s, state = self.sample, self.sample.metadata[RESUME_KEY]
        self.ids, self.prompt_len = list(s.tokens), s.prompt_length
        self.mask, self.logps = list(s.loss_mask or []), list(s.rollout_log_probs or [])
        self.messages = state.get("messages")
        self.images = list(state.get("images") or [])

    def resume_point(self) -> tuple[int, list[int], bool]:
        """(turn to run next, the ids that turn sampled before an abort, whether it resumes inside a turn)."""
        if not self.resumed or not self.record.turn_spans:
            return 1, [], False
        last = self.record.turn_spans[-1]
        if last.role == "assistant" and self.sample.metadata[RESUME_KEY].get("aborted_turn"):
            return last.turn, self.ids[self.prompt_len + last.start : self.prompt_len + last.end], True
        return last.turn + 1, [], False

    def build_prompt(self, names: list[str]) -> None:
        s = self.sample
        msgs = s.metadata.get("messages")
        if msgs is None and isinstance(s.prompt, list):
            msgs = s.prompt
        if msgs is None:
            text = str(s.prompt)
            specials = [t for t in getattr(self.ctx.tok, "all_special_tokens", []) if t and t in text]
            if specials:  # already rendered by the data source: use as is
                self.ctx.warn_once(
                    "rendered",
                    "multi-turn: prompts are pre-rendered strings; tool schemas must "
                    "already be in them (give message lists to have them rendered with tools)",
                )
                self.ids = self.with_prompt_images(self.ctx.delta.encode(text))
                self.prompt_len = len(self.ids)
                return
            msgs = [{"role": "user", "content": text}]
        self.messages = [dict(m) for m in msgs]
        self.ids = self.with_prompt_images(self.ctx.delta.prompt_ids(self.messages, self.schemas))
        self.prompt_len = len(self.ids)

    def with_prompt_images(self, ids: list[int]) -> list[int]:
        """The prompt's ids with the sample's images (`--multimodal-keys`) expanded, as the default generate
        does; the images kept for `image_data` and the trainer."""
        pictures = sample_images(self.sample)
        if not pictures:
            return ids
        if self.ctx.images is None:
            raise ValueError(
                f"sample {self.sample.index} has {len(pictures)} image(s) but --hf-checkpoint has no "
                "image processor (a vision-language checkpoint ships preprocessor_config.json)"
            )
        self.images = [self.ctx.images.prepare(p) for p in pictures]
        return self.ctx.images.expand(ids, self.images)

    @property
    def image_data(self) -> list[str] | None:
        """The conversation's images as SGLang's `image_data` (None: a text-only conversation)."""
        return [image.data_uri for image in self.images] or None

    async def create_tools(self, names: list[str]) -> None:
        await self.tools.create(names, self.sample.index)

    async def release_tools(self) -> None:
        await self.tools.release()

    def select_interaction(self) -> None:
        """The sample's interaction, by its interaction_kwargs' name (with --interaction-config-path)."""
        if self.ctx.interactions is None:
            return
        self.interaction = SampleInteraction.choose(
            self.ctx.interactions,
            self.sample.metadata.get("interaction_kwargs"),
            self.sample.index,
            self.messages is not None,
        )
        self.record.interaction = self.interaction.name

    async def start_interaction(self) -> None:
        if self.interaction is not None:
            await self.interaction.start()

    async def finalize_interaction(self) -> None:
        if self.interaction is None:
            return
        error = await self.interaction.finalize()
        if error:
            self.record.error = self.record.error or error

    # ---- the token buffers ----------------------------------------------------------------------
    def room(self) -> tuple[int, str]:
        """max_new_tokens of the next turn and the budget that sets it."""
        return self.budgets.room(len(self.ids), self.prompt_len)

    def fits(self, n: int) -> bool:
        """Whether n more (masked) tokens fit every budget."""
        return self.budgets.fits(n, len(self.ids), self.prompt_len)

    def _append(self, ids: list[int], logps: list[float] | None, turn: int, role: str) -> None:
        start = len(self.ids) - self.prompt_len
        self.ids += ids
        self.mask += [1 if logps is not None else 0] * len(ids)
        self.logps += logps if logps is not None else [0.0] * len(ids)
        spans = self.record.turn_spans
        if spans and spans[-1].turn == turn and spans[-1].role == role and spans[-1].end == start:
            spans[-1].end = start + len(ids)  # the rest of a turn that was aborted and resumed
        else:
            spans.append(TurnSpan(turn=turn, role=role, start=start, end=start + len(ids)))

    def add_engine_turn(self, out: EngineOutput, turn: int) -> None:
        """Append what the engine sampled (mask 1, its log-probs) as one segment of the sample."""
        self.record.turns = turn
        start = len(self.ids) - self.prompt_len
        self._append(out.token_ids, out.log_probs, turn, "assistant")
        self.sample.record_segment(start, start + len(out.token_ids), out.weight_version, self.rollout_id)

    def add_tool_turn(self, tool_msgs: list[dict[str, Any]], model_ids: list[int], turn: int) -> bool:
        """Append the template's tokens for the tool results (mask 0); False when they do not fit.

        A tool response that does not fit the remaining budget is not appended in part: masked
        tokens at the very end would cost compute and teach nothing.
        """
        delta = self.ctx.delta.tool_delta_ids(tool_msgs, model_ids)
        new = [
            self.ctx.images.prepare(part["image"])
            for m in tool_msgs
            if isinstance(m["content"], list)
            for part in m["content"]
            if part.get("type") == "image"
        ]
        if new:  # a tool's images: one placeholder each in the delta, expanded to their token counts
            delta = self.ctx.images.expand(delta, new)
        if not self.fits(len(delta)):
            self.record.dropped_tool_tokens = len(delta)
            return False
        self.images += new
        self._append(delta, None, turn, "tool")
        if self.messages is not None:
            self.messages.extend(tool_msgs)
        return True

    def add_user_turn(self, message: dict[str, Any], delta: list[int], turn: int) -> None:
        """Append the template's tokens for the interaction's reply (mask 0)."""
        self._append(delta, None, turn, "user")
        self.messages.append(message)

    async def run_calls(self, items: list[ToolCall | ParseError], turn: int) -> list[dict[str, Any]]:
        """One tool message per call or parse error, in the model's order; valid calls run concurrently."""
        return await self.tools.run_calls(items, turn)

    # ---- finish -------------------------------------------------------------------------------
    def end(self, status: Sample.Status, reason: EndReason) -> None:
        self.status, self.reason = status, reason

    async def final_rewards(self) -> None:
        await self.tools.final_rewards()

    def fill_sample(self) -> Sample:
        s = self.sample
        s.tokens = self.ids
        s.response_length = len(self.ids) - self.prompt_len
        s.response = self.ctx.tok.decode(self.ids[self.prompt_len :], skip_special_tokens=False)
        s.loss_mask, s.rollout_log_probs = self.mask, self.logps
        if self.images:  # the prompt's and the tools' images, in token order: what the trainer's forward needs
            s.multimodal_inputs = {**(s.multimodal_inputs or {}), "images": [i.data_uri for i in self.images]}
            s.multimodal_train_inputs = train_inputs(self.images)
        s.status = self.status if self.status != Sample.Status.PENDING else Sample.Status.FAILED
        self.record.finish_reason = self.reason
        self.record.store(s)
        s.metadata.pop(RESUME_KEY, None)
        if (
            s.status == Sample.Status.ABORTED
            and self.reason in ("engine_abort", "rollout_abort")
            and self.args.partial_rollout
        ):
            # a clean stop (not a cancellation mid tool call): resumable by a later rollout
            s.metadata[RESUME_KEY] = {
                "messages": self.messages,
                "aborted_turn": self.aborted_turn,
                "images": self.images,
            }
        return s

    def check_drift(self) -> None:
        spans = self.record.turn_spans
        complete = (
            spans
            and spans[-1].role == "assistant"
            and self.ids[-1] == self.ctx.delta.stop_id
            and self.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
        )
        if self.ctx.check_mode == "off" or self.messages is None or not complete:
            self.record.template_drift = None  # not checked: no complete final turn to compare
            return
        ids, prompt_len = self.ids, self.prompt_len
        if self.images:  # the template renders one placeholder per image: compare in that form
            pad = self.ctx.images.image_token_id
            ids, prompt_len = collapse(ids, pad), len(collapse(ids[:prompt_len], pad))
        rep = conversation_drift(self.ctx.delta, self.messages, self.schemas, ids, prompt_len)
        self.record.template_drift = not rep.ok
        if not rep.ok:
            self.record.template_drift_detail = rep.detail

    async def run(self, turns: Callable[["Trajectory"], Awaitable[None]]) -> Sample:
        """Set up, `turns` (the turn loop, `turn_loop.run_turns`: passed in, so the loop may name this class
        and this class need not import the loop), rewards and checks; the sample, whatever happened."""
        try:
            names = self.active_tools()
            if self.resumed:
                self.resume()
                self.sample.metadata["continuations"] = int(self.sample.metadata.get("continuations", 0)) + 1
            else:
                self.build_prompt(names)
            self.select_interaction()
            await self.create_tools(names)
            await self.start_interaction()
            await turns(self)
            await self.final_rewards()
            self.check_drift()
        except asyncio.CancelledError:
            self.end(Sample.Status.ABORTED, "cancelled")
            raise
        except HttpError as e:
            self.record.error = str(e)
            self.end(Sample.Status.FAILED, "engine_error")
        except Exception as e:  # noqa: BLE001 - one bad sample must not take the batch down
            logger.exception("multi-turn sample %s failed", self.sample.index)
            self.record.error = f"{type(e).__name__}: {e}"
            self.end(Sample.Status.FAILED, "exception")
        finally:
            release = asyncio.ensure_future(asyncio.gather(self.release_tools(), self.finalize_interaction()))
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                pass  # the release task keeps running to completion on its own
            self.fill_sample()
        return self.sample
