"""What all trajectories of a process share, built once per runtime: tools, parser, template deltas.

The chat template is checked here, at start-up, to be append-only for tool turns (`--chat-template-check`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from slime.interactions.registry import InteractionSet, load_interaction_config
from slime.rollout.multimodal_prompt import shared_processor
from slime.rollout.runtime import RolloutRuntime, current
from slime.tools.chat_format import ChatDelta, TemplateDriftError, check_append_only, get_parser
from slime.tools.registry import ToolSet, load_tool_config
from slime.utils.prompt_images import PromptImages
from slime.utils.plugin_args import completed

logger = logging.getLogger(__name__)


class MultiTurnContext:
    """What all trajectories of a process share: tools, parser, template deltas (built once)."""

    def __init__(self, args: Any, runtime: RolloutRuntime | None = None, tokenizer: Any = None):
        args = completed(args)
        self.args = args
        self.runtime = runtime if runtime is not None or tokenizer is not None else current(args)
        self.tok = tokenizer if tokenizer is not None else self.runtime.tokenizer
        path = args.tool_config_path
        self.tools: ToolSet = ToolSet([], source="<no --tool-config-path>")
        if path:  # the runtime's shared set (it closes them); a context made by hand without one loads its own
            self.tools = self.runtime.tool_sets.get(path) if self.runtime is not None else load_tool_config(path)
        if self.runtime is not None:
            self.tools.use_services(self.runtime.tool_services)  # e.g. the manager's sandbox URL
        self.parser = get_parser(args.tool_call_parser)
        path = args.interaction_config_path
        self.interactions: InteractionSet | None = load_interaction_config(path) if path else None
        for adapter in self.interactions.by_name.values() if self.interactions else ():
            adapter.timeout = args.interaction_timeout
        kw = args.apply_chat_template_kwargs or {}
        self.delta = ChatDelta(self.tok, json.loads(kw) if isinstance(kw, str) else kw)
        if not self.delta.renders_tools and self.tools.names:
            logger.warning(
                "the chat template ignores `tools`: tool schemas are described in the system message "
                "(Hermes format) instead"
            )
        # a vision-language checkpoint's image side: prompt and tool images are expanded and sent as image_data
        processor = shared_processor(self.runtime) if self.runtime is not None else None
        self.images = PromptImages(processor) if getattr(processor, "image_processor", None) is not None else None
        self.check_mode = args.chat_template_check
        self.template_report = None
        if self.check_mode != "off":
            self.check_template()
        self._warned: set[str] = set()

    def check_template(self) -> None:
        """Refuse (or, with --chat-template-check warn, warn about) a template that is not append-only."""
        self.template_report = check_append_only(self.delta, self.tools.schemas())
        if self.template_report.ok:
            return
        msg = (
            f"the chat template of {self.args.hf_checkpoint or 'the tokenizer'!r} is not "
            f"append-only for tool turns: {self.template_report.detail}. Token accounting stays exact (the "
            "batch holds the sampled ids), but re-rendering these conversations would give different tokens "
            "than the model saw. Fix the template, or pass --chat-template-check warn to accept it."
        )
        if self.check_mode == "error":
            raise TemplateDriftError(msg)
        logger.warning(msg)

    @classmethod
    def get(cls, args: Any, runtime: RolloutRuntime | None = None) -> "MultiTurnContext":
        """One per runtime (built on first use): tools, parser and template check are shared."""
        runtime = runtime or current(args)
        return runtime.shared("multi_turn.MultiTurnContext", lambda: cls(args, runtime))

    def warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg)
