"""slime's path `slime.agent.trajectory`; the code lives in slime.agent.gateway.trajectory. The name is bound to that
very module, not to a copy of its names, so a plugin or a test that patches an attribute here patches the code's."""

import sys

from slime.agent.gateway import trajectory

sys.modules[__name__] = trajectory
