"""`generate`: a custom generate function that runs any agent against the gateway, per sample.

    --custom-generate-function-path slime.agent.rollout.generate --agent-entry my_agents.coder.run

The runtime's one `Gateway` (started on first use, in front of the runtime's `EngineClient`)
opens a session per sample; the `--agent-entry` function gets `base_url`, `api_key` (the session
id) and the sample, drives any OpenAI/Anthropic client, and returns the reward. The session's
root-to-leaf chains come back as Samples of the sample's group, each with that reward (None: the
reward model scores each). An agent that fails or runs out of time keeps the turns it made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import logging
import os
from typing import Any

from slime.agent.gateway import Gateway, GatewayConfig
from slime.rollout.runtime import RolloutRuntime, current
from slime.rollout.sglang_rollout import mark_failed, prompt_ids
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)
GATEWAY_KEY = "slime.agent.Gateway"


@dataclasses.dataclass(frozen=True)
class AgentRun:
    entry: str
    api: str = "openai"
    timeout: float = 1800.0

    @classmethod
    def from_args(cls, args: Any) -> AgentRun:
        if not args.agent_entry:
            raise ValueError("--custom-generate-function-path slime.agent.rollout.generate needs --agent-entry "
                             "package.module.function (the agent to run per sample)")
        return cls(entry=args.agent_entry, api=args.agent_api, timeout=float(args.agent_timeout))


def gateway_of(runtime: RolloutRuntime) -> Gateway:
    """The runtime's gateway, started on first use."""
    return runtime.shared(GATEWAY_KEY, lambda: Gateway(runtime.client, tokenizer=runtime.tokenizer,
                                                       config=GatewayConfig.from_args(runtime.args)).start())


_session_ids = itertools.count()


def session_id(sample: Sample) -> str:
    return sample.session_id or f"agent-{os.getpid()}-{sample.index}-{next(_session_ids)}"


async def run_entry(fn: Any, **kw: Any) -> Any:
    """An async entry point is awaited; a sync one runs in a thread so the gateway's loop stays free."""
    if inspect.iscoroutinefunction(fn):
        return await fn(**kw)
    return await asyncio.to_thread(fn, **kw)


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> list[Sample] | Sample:
    run = AgentRun.from_args(args)
    runtime = current(args)
    gateway = gateway_of(runtime)
    sid = sample.session_id = session_id(sample)
    gateway.open_session(sid, sampling_defaults=sampling_params)
    fn = load_function(run.entry, "--agent-entry")
    reward, error = None, None
    try:
        reward = await asyncio.wait_for(run_entry(fn, base_url=gateway.base_url(sid, run.api), api_key=sid,
                                                  sample=sample), run.timeout)
    except asyncio.TimeoutError:
        error = f"--agent-timeout: the agent ran longer than {run.timeout:g} s"
    except Exception as e:  # noqa: BLE001 - an agent's crash ends its run; its turns still train, the reason is kept
        error = f"{type(e).__name__}: {e}"
    samples = await gateway.finish_session(sid, base_sample=sample, reward=0.0 if reward is None else float(reward),
                                           extra_metadata={"agent_error": error} if error else None)
    if not samples:  # nothing to train: FAILED with its prompt, as a sample whose engine calls failed
        mark_failed(sample, "agent_session_empty", error or "the agent made no turn")
        sample.tokens, sample.response_length, sample.loss_mask, sample.rollout_log_probs = \
            prompt_ids(args, sample, runtime), 0, [], []
        return sample
    for s in samples:
        if reward is None:
            s.reward = None  # scored by --rm-type / --custom-rm-path, branch by branch
    return samples
