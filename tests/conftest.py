"""Shared test set-up.

pytester's in-process runs restore sys.modules afterwards, dropping modules first imported inside them;
torch cannot be imported twice in one process, so the heavy modules are imported here, up front.
"""

import onnx
import onnx.reference  # noqa: F401
import onnxruntime  # noqa: F401
import torch  # noqa: F401

import pytest_ortdiff.diff
import pytest_ortdiff.runtimes.evaluator  # noqa: F401
