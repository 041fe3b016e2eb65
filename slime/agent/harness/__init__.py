"""slime's path `slime.agent.harness` (and its `common`, `claude_code`, `codex`); the code lives in
slime.agent.sandboxes.harness. The names are bound to those very modules, not to copies of their names, so a plugin
or a test that patches an attribute here patches the code's."""

import sys

from slime.agent.sandboxes import harness
from slime.agent.sandboxes.harness import claude_code, codex, common

sys.modules.update(
    {
        __name__: harness,
        f"{__name__}.common": common,
        f"{__name__}.claude_code": claude_code,
        f"{__name__}.codex": codex,
    }
)
