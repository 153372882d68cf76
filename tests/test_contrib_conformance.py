"""onnxruntime's contrib ops through the torch evaluator (pytest_ortdiff.conformance.contrib_cases): every one-node case
matches onnxruntime within its ULPs (16-bit: within onnxruntime's own rounding), or departs by what it names."""

from __future__ import annotations

import functools

import pytest

from pytest_ortdiff.conformance.contrib_cases import ContribCase, ContribResult, all_cases, run_case

_CASES = all_cases()
_BY_NAME = {c.name: c for c in _CASES}

@functools.cache
def _result(name: str, provider: str) -> ContribResult:
    return run_case(_BY_NAME[name], provider)


@pytest.mark.parametrize("case", _CASES, ids=[c.name for c in _CASES])
def test_contrib_case_matches_onnxruntime(case: ContribCase) -> None:
    for provider in case.providers:
        r = _result(case.name, provider)
        if r.status == "no onnxruntime" and provider != "CPU":
            continue  # a CUDA-only op without CUDA: checked on a GPU
        if r.status == "no onnxruntime" and case.min_onnxruntime:
            pytest.skip(r.detail)  # (onnxruntime 1.31, the newest onnxruntime-gpu's line, lacks the variant)
        assert r.status in ("pass", "departs"), f"{case.name} on {provider}: {r.status}: {r.detail}"
        assert r.ulp is not None and r.allowed is not None
        if r.status == "departs":
            assert r.detail, "a departing case says how onnxruntime departs"


def _one_node(op: str, elem: int, domain: str = "", **attrs: object) -> object:
    from onnx import helper

    node = helper.make_node(op, ["x"], ["y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", elem, [2, 8])], [helper.make_tensor_value_info("y", elem, [2, 8])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _case(op: str, dtype: str, **kw: object) -> ContribCase:
    import torch
    from onnx import TensorProto

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]

    def build() -> tuple[object, dict[str, object]]:
        x = torch.linspace(-3, 3, 16, dtype=torch.float32).reshape(2, 8).to(getattr(torch, dtype))
        return _one_node(op, elem), {"x": x}

    return ContribCase(f"{op}.{dtype}", op, dtype, build, **kw)  # type: ignore[arg-type]


def test_runner_classifies_pass_departs_and_absent_provider() -> None:
    from pytest_ortdiff.conformance.contrib_cases import render

    ok = run_case(_case("Tanh", "float32"))
    assert ok.status == "pass" and ok.ulp is not None and ok.ulp <= 4 and ok.allowed == 4
    half = run_case(_case("Sigmoid", "float16"))
    assert half.status == "pass" and half.allowed is not None and half.allowed >= 1
    departs = run_case(_case("Tanh", "float32", departs="an approximation on purpose"))
    assert departs.status == "departs" and departs.detail == "an approximation on purpose"
    import torch

    cuda = run_case(_case("Tanh", "float32", providers=("CUDA",)))
    if not torch.cuda.is_available():
        assert cuda.status == "no onnxruntime" and "CUDA" in cuda.detail
    table = render([ok, half, departs], verbose=True)
    assert "Tanh" in table and "2 of 3 contrib cases pass, 1 depart from the op's meaning on purpose; 2 ops" in table
    assert "Tanh.float32 [Tanh, float32, CPU]" in table and "an approximation on purpose" in table


def test_runner_says_wrong_when_ours_differs() -> None:
    from pytest_ortdiff.runtimes.kernels import REGISTRY, kernel
    from pytest_ortdiff.runtimes.kernels.base import _LOOKED_UP, Kernel, lookup

    assert lookup("", "Softsign", 17) is not None and lookup("", "Softsign", 17).since < 17  # type: ignore[union-attr]

    @kernel("Softsign", since=17)
    class _Wrong(Kernel):  # a kernel off by 0.1 %: planted above the real one at opset 17
        def run(self, x):  # type: ignore[no-untyped-def]
            return (x / (1 + x.abs()) * 1.001,)

    try:
        r = run_case(_case("Softsign", "float32"))
    finally:
        REGISTRY[("", "Softsign")] = [v for v in REGISTRY[("", "Softsign")] if v[1] is not _Wrong]
        _LOOKED_UP.clear()
    assert r.status == "wrong" and r.ulp is not None and r.ulp > 1000, r
    assert "floored ulp from onnxruntime (allowed 4)" in r.detail
    assert run_case(_case("Softsign", "float32")).status == "pass"

