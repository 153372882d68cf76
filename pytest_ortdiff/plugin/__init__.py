"""The pytest adapter, and pytest's entry point (`pytest11: ortdiff = pytest_ortdiff.plugin`): pytest registers
this module and finds its hooks and fixtures on it. The only layer that imports pytest; no torch at import."""

from __future__ import annotations

from .fixtures import _ortdiff_case, ort_dtype, ort_provider, ortdiff
from .hooks import (
    pytest_addoption,
    pytest_configure,
    pytest_generate_tests,
    pytest_itemcollected,
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_unconfigure,
)

__all__ = [
    "_ortdiff_case",
    "ort_dtype",
    "ort_provider",
    "ortdiff",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_itemcollected",
    "pytest_runtest_call",
    "pytest_runtest_setup",
    "pytest_unconfigure",
]
