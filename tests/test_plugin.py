"""The pytest surface, tested through real pytest runs (pytester): options, ini, marker, parametrization,
skips vs usage errors, passing and failing checks, the summary table, JSON output, xdist."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from pytest_ortdiff.runtimes.providers import unavailable_reason


def test_help_lists_the_ortdiff_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(
        [
            "numerical diff of ONNX models*",
            "*--ort-providers=ORT_PROVIDERS*",
            "*--ort-dtypes=ORT_DTYPES*",
            "*--ort-skip-unavailable*",
            "*--ortdiff-reports*",
            "*--ortdiff-json=PATH*",
        ]
    )
    result.stdout.fnmatch_lines(["*ortdiff_providers (string)*", "*ortdiff_dtypes (string)*"])


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.ortdiff(providers=None, dtypes=None, atol=None*"])


def test_default_is_cpu_float32(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    assert (ortdiff.provider, ortdiff.dtype) == ('CPU', 'float32')\n")
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_a[[]CPU-float32[]] PASSED*"])
    result.assert_outcomes(passed=1)


def test_parametrization_ids_from_command_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ort_provider, ort_dtype):\n    assert ort_provider == 'CPU'\n")
    result = pytester.runpytest("--collect-only", "-q", "--ort-providers=cpu", "--ort-dtypes=float32,fp16,bfloat16")
    result.stdout.fnmatch_lines(
        ["*test_a[[]CPU-float32[]]", "*test_a[[]CPU-float16[]]", "*test_a[[]CPU-bfloat16[]]", "3 tests collected*"]
    )


def test_ini_twins(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nortdiff_dtypes = float16, float64\n")
    pytester.makepyfile("def test_a(ort_dtype):\n    pass\n")
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_a[[]CPU-float16[]]", "*test_a[[]CPU-float64[]]"])


def test_marker_intersects_with_command_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ortdiff(dtypes=["float16", "bfloat16"])
        def test_a(ortdiff):
            pass

        def test_b(ortdiff):
            pass
        """
    )
    result = pytester.runpytest("--collect-only", "-q", "--ort-dtypes=float32,float16")
    result.stdout.fnmatch_lines(["*test_a[[]CPU-float16[]]", "*test_b[[]CPU-float32[]]", "*test_b[[]CPU-float16[]]", "3 tests collected*"])


def test_marker_alone_picks_its_dtypes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ortdiff(dtypes=["float16", "float64"])
        def test_a(ortdiff):
            pass
        """
    )
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_a[[]CPU-float16[]]", "*test_a[[]CPU-float64[]]"])


def test_empty_intersection_is_a_named_skip(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ortdiff(dtypes=["bfloat16"])
        def test_a(ortdiff):
            pass
        """
    )
    result = pytester.runpytest("-rs", "--ort-dtypes=float32")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no provider × dtype left: marker asks for * × [[]'bfloat16'[]], the run selects [[]'CPU'[]] × [[]'float32'[]]*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ort-providers=CPU,Vulkan"], "*--ort-providers: unknown provider 'Vulkan'; valid: CPU, CUDA, TensorRT*"),
        (["--ort-dtypes=float32,float8"], "*--ort-dtypes: unknown dtype 'float8'; valid: float32, float16, bfloat16, float64*"),
        (["--ort-dtypes=int64"], "*--ort-dtypes: int64 is not a floating dtype to test; valid: float32, float16, bfloat16, float64*"),
    ],
)
def test_unknown_names_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.skipif(unavailable_reason("CUDA") is None, reason="CUDA is available here: nothing to report as unavailable")
def test_explicit_unavailable_provider_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest("--ort-providers=CPU,CUDA")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ort-providers: CUDAExecutionProvider * available: CPU*--ort-skip-unavailable*"])


