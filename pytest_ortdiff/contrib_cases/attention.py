"""Conformance cases for onnxruntime's attention contrib ops (see pytest_ortdiff.contrib_cases)."""

from __future__ import annotations

from . import ContribCase

CASES: list[ContribCase] = []
