"""Defaults of the rollout flags that code below the CLI reads too, written once.

The parser (`slime.cli.parser`) takes its defaults from here, and so do the places that must work with a
namespace built by hand (slime's `train.py`, plugins, tests) or with no namespace at all (`EngineClient(...)`),
so a caller that leaves a flag out gets what the command line would have given.
"""

ROLLOUT_BATCH_SIZE = 4  # prompts (groups) per rollout; slime requires the flag
REQUEST_MAX_RETRIES = 100  # retries of one engine request; the real budget is --request-retry-window