@pytest.mark.skipif(unavailable_reason("CUDA") is None, reason="CUDA is available here: nothing to skip")
def test_skip_unavailable_turns_the_error_into_named_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest("--ort-providers=CPU,CUDA", "--ort-skip-unavailable", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*holes in the provider × dtype matrix*", "1 test(s) skipped: CUDAExecutionProvider not available; available: CPU*"])
    result.stdout.fnmatch_lines(["SKIPPED*CUDAExecutionProvider*"])


@pytest.mark.skipif(unavailable_reason("CUDA") is None, reason="CUDA is available here: nothing to skip")
def test_provider_asked_by_marker_only_is_skipped_with_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ortdiff(providers=["CPU", "CUDA"])
        def test_a(ortdiff):
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED * CUDAExecutionProvider*available: CPU*"])


def test_available_expands_to_what_onnxruntime_offers(pytester: pytest.Pytester) -> None:
    from pytest_ortdiff.runtimes.providers import available

    pytester.makepyfile("def test_a(ort_provider):\n    pass\n")
    result = pytester.runpytest("--collect-only", "-q", "--ort-providers=available")
    result.stdout.fnmatch_lines([f"*test_a[[]{p}-float32[]]" for p in available()])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("dtypes=['float17']", "*@pytest.mark.ortdiff on test_bad.py::test_a: unknown dtype 'float17'*"),
        ("tolerance=1e-3", "*unknown argument(s) [[]'tolerance'[]]; valid: providers, dtypes, atol, rtol, max_ulp, budget*"),
        ("budget={1e-2: 5}", "*budget fraction for 0.01 must be between 0 and 1 (0.001 = 0.1 %), got 5.0*"),
        ("atol=-1", "*atol must be a non-negative number or a dict {dtype: number}, got -1*"),
        ("'float16'", "*takes keyword arguments only*"),
        ("dtype=['float16']", "*unknown argument(s) [[]'dtype'[]] (did you mean 'dtypes'?); valid: providers, dtypes,*"),
        ("budget={}", "*budget={} states no rule, so any error would pass: give thresholds*"),
    ],
)
def test_bad_marker_is_a_collection_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(test_bad=f"import pytest\n\n@pytest.mark.ortdiff({marker})\ndef test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("providers=[None]", "*providers: None is not a provider name; valid: CPU, CUDA, *"),
        ("providers=[0]", "*providers: 0 is not a provider name; valid: CPU, CUDA, *"),
        ("dtypes=[None]", "*dtypes: None is not a dtype; valid: float32, float16, bfloat16, float64*"),
        ("reproducible={'vary': None}", "*reproducible: vary must be a list of variations such as [[]'threads'[]]; valid: threads, graph_optimization*got None*"),
        ("reproducible={'vary': ['weather']}", "*reproducible: vary: unknown variation(s) [[]'weather'[]]; valid: threads, graph_optimization*"),
    ],
)
def test_bad_marker_values_name_the_valid_ones(pytester: pytest.Pytester, marker: str, message: str) -> None:
    """Issue 12, item 6: a marker error listing the valid values, never an AttributeError traceback."""
    pytester.makepyfile(test_bad=f"import pytest\n\n@pytest.mark.ortdiff({marker})\ndef test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*@pytest.mark.ortdiff on test_bad.py::test_a: {message.lstrip('*')}"])
    assert "AttributeError" not in result.stdout.str()


def test_marker_takes_torch_and_numpy_dtypes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_dt="""
        import numpy as np
        import pytest
        import torch

        @pytest.mark.ortdiff(dtypes=[torch.float16, np.float64, np.dtype("float32")])
        def test_a(ort_dtype):
            pass
        """
    )
    result = pytester.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_a[[]CPU-float16[]]", "*test_a[[]CPU-float64[]]", "*test_a[[]CPU-float32[]]"])


def test_marker_spellings_of_one_dtype_or_provider_are_one_case(pytester: pytest.Pytester) -> None:
    """dtypes=["float16", "fp16"] made [CPU-float16_0] and [CPU-float16_1], and one [CPU-float16] with
    --ort-dtypes: ids that depend on the command line lose their baselines."""
    pytester.makepyfile(
        test_dt="""
        import pytest
        import torch

        @pytest.mark.ortdiff(dtypes=["float16", "fp16", torch.float16, "half"], providers=["CPU", "CPUExecutionProvider"])
        def test_a(ort_dtype):
            pass
        """
    )
    for args in ((), ("--ort-dtypes=float16",)):
        result = pytester.runpytest("--collect-only", "-q", *args)
        assert [line for line in result.stdout.lines if "::test_a" in line] == ["test_dt.py::test_a[CPU-float16]"]


