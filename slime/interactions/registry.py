"""Load verl's interaction YAML unchanged: `interaction: [{name, class_name, config}]`.

`verl.interactions.*` class names resolve to verl's class when verl is installed, else to slime's
equivalent (`VERL_EQUIVALENTS`), as tool class names do; any other dotted path is a user class
with verl's `BaseInteraction` methods. As in verl, an entry without `name` is named after its class
(`Gsm8kInteraction` -> `gsm8k`), the name is put into the entry's config, and each sample picks its
interaction by `interaction_kwargs.name`. Every mistake is an `InteractionConfigError` naming the
file, the entry and the field.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slime.interactions.adapter import INTERACTION_METHODS, InteractionAdapter, is_interaction_class
from slime.tools.base_tool import ToolConfigError
from slime.tools.registry import read_yaml
from slime.tools.verl_compat import resolve_tool_class
from slime.utils.misc import PluginLoadError

logger = logging.getLogger(__name__)

VERL_EQUIVALENTS: dict[str, str] = {
    "verl.interactions.base.BaseInteraction": "slime.interactions.base.BaseInteraction",
    # verl's grading and behaviour; slime.interactions.gsm8k_interaction.Gsm8kInteraction is ours
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "slime.interactions.verl_gsm8k_interaction.Gsm8kInteraction",
}
ENTRY_FIELDS = ("name", "class_name", "config")


class InteractionConfigError(ValueError):
    """An interaction YAML that cannot be loaded; the message names file, entry and field."""


class InteractionSet:
    """The interactions of one config, by name."""

    def __init__(self, interactions: list[InteractionAdapter], source: str = "<memory>"):
        self.source = source
        self.by_name = {i.name: i for i in interactions}

    @property
    def names(self) -> list[str]:
        return list(self.by_name)

    def select(self, interaction_kwargs: Any) -> InteractionAdapter:
        """The sample's interaction, named by its `interaction_kwargs['name']` (verl's rule)."""
        name = check_sample_kwargs(interaction_kwargs, self.names, self.source)
        return self.by_name[name]


def check_sample_kwargs(interaction_kwargs: Any, names: list[str], source: str) -> str:
    """The interaction a sample's `interaction_kwargs` names; ValueError saying what is wrong."""
    if not isinstance(interaction_kwargs, dict):
        raise ValueError(f"interaction_kwargs must be a mapping with a 'name', got {type(interaction_kwargs).__name__}")
    name = interaction_kwargs.get("name")
    if not isinstance(name, str):
        raise ValueError(f"interaction_kwargs has no 'name' string (verl requires one; {source} configures {names})")
    if name not in names:
        raise ValueError(
            f"interaction_kwargs names interaction {name!r}, which {source} does not configure (it has {names})"
        )
    return name


def default_name(class_name: str) -> str:
    """verl's name for an entry without one: the class name, lower-cased, without 'Interaction'."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def _entries(path: str) -> list[Any]:
    try:
        data = read_yaml(path)
    except ToolConfigError as e:
        raise InteractionConfigError(str(e)) from None
    if isinstance(data, dict) and "interaction" not in data and "tools" in data:
        raise InteractionConfigError(
            f"{path}: tools: this is a verl tool config; give it to --tool-config-path "
            f"(--interaction-config-path takes a top-level 'interaction:' list)"
        )
    if not isinstance(data, dict) or not isinstance(data.get("interaction"), list):
        raise InteractionConfigError(f"{path}: expected a top-level 'interaction:' list")
    if not data["interaction"]:
        raise InteractionConfigError(f"{path}: interaction: the list is empty; nothing would answer the model")
    unknown = sorted(str(k) for k in data if k != "interaction")
    if unknown:
        raise InteractionConfigError(f"{path}: unknown top-level field(s) {unknown}")
    return data["interaction"]


def _name_of(entry: Any, where: str) -> str:
    """The entry's name (given, or verl's default from class_name), after checking its fields."""
    if not isinstance(entry, dict):
        raise InteractionConfigError(f"{where}: expected a mapping with name, class_name, config")
    unknown = sorted(str(k) for k in set(entry) - set(ENTRY_FIELDS))
    if unknown:
        raise InteractionConfigError(f"{where}: unknown field(s) {unknown} (an entry has {list(ENTRY_FIELDS)})")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name.strip():
        raise InteractionConfigError(f"{where}.class_name: required, a dotted path like 'pkg.module.Class'")
    name = entry.get("name")
    if name is None and not default_name(class_name):
        raise InteractionConfigError(
            f"{where}.name: required (verl's name from the class name {class_name!r} would be empty)"
        )
    if name is None:
        return default_name(class_name)
    if not isinstance(name, str) or not name:
        raise InteractionConfigError(f"{where}.name: must be a non-empty string, got {name!r:.40}")
    return name


def interaction_names(path: str | Path) -> list[str]:
    """The names a config defines, checked as far as the file goes (no class is imported): what a
    data check needs to tell whether a row's interaction exists."""
    path = str(path)
    names: dict[str, int] = {}
    for i, entry in enumerate(_entries(path)):
        name = _name_of(entry, f"{path}: interaction[{i}]")
        if name in names:
            raise InteractionConfigError(
                f"{path}: interaction[{i}].name: duplicate interaction name {name!r} "
                f"(already used by interaction[{names[name]}])"
            )
        names[name] = i
    return list(names)


def build_interaction(entry: dict[str, Any], name: str, where: str) -> InteractionAdapter:
    """One checked entry -> its interaction object (`cls(config=...)`, the name put into config as verl does)."""
    class_name = entry["class_name"]
    try:
        cls, note = resolve_tool_class(class_name, VERL_EQUIVALENTS, kind="interaction")
    except PluginLoadError as e:
        raise InteractionConfigError(f"{where}.class_name: {e}") from None
    if note:
        logger.info("%s: %s", where, note)
    if not is_interaction_class(cls):
        raise InteractionConfigError(
            f"{where}.class_name: {class_name!r} is not an interaction class (one with "
            f"{', '.join(INTERACTION_METHODS)}, as verl's BaseInteraction)"
        )
    config = entry.get("config") if entry.get("config") is not None else {}
    if not isinstance(config, dict):
        raise InteractionConfigError(f"{where}.config: expected a mapping, got {type(config).__name__}")
    try:
        inner = cls(config={**config, "name": name})
    except Exception as e:  # noqa: BLE001 - the class's own constructor failed; say which entry
        raise InteractionConfigError(f"{where}: {class_name}(config=...) failed: {type(e).__name__}: {e}") from e
    return InteractionAdapter(inner, name, class_name)


def load_interaction_config(path: str | Path) -> InteractionSet:
    """Parse and build every interaction of a YAML file (new objects each call)."""
    path = str(path)
    names = interaction_names(path)
    built = [
        build_interaction(entry, name, f"{path}: interaction[{i}]")
        for i, (entry, name) in enumerate(zip(_entries(path), names))
    ]
    return InteractionSet(built, source=path)
