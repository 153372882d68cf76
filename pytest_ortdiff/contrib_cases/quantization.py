"""Conformance cases for onnxruntime's quantization contrib ops (see pytest_ortdiff.contrib_cases)."""

from __future__ import annotations

from . import ContribCase

CASES: list[ContribCase] = []