def test_reproducible_empty_dict_still_checks(pytester: pytest.Pytester) -> None:
    """Issue 12, item 4: reproducible={} (a dict of no arguments) asks for the check with its defaults,
    and the guard fails a test that ran none."""
    pytester.makepyfile(
        test_rep="""
        import pytest

        from pytest_ortdiff import models

        @pytest.mark.ortdiff(reproducible={})
        def test_no_check(ortdiff):
            pass

        @pytest.mark.ortdiff(reproducible={})
        def test_check(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            ortdiff.check(model, models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0))
            assert ortdiff.reproducible_checked
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.ortdiff(reproducible=...) on test_rep.py::test_no_check*, but the test ran no reproducibility check*"])


def test_marker_without_fixture_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nofix="import pytest\n\n@pytest.mark.ortdiff(dtypes=['float16'])\ndef test_a():\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*uses none of the fixtures ortdiff, ort_provider, ort_dtype*"])


def test_passing_check_and_summary_table(pytester: pytest.Pytester, seed_test: Callable[..., str]) -> None:
    pytester.makepyfile(test_seed=seed_test("dtypes=['float32', 'float16']"))
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*= ortdiff summary =*",
            "test * provider * dtype * max abs * max rel * worst budget line * result",
            "test_seed.py::test_lnmm[[]CPU-float32[]] * CPU * float32 * passed",
            "test_seed.py::test_lnmm[[]CPU-float16[]] * CPU * float16 * passed",
        ]
    )


def test_failing_check_prints_the_report(pytester: pytest.Pytester, seed_test: Callable[..., str]) -> None:
    # a budget of zero elements above 0 cannot hold between two float16 implementations of LayerNorm+MatMul
    pytester.makepyfile(test_seed=seed_test("dtypes=['float16'], budget={0.0: 0.0}"))
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*OrtDiffFailure: ortdiff: torch evaluator vs onnxruntime CPU float16: tolerance broken (budget >0: 0 %)",
            "*- Z: * of 1,024 elements (*) exceed 0; budget allows 0 %",
            "*output 'Z'  float16[[]2x16x32[]]  n=1,024",
            "*max abs * at (*): expected *, got *",
            "*|diff| >   elements   share*",
            "*0 * %  █*",
        ]
    )
    result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CPU-float16[]] * CPU * float16 * failed"])


def test_per_dtype_tolerance(pytester: pytest.Pytester, seed_test: Callable[..., str]) -> None:
    # float16 gets a generous ULP limit, float32 an impossible exactness: only float32 fails
    pytester.makepyfile(test_seed=seed_test("dtypes=['float32', 'float16'], max_ulp={'float16': 64, 'float32': 0}, atol={'float16': 1.0}"))
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_lnmm[[]CPU-float32[]] FAILED*", "*test_lnmm[[]CPU-float16[]] PASSED*"])
    result.stdout.fnmatch_lines(["*max ULP error * exceeds max_ulp=0*"])


def test_bfloat16_hole_on_cpu_is_named(pytester: pytest.Pytester, seed_test: Callable[..., str]) -> None:
    pytester.makepyfile(test_seed=seed_test("dtypes=['bfloat16']"))
    result = pytester.runpytest("-rs")
    # onnxruntime's CPU provider has no bfloat16 LayerNormalization/MatMul: the op is named
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*holes in the provider × dtype matrix*", "1 test(s) skipped: CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for *(*)"])


def test_reports_and_json(pytester: pytest.Pytester, seed_test: Callable[..., str]) -> None:
    pytester.makepyfile(test_seed=seed_test("dtypes=['float32']"))
    result = pytester.runpytest("--ortdiff-reports", "--ortdiff-json=out/results.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- ortdiff reports -*", "test_seed.py::test_lnmm[[]CPU-float32[]] (passed; tolerance *)", "output 'Z'  float32[[]2x16x32[]]  n=1,024", "*wrote 1 check result, 1 test outcome to out*results.json"])
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    (row,) = data["results"]
    assert row["test"] == "test_seed.py::test_lnmm[CPU-float32]"
    assert row["provider"] == "CPU" and row["dtype"] == "float32" and row["outcome"] == "passed"
    assert row["report"]["n"] == 1024
    assert row["max_abs"] == row["report"]["max_abs"] < 1e-3


# -- the OrtDiff checker: kernels, bad models, integer outputs, fuzz and feed validation --------------

CONTRIB_TESTS = """
import pytest

def test_no_kernel(ortdiff):
    ortdiff.check(contrib_model(), FEEDS)

def test_kernels_passed_through(ortdiff):
    kernels = {("com.microsoft", "Inverse"): "ort", ("com.microsoft", "Trilu"): "ort"}
    report = ortdiff.check(contrib_model(relu=True), FEEDS, kernels=kernels)
    assert report.is_exact
    (y,) = ortdiff.run(contrib_model(), FEEDS, runtime="torch", kernels=kernels)
    (expected,) = ortdiff.run(contrib_model(), FEEDS)
    assert y.tolist() == expected.tolist()

def test_missing_ort(ortdiff):
    assert ortdiff.check(contrib_model(relu=True), FEEDS, missing="ort").is_exact

def test_missing_ort_everywhere(ortdiff):
    ortdiff.check(contrib_model(), FEEDS, missing="ort")

@pytest.mark.ortdiff(atol=0.5, rtol=0.0)
def test_missing_ort_broken(ortdiff):
    ortdiff.check(contrib_model(relu=True), FEEDS, missing="ort", kernels={("", "Relu"): lambda x: x.relu() + 1.0})
"""


def test_ops_without_a_kernel_in_a_test(pytester: pytest.Pytester, contrib_source: str) -> None:
    """An op the evaluator lacks fails a test naming every such op and the one call that runs it
    (kernels= naming them all, or missing="ort"); missing="ort" runs them on onnxruntime, and the report
    and the summary row name them."""
    pytester.makepyfile(test_ops=contrib_source + CONTRIB_TESTS)
    result = pytester.runpytest("-rf")
    result.assert_outcomes(passed=2, failed=3)
    ops = "com.microsoft::Inverse, com.microsoft::Trilu"
    # every node on onnxruntime: onnxruntime compared with itself, which is not a pass
    result.stdout.fnmatch_lines(
        [
            "*OrtDiffFailure: ortdiff: torch evaluator vs onnxruntime CPU float32: onnxruntime compared with itself, not a pass",
            f"*  - every node ran on onnxruntime ({ops} without a torch kernel): the check compared onnxruntime with itself, nothing of the torch evaluator;*",
        ]
    )
    kernels = "{('com.microsoft', 'Inverse'): 'ort', ('com.microsoft', 'Trilu'): 'ort'}"
    result.stdout.fnmatch_lines(
        [
            f"*MissingKernelError: no torch kernel for com.microsoft::Inverse (opset 1), com.microsoft::Trilu (opset 1);*"
            f"; in a test: ortdiff.check(model, feeds, kernels={kernels}) (or ortdiff.check(model, feeds, missing='ort'))",
        ]
    )
    result.stdout.fnmatch_lines(["*OrtDiffFailure: ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken (atol=0.5 rtol=0)", f"E *ran on onnxruntime (no torch kernel): {ops}"])
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line) for line in result.stdout.lines if line.startswith("test_ops.py::"))}
    assert rows["test_ops.py::test_missing_ort[CPU-float32]"][-2:] == [f"exact; ran on onnxruntime (no torch kernel): {ops}", "passed"]
    assert rows["test_ops.py::test_missing_ort_broken[CPU-float32]"][-2].endswith(f"; ran on onnxruntime (no torch kernel): {ops}")
    assert rows["test_ops.py::test_missing_ort_broken[CPU-float32]"][-1] == "failed"
    assert rows["test_ops.py::test_kernels_passed_through[CPU-float32]"][-2:] == ["exact", "passed"]  # kernels= is the user's own choice


def test_evaluators_are_cached_per_kernel_overrides() -> None:
    import torch

    from pytest_ortdiff import models
    from pytest_ortdiff.plugin.fixtures import OrtDiff

    checker = OrtDiff("CPU", "float32")
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)

    def shifted(by: float) -> object:
        return lambda x, w: torch.matmul(x, w) + by

    (plain,) = checker.run(model, feeds, runtime="torch")
    (one,) = checker.run(model, feeds, runtime="torch", kernels={("", "MatMul"): shifted(1.0)})
    (two,) = checker.run(model, feeds, runtime="torch", kernels={("", "MatMul"): shifted(2.0)})
    assert torch.allclose(one - plain, torch.ones_like(plain)) and torch.allclose(two - plain, 2 * torch.ones_like(plain))
    # a check with an override judges the evaluator built with it
    broken = {("", "MatMul"): shifted(1.0)}
    with pytest.raises(AssertionError, match="tolerance broken"):
        checker.check(model, feeds, kernels=broken)
    assert checker.check(model, feeds).max_abs < 1e-4
    with pytest.raises(ValueError, match=r"kernels= applies to the torch evaluator \(runtime='torch' or 'float64'\), not to runtime='ort'"):
        checker.run(model, feeds, runtime="ort", kernels=broken)


def test_model_failing_onnx_checker_fails_before_onnxruntime(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_bad_model="""
        import onnx
        import onnx.helper as oh
        import torch

        def test_a(ortdiff):
            # a Relu reading a value nothing produces: onnx.checker rejects it
            graph = oh.make_graph(
                [oh.make_node("Relu", ["x"], ["y"])], "g",
                [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
                [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
            )
            model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
            model.graph.node[0].input.append("missing")
            ortdiff.check(model, {"x": torch.tensor([-1.0, 0.5, 2.0])})
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["E *InvalidModelError: the model fails onnx.checker: Nodes in a graph must be topologically sorted, however input 'missing' of node: name: OpType: Relu is not output of any previous nodes; fix the graph"]
    )
    result.stdout.no_fnmatch_line("*InvalidArgument*")
    result.stdout.no_fnmatch_line("*onnxruntime.capi*")


ARGMAX_TEST = """
import onnx
import onnx.helper as oh
import pytest
import torch

def argmax_model():
    nodes = [oh.make_node("Relu", ["x"], ["y"]), oh.make_node("ArgMax", ["x"], ["idx"], axis=1, keepdims=0)]
    graph = oh.make_graph(
        nodes, "am", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 5])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5]), oh.make_tensor_value_info("idx", onnx.TensorProto.INT64, [2])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)

FEEDS = {"x": torch.tensor([[0.1, 3.0, -1.0, 0.5, 0.2], [2.0, 2.5, 0.0, 4.0, -3.0]])}

def off_by_one(x):
    return (torch.argmax(x, dim=1) + 1) % 5

@pytest.mark.ortdiff(atol=1000.0, rtol=1.0)
def test_exact(ortdiff):
    ortdiff.check(argmax_model(), FEEDS)

@pytest.mark.ortdiff(atol=1000.0, rtol=1.0)
def test_wrong_index(ortdiff):
    ortdiff.check(argmax_model(), FEEDS, kernels={("", "ArgMax"): off_by_one})
"""


def test_integer_output_compares_exactly_in_check(pytester: pytest.Pytester) -> None:
    # a huge atol/rtol covers the float output; the ArgMax indices must still match exactly
    pytester.makepyfile(test_am=ARGMAX_TEST)
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_exact[[]CPU-float32[]] PASSED*", "*test_wrong_index[[]CPU-float32[]] FAILED*"])
    result.stdout.fnmatch_lines(
        [
            "*OrtDiffFailure: ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken (atol=1e+03 rtol=1)",
            "*- idx: 2 of 2 elements differ; integer outputs compare exactly; worst at (0): expected 2, got 1",
        ]
    )
    result.stdout.no_fnmatch_line("*- y:*")


def test_fuzz_validates_dims_and_regime_up_front() -> None:
    from pytest_ortdiff import models
    from pytest_ortdiff.plugin.fixtures import OrtDiff

    checker = OrtDiff("CPU", "float32")
    build = models.layer_norm_matmul_add
    with pytest.raises(ValueError, match=re.escape("ortdiff.fuzz: dims={'c': (0, 0)}: 'c' must be at least 1 (layer_norm_matmul_add declares 'c' in (1, 256)); use e.g. dims={'c': (1, 256)}")):
        checker.fuzz(build, dims={"c": (0, 0)})
    with pytest.raises(ValueError, match=re.escape("ortdiff.fuzz: dims={'b': (0, 8)}: 'b' must be at least 1 (layer_norm_matmul_add declares 'b' in (1, 64)); use e.g. dims={'b': (1, 8)}")):
        checker.fuzz(build, dims={"b": (0, 8)})
    model = build(dtype="float32")
    with pytest.raises(ValueError, match=re.escape("ortdiff.fuzz: dims={'a': (0, 3)}: 'a' must be at least 1 (a dim of 0 makes an empty input); use e.g. dims={'a': (1, 3)}")):
        checker.fuzz(model, dims={"a": (0, 3)})
    with pytest.raises(ValueError, match=re.escape("dims(): 'd' is not a dim of this model/builder; its dims are ['a', 'b', 'c']")):
        checker.fuzz(build, dims={"d": (0, 3)})
    valid = "valid: normal, uniform, large, tiny, special"
    with pytest.raises(ValueError, match=re.escape(f"ortdiff.fuzz: unknown regime 'gaussian'; {valid}")):
        checker.fuzz(build, regime="gaussian")
    with pytest.raises(ValueError, match=re.escape(f"ortdiff.fuzz: unknown regime(s) ['gauss', 'huge'] in regime=['normal', 'gauss', 'huge']; {valid}")):
        checker.fuzz(build, regime=["normal", "gauss", "huge"])
    with pytest.raises(ValueError, match=re.escape(f"ortdiff.fuzz: regime=[] names no regime; {valid}")):
        checker.fuzz(build, regime=[])


def test_fuzz_accepts_a_list_of_regimes_and_builder_zero_lows() -> None:
    from pytest_ortdiff import models
    from pytest_ortdiff.plugin.fixtures import OrtDiff

    stats = OrtDiff("CPU", "float32").fuzz(models.layer_norm_matmul_add, dims={"c": (1, 16)}, regime=["normal", "uniform"], max_examples=5)
    assert stats["examples"] == 5
    # a builder may declare 0 as a valid low (llama's past: no cache yet)
    stats = OrtDiff("CPU", "float32").fuzz(
        models.llama_attention, dims={"hidden": (8, 8), "heads": (1, 1), "kv_heads": (1, 1), "past": (0, 0), "seq": (1, 2)}, max_examples=3
    )
    assert stats["examples"] == 3


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "feed 'X' is None; pass a torch tensor or numpy array"),
        ([[1.0, 2.0]], "feed 'X' is a list; pass a torch tensor or numpy array (e.g. torch.tensor(value, dtype=torch.float32))"),
        (1.5, "feed 'X' is a float; pass a torch tensor or numpy array (e.g. torch.tensor(value, dtype=torch.float32))"),
    ],
)
@pytest.mark.parametrize("call", ["check", "run-ort", "run-torch"])
def test_bad_feed_is_named_before_the_runtimes_see_it(value: object, message: str, call: str) -> None:
    from pytest_ortdiff import models
    from pytest_ortdiff.plugin.fixtures import OrtDiff

    checker = OrtDiff("CPU", "float32")
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
    feeds["X"] = value
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        if call == "check":
            checker.check(model, feeds)
        else:
            checker.run(model, feeds, runtime=call.split("-")[1])
    with pytest.raises(TypeError, match=re.escape("feeds must be a dict {input name: tensor}, got list")):
        checker.check(model, list(feeds.values()))  # type: ignore[arg-type]


