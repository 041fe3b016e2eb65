import sys

from slime.rollout_main import main

sys.exit(main())
