"""onnxruntime's contrib ops through the torch evaluator (pytest_ortdiff.contrib_cases): every one-node case
matches onnxruntime within its ULPs (16-bit: within onnxruntime's own rounding), or departs by what it names."""

from __future__ import annotations

import pytest

from pytest_ortdiff.contrib_cases import ContribCase, all_cases, run_case

_CASES = all_cases()


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_contrib_case_matches_onnxruntime(case: ContribCase) -> None:
    for provider in case.providers:
        r = run_case(case, provider)
        if r.status == "no onnxruntime" and provider != "CPU":
            continue  # a CUDA-only op without CUDA: checked on a GPU
        assert r.status in ("pass", "departs"), f"{case.name} on {provider}: {r.status}: {r.detail}"
        assert r.ulp is not None and r.allowed is not None
        if r.status == "departs":
            assert r.detail, "a departing case says how onnxruntime departs"