def test_check_and_compare_take_an_atol_rtol_pair_like_compare() -> None:
    import torch

    from pytest_ortdiff import models
    from pytest_ortdiff.plugin.fixtures import OrtDiff

    checker = OrtDiff("CPU", "float32")
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
    shifted = {("", "MatMul"): lambda x, w: torch.matmul(x, w) + 0.5}
    assert checker.check(model, feeds, tolerance=(1.0, 0.0), kernels=shifted).tolerance == (1.0, 0.0)
    with pytest.raises(AssertionError, match="tolerance broken"):
        checker.check(model, feeds, tolerance=(0.1, 0.0), kernels=shifted)
    r = checker.compare(torch.zeros(3), torch.ones(3), tolerance=(0.5, 0.0))
    assert r.out_of_tolerance == 3
    with pytest.raises(TypeError, match=r"tolerance must be a Tolerance, a dict of its arguments or an \(atol, rtol\) pair, got 0.1"):
        checker.check(model, feeds, tolerance=0.1)  # type: ignore[arg-type]


def test_cache_bound_from_ini_and_its_errors(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12, item 16: ini ortdiff_cache_mb bounds the model caches; $ORTDIFF_CACHE_MB overrides it."""
    monkeypatch.delenv("ORTDIFF_CACHE_MB", raising=False)
    pytester.makeini("[pytest]\nortdiff_cache_mb = 3\n")
    pytester.makepyfile("from pytest_ortdiff import selection\n\ndef test_a():\n    assert selection.cache_bytes() == 3 << 20\n")
    pytester.runpytest().assert_outcomes(passed=1)
    monkeypatch.setenv("ORTDIFF_CACHE_MB", "5")
    pytester.makepyfile("from pytest_ortdiff import selection\n\ndef test_a():\n    assert selection.cache_bytes() == 5 << 20\n")
    pytester.runpytest().assert_outcomes(passed=1)
    monkeypatch.setenv("ORTDIFF_CACHE_MB", "-1")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*$ORTDIFF_CACHE_MB: expected a number of MiB such as 512 (0: keep only the latest model), got '-1'*"])
    monkeypatch.delenv("ORTDIFF_CACHE_MB")
    pytester.makeini("[pytest]\nortdiff_cache_mb = 1GB\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini ortdiff_cache_mb: expected a number of MiB such as 512*got '1GB'*"])


def test_gpu_cases_share_one_xdist_group(pytester: pytest.Pytester) -> None:
    """Under `--dist loadgroup` the GPU cases run on one worker: they carry xdist_group("ortdiff-gpu"), CPU
    cases none."""
    pytester.makepyfile(test_g="def test_a(ortdiff):\n    pass\n")
    items, _ = pytester.inline_genitems("--ort-providers=CPU,CUDA", "--ort-skip-unavailable", "-p", "no:xdist")
    groups = {item.name: [m.args for m in item.iter_markers("xdist_group")] for item in items}
    assert groups == {"test_a[CPU-float32]": [], "test_a[CUDA-float32]": [("ortdiff-gpu",)]}


def test_the_summary_says_when_compare_gave_the_fused_cuda_pass_up(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton that cannot compile or launch on the GPU leaves compare() on the torch path: the same numbers,
    slower. The run says so once, with Triton's reason."""
    from pytest_ortdiff.numerics import diff_triton

    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    assert "could not run here" not in pytester.runpytest().stdout.str()
    monkeypatch.setattr(diff_triton, "_FAILURE", ["RuntimeError: Failed to find C compiler."])
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["ortdiff: compare() on CUDA took the torch path (the same numbers, slower): Triton's fused pass could not run here: RuntimeError: Failed to find C compiler."])
    result.assert_outcomes(passed=1)


def test_the_summary_is_in_collection_order_under_xdist(pytester: pytest.Pytester, xdist_args: list[str]) -> None:
    """Under -n 2 the summary's rows came in the order the workers finished."""
    pytester.makepyfile(
        test_order="""
        import time
        import pytest
        from pytest_ortdiff import models

        @pytest.mark.parametrize("k", [0, 1, 2, 3])
        def test_k(ortdiff, k):
            if k == 0:
                time.sleep(1.5)  # (the first collected finishes last)
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            ortdiff.check(model, models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=k))
        """
    )
    result = pytester.runpytest(*xdist_args, "--dist", "load")
    result.assert_outcomes(passed=4)
    rows = [line.split()[0] for line in result.stdout.lines if line.startswith("test_order.py::test_k[")]
    assert rows == [f"test_order.py::test_k[CPU-float32-{k}]" for k in range(4)], rows
