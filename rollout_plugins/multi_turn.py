"""Multi-turn tool rollouts with exact token accounting.

Use per sample with `--custom-generate-function-path rollout_plugins.multi_turn.generate`, or as
the whole rollout with `--rollout-function-path rollout_plugins.multi_turn.generate_rollout`.

Why it is built this way:
- The trajectory is only ever appended to: prompt ids, then exactly the ids the engine returned
  (loss mask 1, their log-probs), then the template's tokens for tool results (mask 0, log-prob
  0). History is never re-rendered or re-tokenised, so per-turn work does not grow with the
  conversation and the batch holds the tokens the model actually sampled.
- Every malformed, unknown, invalid, excess or cut-off tool call is answered to the model with a
  tool message saying what was wrong and recorded on the sample; nothing is dropped silently.
- Tool instances are created once per trajectory and released on every path (errors, abort,
  cancellation). Tool calls run concurrently and outside the engine concurrency slot.

Partial rollout (`--partial-rollout`) continues a trajectory at turn granularity. While a rollout
aborts, a tool call in flight finishes first (within `--abort-timeout`), its tool turn is appended,
and the loop stops before the next engine turn. An engine turn that was aborted keeps the tokens it
sampled (mask 1, their log-probs). The trajectory (tokens, mask, log-probs, conversation, record) is
stored on the sample, and the next rollout resumes it where it stopped: inside the aborted turn
(the engine continues from prompt + everything so far; the turn is parsed as a whole once it ends)
or at the next turn. Budgets count the whole trajectory. Tool instances do not outlive a rollout
(they are released when the sample leaves it, so none leaks if it never comes back): a resumed
trajectory creates them again with the same create_kwargs; per-instance tool state from before the
interruption is not carried over, the step rewards already earned are.

With --interaction-config-path (verl's interaction YAML), an assistant turn without tool calls is
answered by the sample's interaction (chosen by its `interaction_kwargs.name`) as a user turn:
the template's tokens for it are appended masked 0, its score is recorded as a turn score, and
the trajectory ends when it says terminate or at --max-user-turns (see `Trajectory.user_turn`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from slime.interactions.registry import InteractionSet, load_interaction_config
from slime.interactions.sample_interaction import SampleInteraction
from slime.rollout.runtime import RolloutRuntime, current
from slime.utils.trajectory import TrajectoryRecord, TurnSpan, UserTurn
from slime.tools.chat_format import (ChatDelta, ParseError, TemplateDriftError, ToolCall, check_append_only,
                                     conversation_drift, get_parser)
from slime.tools.registry import ToolSet, get_tool_set
from slime.tools.sample_tools import SampleTools, ToolCallLimits
from slime.utils.http_retry import HttpError
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

GENERATE_PATH = "rollout_plugins.multi_turn.generate"
RESUME_KEY = "multi_turn_resume"  # sample.metadata: what a partial trajectory needs to resume


def _arg(args: Any, name: str, default: Any = None) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


class MultiTurnContext:
    """What all trajectories of a process share: tools, parser, template deltas (built once)."""

    def __init__(self, args: Any, runtime: RolloutRuntime | None = None, tokenizer: Any = None):
        self.args = args
        self.runtime = runtime if runtime is not None or tokenizer is not None else current(args)
        self.tok = tokenizer if tokenizer is not None else self.runtime.tokenizer
        path = _arg(args, "tool_config_path")
        self.tools: ToolSet = get_tool_set(path) if path else ToolSet([], source="<no --tool-config-path>")
        if self.runtime is not None:
            self.tools.use_services(self.runtime.tool_services)  # e.g. the manager's sandbox URL
        self.parser = get_parser(_arg(args, "tool_call_parser", "hermes"))
        path = _arg(args, "interaction_config_path")
        self.interactions: InteractionSet | None = load_interaction_config(path) if path else None
        kw = _arg(args, "apply_chat_template_kwargs", {})
        self.delta = ChatDelta(self.tok, json.loads(kw) if isinstance(kw, str) else kw)
        if not self.delta.renders_tools and self.tools.names:
            logger.warning("the chat template ignores `tools`: tool schemas are described in the system message "
                           "(Hermes format) instead")
        self.check_mode = _arg(args, "chat_template_check", "error")
        self.template_report = None
        if self.check_mode != "off":
            self.template_report = check_append_only(self.delta, self.tools.schemas())
            if not self.template_report.ok:
                msg = (f"the chat template of {_arg(args, 'hf_checkpoint', 'the tokenizer')!r} is not append-only "
                       f"for tool turns: {self.template_report.detail}. Token accounting stays exact (the batch "
                       "holds the sampled ids), but re-rendering these conversations would give different tokens "
                       "than the model saw. Fix the template, or pass --chat-template-check warn to accept it.")
                if self.check_mode == "error":
                    raise TemplateDriftError(msg)
                logger.warning(msg)
        self._warned: set[str] = set()

    @classmethod
    def get(cls, args: Any, runtime: RolloutRuntime | None = None) -> "MultiTurnContext":
        """One per runtime (built on first use): tools, parser and template check are shared."""
        runtime = runtime or current(args)
        return runtime.shared("multi_turn.MultiTurnContext", lambda: cls(args, runtime))

    def warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg)


class Trajectory:
    """One sample's conversation: token buffers, tool instances and its `TrajectoryRecord`."""

    def __init__(self, ctx: MultiTurnContext, args: Any, sample: Sample, sampling_params: dict[str, Any]):
        self.ctx, self.args, self.sample = ctx, args, sample
        self.params = {k: v for k, v in sampling_params.items() if k != "max_new_tokens"}
        self.budget = int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len)
        self.max_ctx = _arg(args, "rollout_max_context_len")
        self.turn_cap = _arg(args, "max_tokens_per_turn")
        self.ids: list[int] = []
        self.prompt_len = 0
        self.mask: list[int] = []
        self.logps: list[float] = []
        self.messages: list[dict[str, Any]] | None = None
        self.status, self.reason = Sample.Status.PENDING, ""
        self.rollout_id = ctx.runtime.rollout_id if ctx.runtime is not None else None
        # --partial-rollout: an aborted trajectory resumes where it stopped
        self.resumed = bool(_arg(args, "partial_rollout", False)) and sample.is_partial \
            and RESUME_KEY in sample.metadata and TrajectoryRecord.of(sample) is not None
        if self.resumed:
            self.record = TrajectoryRecord.of(sample)
        else:  # a fresh start: drop what an earlier (aborted, recycled) attempt left
            TrajectoryRecord.clear(sample)
            sample.metadata.pop(RESUME_KEY, None)
            sample.clear_segments()
            sample.reward = None
            self.record = TrajectoryRecord()  # stored into sample.metadata by fill_sample
        self.tools = SampleTools(ctx.tools, self.record, ctx.delta, ToolCallLimits.from_args(args))
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
        """Pick the trajectory up where an abort left it (see the module docstring)."""
        s, state = self.sample, self.sample.metadata[RESUME_KEY]
        self.ids, self.prompt_len = list(s.tokens), s.prompt_length
        self.mask, self.logps = list(s.loss_mask or []), list(s.rollout_log_probs or [])
        self.messages = state.get("messages")

    def build_prompt(self, names: list[str]) -> None:
        s = self.sample
        msgs = s.metadata.get("messages")
        if msgs is None and isinstance(s.prompt, list):
            msgs = s.prompt
        schemas = self.schemas
        if msgs is None:
            text = str(s.prompt)
            specials = [t for t in getattr(self.ctx.tok, "all_special_tokens", []) if t and t in text]
            if specials:  # already rendered by the data source: use as is
                self.ctx.warn_once("rendered", "multi-turn: prompts are pre-rendered strings; tool schemas must "
                                   "already be in them (give message lists to have them rendered with tools)")
                self.ids = self.ctx.delta.encode(text)
                self.prompt_len = len(self.ids)
                return
            msgs = [{"role": "user", "content": text}]
        self.messages = [dict(m) for m in msgs]
        self.ids = self.ctx.delta.prompt_ids(self.messages, schemas)
        self.prompt_len = len(self.ids)

    async def create_tools(self, names: list[str]) -> None:
        await self.tools.create(names, self.sample.index)

    async def release_tools(self) -> None:
        await self.tools.release()

    # ---- the loop -----------------------------------------------------------------------------
    def _budgets(self) -> list[tuple[int, str]]:
        """(tokens left, name) of the response budget and the context budget."""
        limits = [(self.budget - (len(self.ids) - self.prompt_len), "response_budget")]
        if self.max_ctx:
            limits.append((self.max_ctx - len(self.ids), "context_budget"))
        return limits

    def _room(self) -> tuple[int, str]:
        """max_new_tokens of the next turn: the smallest of the budgets and the per-turn cap."""
        return min(self._budgets() + ([(int(self.turn_cap), "turn_cap")] if self.turn_cap else []))

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

    def _resume_point(self) -> tuple[int, list[int], bool]:
        """(turn to run next, the ids that turn sampled before an abort, whether it resumes inside a turn)."""
        if not self.resumed or not self.record.turn_spans:
            return 1, [], False
        last = self.record.turn_spans[-1]
        if last.role == "assistant" and self.sample.metadata[RESUME_KEY].get("aborted_turn"):
            return last.turn, self.ids[self.prompt_len + last.start:self.prompt_len + last.end], True
        return last.turn + 1, [], False

    def _end(self, status: Sample.Status, reason: str) -> None:
        self.status, self.reason = status, reason

    async def loop(self) -> None:
        max_turns = int(_arg(self.args, "max_turns", 8))
        client = (self.ctx.runtime or current(self.args)).client
        if self.max_ctx and self.prompt_len >= self.max_ctx:
            return self._end(Sample.Status.TRUNCATED, "prompt_fills_context")
        first, carried, inside = self._resume_point()
        gate = self.ctx.runtime.client.gate if self.ctx.runtime is not None else None
        for turn in range(first, max_turns + 1):
            room, limit = self._room()
            if room <= 0:
                return self._end(Sample.Status.TRUNCATED, f"{limit}_exhausted")
            if gate is not None and gate.closed:  # the rollout is aborting: stop at this turn boundary
                self.aborted_turn = inside
                return self._end(Sample.Status.ABORTED, "rollout_abort")
            out = await client.generate(self.ids, {**self.params, "max_new_tokens": room})
            t0 = time.perf_counter()
            self.record.turns = turn
            start = len(self.ids) - self.prompt_len
            self._append(out.token_ids, out.log_probs, turn, "assistant")
            self.sample.record_segment(start, start + len(out.token_ids), out.weight_version, self.rollout_id)
            model_ids, carried, inside = carried + list(out.token_ids), [], False
            if out.finish_type == "abort":
                self.aborted_turn = True
                return self._end(Sample.Status.ABORTED, "engine_abort")
            text_ids = model_ids[:-1] if model_ids and model_ids[-1] == self.ctx.delta.stop_id else model_ids
            cut = out.finish_type == "length"
            text = self.ctx.tok.decode(text_ids, skip_special_tokens=False)
            parsed = self.ctx.parser.parse(text, cut_off=cut)
            if self.messages is not None:
                self.messages.append(self.ctx.delta.assistant_message(
                    parsed.content, [(c.name, c.arguments) for c in parsed.calls], text))
            if cut and limit != "turn_cap":
                self.tools.record_unanswered(parsed.items, turn, "the response budget ran out")
                return self._end(Sample.Status.TRUNCATED, f"{limit}_exhausted")
            if not parsed.items:
                if cut:
                    return self._end(Sample.Status.TRUNCATED, "turn_cap")
                if self.interaction is None:
                    return self._end(Sample.Status.COMPLETED, "no_tool_call")
                if not await self.user_turn(model_ids, turn, turn == max_turns):
                    return
                continue
            if turn == max_turns:
                self.tools.record_unanswered(parsed.items, turn, "--max-turns was reached")
                return self._end(Sample.Status.TRUNCATED, "max_turns")
            prep = time.perf_counter() - t0
            t1 = time.perf_counter()
            tool_msgs = await self.run_calls(parsed.items, turn)
            self.record.non_generation_time += time.perf_counter() - t1
            t2 = time.perf_counter()
            if not self.add_tool_turn(tool_msgs, model_ids, turn):
                return self._end(Sample.Status.TRUNCATED, "budget_exhausted_in_tool_response")
            self.record.turn_overhead_s.append(prep + time.perf_counter() - t2)
        return self._end(Sample.Status.TRUNCATED, "max_turns")

    def add_tool_turn(self, tool_msgs: list[dict[str, Any]], model_ids: list[int], turn: int) -> bool:
        """Append the template's tokens for the tool results (mask 0); False when they do not fit.

        A tool response that does not fit the remaining budget is not appended in part: masked
        tokens at the very end would cost compute and teach nothing.
        """
        delta = self.ctx.delta.tool_delta_ids(tool_msgs, model_ids)
        if len(delta) > min(self._budgets())[0]:
            self.record.dropped_tool_tokens = len(delta)
            return False
        self._append(delta, None, turn, "tool")
        if self.messages is not None:
            self.messages.extend(tool_msgs)
        return True

    # ---- the interaction (verl's simulated user) ------------------------------------------------
    def select_interaction(self) -> None:
        """The sample's interaction, by its interaction_kwargs' name (with --interaction-config-path)."""
        if self.ctx.interactions is None:
            return
        self.interaction = SampleInteraction.choose(self.ctx.interactions, self.sample.metadata.get(
            "interaction_kwargs"), self.sample.index, self.messages is not None)
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

    async def user_turn(self, model_ids: list[int], turn: int, last_turn: bool) -> bool:
        """After an assistant turn without tool calls: the interaction answers as the user (tokens
        masked 0, log-probs 0). False, with the trajectory ended, when it terminates or a cap is hit.

        As in verl, --max-user-turns / --max-turns are checked before the interaction is asked. On
        terminate the reply is recorded but not appended: the trajectory ends on the model's turn.
        A reply that does not fit the remaining budget is not appended in part (as tool results).
        """
        limit = _arg(self.args, "max_user_turns")
        if limit is not None and len(self.record.user_turns) >= int(limit):
            self._end(Sample.Status.COMPLETED, "max_user_turns")
            return False
        if last_turn:
            self._end(Sample.Status.COMPLETED, "max_turns")
            return False
        t0 = time.perf_counter()
        reply = await self.interaction.respond(self.messages)
        self.record.non_generation_time += time.perf_counter() - t0
        message = {"role": "user", "content": reply.content}
        delta = [] if reply.terminate else self.ctx.delta.user_delta_ids(message, model_ids)
        appended = not reply.terminate and len(delta) <= min(self._budgets())[0]
        self.record.user_turns.append(UserTurn(turn=turn, content=reply.content, score=reply.score,
                                               terminate=reply.terminate, metrics=reply.metrics, appended=appended))
        if reply.terminate:
            self._end(Sample.Status.COMPLETED, "interaction_terminated")
            return False
        if not appended:
            self._end(Sample.Status.TRUNCATED, "budget_exhausted_in_user_turn")
            return False
        self._append(delta, None, turn, "user")
        self.messages.append(message)
        return True

    # ---- tool calls ---------------------------------------------------------------------------
    async def run_calls(self, items: list[ToolCall | ParseError], turn: int) -> list[dict[str, Any]]:
        """One tool message per call or parse error, in the model's order; valid calls run concurrently."""
        return await self.tools.run_calls(items, turn)

    # ---- finish -------------------------------------------------------------------------------
    async def final_rewards(self) -> None:
        await self.tools.final_rewards()

    def fill_sample(self) -> Sample:
        s = self.sample
        s.tokens = self.ids
        s.response_length = len(self.ids) - self.prompt_len
        s.response = self.ctx.tok.decode(self.ids[self.prompt_len:], skip_special_tokens=False)
        s.loss_mask, s.rollout_log_probs = self.mask, self.logps
        s.status = self.status if self.status != Sample.Status.PENDING else Sample.Status.FAILED
        self.record.finish_reason = self.reason
        self.record.store(s)
        s.metadata.pop(RESUME_KEY, None)
        if s.status == Sample.Status.ABORTED and self.reason in ("engine_abort", "rollout_abort") \
                and _arg(self.args, "partial_rollout", False):
            # a clean stop (not a cancellation mid tool call): resumable by a later rollout
            s.metadata[RESUME_KEY] = {"messages": self.messages, "aborted_turn": self.aborted_turn}
        return s

    def check_drift(self) -> None:
        spans = self.record.turn_spans
        complete = (spans and spans[-1].role == "assistant" and self.ids[-1] == self.ctx.delta.stop_id
                    and self.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED))
        if self.ctx.check_mode == "off" or self.messages is None or not complete:
            self.record.template_drift = None  # not checked: no complete final turn to compare
            return
        rep = conversation_drift(self.ctx.delta, self.messages, self.schemas, self.ids, self.prompt_len)
        self.record.template_drift = not rep.ok
        if not rep.ok:
            self.record.template_drift_detail = rep.detail

    async def run(self) -> Sample:
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
            await self.loop()
            await self.final_rewards()
            self.check_drift()
        except asyncio.CancelledError:
            self._end(Sample.Status.ABORTED, "cancelled")
            raise
        except HttpError as e:
            self.record.error = str(e)
            self._end(Sample.Status.FAILED, "engine_error")
        except Exception as e:  # noqa: BLE001 - one bad sample must not take the batch down
            logger.exception("multi-turn sample %s failed", self.sample.index)
            self.record.error = f"{type(e).__name__}: {e}"
            self._end(Sample.Status.FAILED, "exception")
        finally:
            release = asyncio.ensure_future(asyncio.gather(self.release_tools(), self.finalize_interaction()))
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                pass  # the release task keeps running to completion on its own
            self.fill_sample()
        return self.sample


