"""The pytest surface, tested through real pytest runs (pytester): options, ini, marker, parametrization,
skips vs usage errors, passing and failing checks, the summary table, JSON output, xdist."""

from __future__ import annotations

import json

import pytest

SEED_TEST = """
import pytest
from pytest_ortdiff import models

@pytest.mark.ortdiff({marker})
def test_lnmm(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={{"a": 2, "b": 16, "c": 32}}, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
"""


def _cuda_usable() -> bool:
    from pytest_ortdiff.providers import unavailable_reason

    return unavailable_reason("CUDA") is None


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


@pytest.mark.skipif(_cuda_usable(), reason="CUDA is available here: nothing to report as unavailable")
def test_explicit_unavailable_provider_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest("--ort-providers=CPU,CUDA")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ort-providers: CUDAExecutionProvider * available: CPU*--ort-skip-unavailable*"])


@pytest.mark.skipif(_cuda_usable(), reason="CUDA is available here: nothing to skip")
def test_skip_unavailable_turns_the_error_into_named_skips(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest("--ort-providers=CPU,CUDA", "--ort-skip-unavailable", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*holes in the provider × dtype matrix*", "1 test(s) skipped: CUDAExecutionProvider not available; available: CPU*"])
    result.stdout.fnmatch_lines(["SKIPPED*CUDAExecutionProvider*"])


@pytest.mark.skipif(_cuda_usable(), reason="CUDA is available here: nothing to skip")
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
    from pytest_ortdiff.providers import available

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
    ],
)
def test_bad_marker_is_a_collection_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(test_bad=f"import pytest\n\n@pytest.mark.ortdiff({marker})\ndef test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])


def test_marker_without_fixture_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_nofix="import pytest\n\n@pytest.mark.ortdiff(dtypes=['float16'])\ndef test_a():\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*uses none of the fixtures ortdiff, ort_provider, ort_dtype*"])


def test_passing_check_and_summary_table(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_seed=SEED_TEST.format(marker="dtypes=['float32', 'float16']"))
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


def test_failing_check_prints_the_report(pytester: pytest.Pytester) -> None:
    # a budget of zero elements above 0 cannot hold between two float16 implementations of LayerNorm+MatMul
    pytester.makepyfile(test_seed=SEED_TEST.format(marker="dtypes=['float16'], budget={0.0: 0.0}"))
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


def test_per_dtype_tolerance(pytester: pytest.Pytester) -> None:
    # float16 gets a generous ULP limit, float32 an impossible exactness: only float32 fails
    pytester.makepyfile(test_seed=SEED_TEST.format(marker="dtypes=['float32', 'float16'], max_ulp={'float16': 64, 'float32': 0}, atol={'float16': 1.0}"))
    result = pytester.runpytest("-v")
    result.stdout.fnmatch_lines(["*test_lnmm[[]CPU-float32[]] FAILED*", "*test_lnmm[[]CPU-float16[]] PASSED*"])
    result.stdout.fnmatch_lines(["*max ULP error * exceeds max_ulp=0*"])


def test_bfloat16_hole_on_cpu_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_seed=SEED_TEST.format(marker="dtypes=['bfloat16']"))
    result = pytester.runpytest("-rs")
    # onnxruntime's CPU provider has no bfloat16 LayerNormalization/MatMul: the op is named
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*holes in the provider × dtype matrix*", "1 test(s) skipped: CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for *(*)"])


def test_reports_and_json(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_seed=SEED_TEST.format(marker="dtypes=['float32']"))
    result = pytester.runpytest("--ortdiff-reports", "--ortdiff-json=out/results.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- ortdiff reports -*", "test_seed.py::test_lnmm[[]CPU-float32[]] (passed; tolerance *)", "output 'Z'  float32[[]2x16x32[]]  n=1,024", "*wrote 1 result(s) to out*results.json"])
    data = json.loads((pytester.path / "out" / "results.json").read_text())
    (row,) = data["results"]
    assert row["test"] == "test_seed.py::test_lnmm[CPU-float32]"
    assert row["provider"] == "CPU" and row["dtype"] == "float32" and row["outcome"] == "passed"
    assert row["report"]["n"] == 1024
    assert row["max_abs"] == row["report"]["max_abs"] < 1e-3


def test_summary_under_xdist(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_seed=SEED_TEST.format(marker="dtypes=['float32', 'float16']"))
    result = pytester.runpytest("-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*= ortdiff summary =*"])
    result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CPU-float16[]] * passed"])
    result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CPU-float32[]] * passed"])


def test_plugin_import_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, pytest_ortdiff.plugin; print(any(m in sys.modules for m in ('torch', 'onnxruntime')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
