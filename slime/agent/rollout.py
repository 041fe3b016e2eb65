"""`generate`: a custom generate function that runs any agent against the gateway, per sample.

    --custom-generate-function-path slime.agent.rollout.generate --agent-entry my_agents.coder.run
    --custom-generate-function-path slime.agent.rollout.generate --agent-command "{python} agent.py"

The runtime's one `Gateway` (started on first use, stopped when the controller closes) opens a
session per sample. `--agent-entry`: a host function gets `base_url`, `api_key` (the session's key,
a secret minted for it: no other agent can write into its session) and the sample, and returns
the reward. `--agent-command`: a command in a sandbox session
(`CommandAgent`), rewarded by its grader. Each root-to-leaf chain is a Sample of the sample's group
with that reward (None: the reward model scores it); a failed agent's turns still train.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import logging
import os
from typing import Any

from slime.agent.sandboxes.command_agent import AgentOutcome, CommandAgent, CommandAgentConfig
from slime.agent.flags import AgentConfig, AgentRolloutConfig, check_agent_run
from slime.agent.gateway.server import Gateway, GatewayConfig
from slime.agent.sandboxes.sandbox_pool import pool_of
from slime.rollout.multimodal_prompt import shared_processor
from slime.rollout.runtime import RolloutRuntime, current
from slime.rollout.sglang_rollout import mark_failed, prompt_ids
from slime.utils.misc import load_function
from slime.utils.prompt_images import PromptImages
from slime.utils.types import Sample

logger = logging.getLogger(__name__)
GATEWAY_KEY = "slime.agent.Gateway"
COMMAND_AGENT_KEY = "slime.agent.CommandAgent"
CONFIG_KEY = "slime.agent.AgentRolloutConfig"


@dataclasses.dataclass(frozen=True)
class AgentRun:
    entry: str | None = None
    command: str | None = None
    api: str = "openai"
    timeout: float = 1800.0

    @classmethod
    def of(cls, config: AgentConfig) -> AgentRun:
        check_agent_run(config)
        return cls(
            entry=config.agent_entry,
            command=config.agent_command,
            api=config.agent_api,
            timeout=float(config.agent_timeout),
        )


def config_of(runtime: RolloutRuntime) -> AgentRolloutConfig:
    """The agent rollout's flags, read once per runtime from its namespace."""
    return runtime.shared(CONFIG_KEY, lambda: AgentRolloutConfig.from_args(runtime.args))


def gateway_of(runtime: RolloutRuntime) -> Gateway:
    """The runtime's gateway, started on first use and stopped when the runtime closes."""

    def start() -> Gateway:
        processor = shared_processor(runtime)  # a vision-language checkpoint's: images read
        images = PromptImages(processor) if getattr(processor, "image_processor", None) is not None else None
        gateway = Gateway(
            runtime.client, tokenizer=runtime.tokenizer, config=GatewayConfig.of(config_of(runtime)), images=images
        ).start()
        runtime.on_close(gateway.stop)
        return gateway

    return runtime.shared(GATEWAY_KEY, start)


def command_agent_of(runtime: RolloutRuntime) -> CommandAgent:
    """The runtime's `CommandAgent`, its sandbox (`--agent-sandbox-url`) reaching the gateway."""

    def build() -> CommandAgent:
        gateway = gateway_of(runtime)
        config = config_of(runtime).agent
        pool = pool_of(config, gateway_port=gateway.port, on_close=runtime.on_close)
        return CommandAgent(CommandAgentConfig.of(config), pool)

    return runtime.shared(COMMAND_AGENT_KEY, build)


_session_ids = itertools.count()


def session_id(sample: Sample) -> str:
    return sample.session_id or f"agent-{os.getpid()}-{sample.index}-{next(_session_ids)}"


async def run_entry(fn: Any, **kw: Any) -> Any:
    """An async entry point is awaited; a sync one runs in a thread so the gateway's loop stays free."""
    if inspect.iscoroutinefunction(fn):
        return await fn(**kw)
    return await asyncio.to_thread(fn, **kw)


async def entry_outcome(run: AgentRun, gateway: Gateway, sid: str, sample: Sample) -> AgentOutcome:
    fn = load_function(run.entry, "--agent-entry")
    try:
        reward = await asyncio.wait_for(
            run_entry(fn, base_url=gateway.base_url(sid, run.api), api_key=gateway.session_key(sid), sample=sample),
            run.timeout,
        )
    except asyncio.TimeoutError:
        return AgentOutcome(error=f"--agent-timeout: the agent ran longer than {run.timeout:g} s")
    except Exception as e:  # noqa: BLE001 - an agent's crash ends its run; its turns still train, the reason is kept
        return AgentOutcome(error=f"{type(e).__name__}: {e}")
    return AgentOutcome(reward=None if reward is None else float(reward))


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> list[Sample] | Sample:
    run = AgentRun.of(AgentConfig.from_args(args))  # (a plugin's args: read here, once per sample)
    runtime = current(args)
    gateway = gateway_of(runtime)
    sid = sample.session_id = session_id(sample)
    key = gateway.open_session(sid, sampling_defaults=sampling_params)
    if run.command:
        outcome = await command_agent_of(runtime).run(sample, session_key=key, base_path=gateway.session_path(sid))
    else:
        outcome = await entry_outcome(run, gateway, sid, sample)
    extra = {**outcome.metadata, **({"agent_error": outcome.error} if outcome.error else {})}
    samples = await gateway.finish_session(
        sid, base_sample=sample, reward=outcome.reward or 0.0, extra_metadata=extra or None
    )
    if not samples:  # nothing to train: FAILED with its prompt, as a sample whose engine calls failed
        mark_failed(sample, outcome.failure or "agent_session_empty", outcome.error or "the agent made no turn")
        sample.metadata.update(outcome.metadata)
        sample.tokens, sample.response_length, sample.loss_mask, sample.rollout_log_probs = (
            prompt_ids(args, sample, runtime),
            0,
            [],
            [],
        )
        return sample
    for s in samples:
        if outcome.reward is None:
            s.reward = None  # scored by --rm-type / --custom-rm-path, branch by branch
        if outcome.failure:
            mark_failed(s, outcome.failure, outcome.error or outcome.failure)
    return samples