async def add_tool_reward(args: Any, sample: Sample) -> None:
    """--tool-reward-mode add: reward = outcome reward (RM) + step rewards + final tool rewards."""
    if _arg(args, "tool_reward_mode", "none") != "add" or sample.status in (Sample.Status.ABORTED,
                                                                            Sample.Status.FAILED):
        return
    if getattr(args, "group_rm", False):
        MultiTurnContext.get(args).warn_once("group_rm", "--tool-reward-mode add is ignored with --group-rm; "
                                             "tool rewards are in metadata['tool_reward_total']")
        return
    from slime.rollout.rm_hub import async_rm

    if not (_arg(args, "custom_rm_path") or _arg(args, "rm_type")):
        MultiTurnContext.get(args).warn_once("no_rm", "--tool-reward-mode add without --rm-type/--custom-rm-path: "
                                             "the outcome reward is 0 and the reward is the tool reward")
        outcome: Any = 0.0
    else:
        outcome = await async_rm(args, sample)
    record = TrajectoryRecord.of(sample)
    extra = record.tool_reward_total
    record.outcome_reward = outcome
    record.store(sample)
    if isinstance(outcome, dict):
        key = _arg(args, "reward_key", "score")
        sample.reward = {**outcome, key: float(outcome[key]) + extra}
    else:
        sample.reward = float(outcome) + extra


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """slime's per-sample generate contract: one multi-turn trajectory with tools (resumed when it is
    an aborted partial trajectory and --partial-rollout is on)."""
    ctx = MultiTurnContext.get(args)
    sample = await Trajectory(ctx, args, sample, sampling_params).run()
    await add_tool_reward(args, sample)
    return sample


generate.supports_partial_rollout = True  # resumes at turn granularity (module docstring)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False):
    """slime's rollout contract: the default rollout with `generate` above as the per-sample step."""
    from slime.rollout import sglang_rollout

    if args.custom_generate_function_path not in (None, GENERATE_PATH):
        raise ValueError(f"--rollout-function-path rollout_plugins.multi_turn.generate_rollout sets its own "
                         f"generate function; remove --custom-generate-function-path "
                         f"{args.custom_generate_function_path!r}")
    args.custom_generate_function_path = GENERATE_PATH
    MultiTurnContext.get(args)  # fail fast on a bad tool config or template before any request
    return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation)
