"""`python -m <package>.launch single|multi|comm ...`: what scripts/run_single.sh, run_multi.sh and
check_comm.sh run (main.py)."""

import sys

from .main import main

sys.exit(main())
