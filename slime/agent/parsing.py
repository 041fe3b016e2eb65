"""slime's path `slime.agent.parsing`; the code lives in slime.agent.gateway.parsing. The name is bound to that very
module, not to a copy of its names, so a plugin or a test that patches an attribute here patches the code's."""

import sys

from slime.agent.gateway import parsing

sys.modules[__name__] = parsing
