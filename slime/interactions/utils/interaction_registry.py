"""verl's `verl.interactions.utils.interaction_registry` functions, with verl's behaviour, for code
written against verl (its trainers call them; its tests import them).

`get_interaction_class(cls_name)` imports the class a dotted path names; a `verl.interactions.*` name
resolves to verl's class when verl is installed, else to its equivalent here (`registry.VERL_EQUIVALENTS`).
Import errors are Python's own (`ModuleNotFoundError`), as in verl.
`initialize_interactions_from_config(path)` builds `{name: interaction}` from an `interaction:` YAML:
an entry without `name` is named after its class (`Gsm8kInteraction` -> `gsm8k`), the name is put into
the entry's config, a duplicate name is a `ValueError`, and an empty list gives an empty map. The
rollout's own loader (`registry.load_interaction_config`) is stricter and names file, entry and field.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from slime.interactions.registry import VERL_EQUIVALENTS, default_name
from slime.tools.registry import read_yaml
from slime.tools.verl_compat import verl_installed

logger = logging.getLogger(__name__)


def get_interaction_class(cls_name: str) -> Any:
    """The class `cls_name` ("package.module.Class") names."""
    if cls_name in VERL_EQUIVALENTS and not verl_installed():
        cls_name = VERL_EQUIVALENTS[cls_name]
    module_name, class_name = cls_name.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), class_name)


def initialize_interactions_from_config(interaction_config_file: str) -> dict[str, Any]:
    """`{name: interaction instance}` for every entry of the file's `interaction:` list."""
    config = read_yaml(str(interaction_config_file))
    interaction_map: dict[str, Any] = {}
    for item in (config or {}).get("interaction") or []:
        cls_name = item["class_name"]
        interaction_cls = get_interaction_class(cls_name)
        entry_config = dict(item.get("config") or {})
        name = item.get("name")
        if name is None:
            name = default_name(cls_name)
        if name in interaction_map:
            raise ValueError(f"Duplicate interaction name '{name}' found. Each interaction must have a unique name.")
        entry_config["name"] = name
        interaction_map[name] = interaction_cls(config=entry_config)
        logger.info("Initialized interaction '%s' with class '%s'", name, cls_name)
    return interaction_map
