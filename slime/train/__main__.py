import sys

from slime.cli.train import main

sys.exit(main())
