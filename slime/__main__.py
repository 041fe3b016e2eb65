import sys

from slime.cli.rollout import main

sys.exit(main())
