"""`python -m <package>.launch single|multi|<mode> ...`: what scripts/run_single.sh, run_multi.sh and the
scripts of launch/modes/ run (main.py)."""

import sys

from .main import main

sys.exit(main())
