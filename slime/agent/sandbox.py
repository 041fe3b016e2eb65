"""slime's path `slime.agent.sandbox`; the code lives in slime.agent.sandboxes.sandbox. The name is bound to that very
module, not to a copy of its names, so a plugin or a test that patches an attribute here patches the code's."""

import sys

from slime.agent.sandboxes import sandbox

sys.modules[__name__] = sandbox
