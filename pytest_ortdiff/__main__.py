"""`python -m pytest_ortdiff`: see cli.py."""

import sys

from .cli import main

sys.exit(main())
