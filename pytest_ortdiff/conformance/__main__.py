"""`python -m pytest_ortdiff.conformance`: the evaluator against onnx's node test suite (see __init__.py)."""

import sys

from . import main

sys.exit(main())
