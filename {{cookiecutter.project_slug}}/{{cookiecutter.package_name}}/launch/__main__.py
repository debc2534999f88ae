"""`python -m <package>.launch single|multi|<mode> ...`: what the scripts run (main.py)."""

import sys

from .main import main

sys.exit(main())
