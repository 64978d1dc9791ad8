"""`python -m cli ...`: the `routerops` command (cli/main.py)."""

import sys

from cli.main import main

sys.exit(main())
