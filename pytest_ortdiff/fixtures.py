"""The `ortdiff`, `ort_provider` and `ort_dtype` fixtures, and `OrtDiff`: the checker bound to one
(provider, dtype). Cheap to import: torch and onnxruntime load when a check runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from .dtypes import dtype_of
from .tolerance import Tolerance

if TYPE_CHECKING:
    from .diff import DiffReport

__all__ = ["BASELINE_KEY", "OrtDiff", "OrtDiffFailure", "_ortdiff_case", "ort_dtype", "ort_provider", "ortdiff"]

RESULT_KEY = "ortdiff"
SKIP_KEY = "ortdiff_skip"
BASELINE_KEY = "ortdiff_baseline"


class OrtDiffFailure(AssertionError):
    """A check broke its tolerance; the message is the rendered report."""


class OrtDiff:
    """Runs models on one (provider, dtype) and judges torch evaluator vs onnxruntime.

    - `run(model, feeds, runtime="ort"|"torch"|"float64")`: the outputs as torch tensors.
    - `compare(expected, got)`: a DiffReport with this test's thresholds and tolerance.
    - `check(model, feeds, *, tolerance=None)`: torch evaluator (expected) vs onnxruntime (got) on this
      provider; fails the test with the report when the tolerance is broken, returns the report otherwise.
    - `check_baseline(name, outputs)`: this run's outputs vs the stored baseline (bitwise by default).
    - `check_reproducible(model, feeds)`: repeated runs and varied threads / graph optimizations, bitwise.
    """

    def __init__(self, provider: str, dtype: str, tolerance: Tolerance | None = None, node: Any = None, blame_on_failure: bool = False) -> None:
        self.provider = provider
        self.dtype = dtype_of(dtype).short
        self.tolerance = (tolerance or Tolerance()).for_dtype(self.dtype)
        self._node = node
        self.blame_on_failure = blame_on_failure
        self.reports: list[DiffReport] = []
        self._baseline_names: set[str] = set()
        #: set by check_reproducible; the plugin fails a `reproducible=True` test that never ran one
        self.reproducible_checked = False

    def __repr__(self) -> str:
        return f"OrtDiff(provider={self.provider!r}, dtype={self.dtype!r}, tolerance={self.tolerance.describe()!r})"

    @property
    def device(self) -> str:
        from .providers import torch_device

        return torch_device(self.provider)

    @property
    def torch_dtype(self) -> Any:
        return dtype_of(self.dtype).torch

    # -- running -----------------------------------------------------------------------------
    def run(self, model: Any, feeds: Mapping[str, Any], runtime: str = "ort", output_names: Sequence[str] | None = None) -> list[Any]:
        """Outputs of `model` on this provider: `runtime` is "ort" (onnxruntime), "torch" (the torch
        evaluator on the provider's device) or "float64" (the torch evaluator as float64 oracle)."""
        if runtime == "ort":
            from .runtimes.ort import OrtRunner, UnsupportedByProviderError

            try:
                return OrtRunner(model, provider=self.provider).run(output_names, feeds)
            except UnsupportedByProviderError as exc:
                self._skip_unsupported(exc)
        if runtime in ("torch", "float64"):
            return _evaluator(model, self.device, runtime).run(output_names, feeds)
        raise ValueError(f"runtime must be 'ort', 'torch' or 'float64', got {runtime!r}")

    def _skip_unsupported(self, exc: Any) -> None:
        from .providers import KNOWN

        reason = f"{self.provider}-{self.dtype}: onnxruntime {KNOWN.get(exc.provider, exc.provider)} has no {self.dtype} kernel for {exc.op}"
        if self._node is not None:
            self._node.user_properties.append((SKIP_KEY, {"provider": self.provider, "dtype": self.dtype, "reason": reason}))
        pytest.skip(reason)

    # -- judging -----------------------------------------------------------------------------
    def _tolerance(self, tolerance: Tolerance | Mapping[str, Any] | None) -> Tolerance:
        if tolerance is None:
            return self.tolerance
        if isinstance(tolerance, Mapping):
            tolerance = Tolerance(**tolerance)
        return tolerance.for_dtype(self.dtype)

    def compare(self, expected: Any, got: Any, *, tolerance: Tolerance | Mapping[str, Any] | None = None, names: Sequence[str] | None = None) -> DiffReport:
        """A DiffReport whose histogram includes this test's budget thresholds and allclose count."""
        from .diff import DEFAULT_THRESHOLDS, compare

        tol = self._tolerance(tolerance)
        if names is not None and isinstance(expected, list | tuple):
            expected = dict(zip(names, expected, strict=True))
            got = dict(zip(names, got, strict=True))
        return compare(expected, got, thresholds=sorted(set(DEFAULT_THRESHOLDS) | set(tol.thresholds)), tolerance=tol.allclose)

    def blame(self, model: Any, feeds: Mapping[str, Any], *, kernels: Mapping[Any, Any] | None = None) -> Any:
        """The BlameTable of `model` on this provider: each node swapped to onnxruntime in turn."""
        from .blame import blame

        return blame(model, feeds, provider=self.provider, dtype=self.dtype, kernels=kernels, tolerance=self.tolerance)

    def check(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        *,
        tolerance: Tolerance | Mapping[str, Any] | None = None,
        reference: str = "torch",
        blame: bool | None = None,
        baseline: bool | str = False,
        reproducible: bool | Mapping[str, Any] | None = None,
    ) -> DiffReport:
        """Judge onnxruntime on this provider × dtype; fails the test with the report.

        `reference="torch"`: the torch evaluator is expected, onnxruntime got. `reference="float64"`: the
        float64 oracle (cast to the tested dtype) is expected, and onnxruntime and the torch evaluator are
        each judged against it; the report says which one is closer, in ULPs of the tested dtype.
        `blame=True` (or `--ortdiff-blame`) adds the blame table to a failure report.
        Once the tolerance holds: `baseline=True` (or a name; True names it after the graph) also checks
        onnxruntime's outputs against their stored baseline (`check_baseline`), and `reproducible=True`
        (default: the marker's `reproducible=`; a dict passes arguments) runs `check_reproducible`; the
        failures of both are reported together.
        """
        __tracebackhide__ = True
        from .runtimes.ort import load_model

        if reference not in ("torch", "float64"):
            raise ValueError(f"reference must be 'torch' or 'float64', got {reference!r}")
        m = load_model(model)
        names = [o.name for o in m.graph.output]
        got = self.run(m, feeds, runtime="ort")
        expected = self.run(m, feeds, runtime="torch")
        tol = self._tolerance(tolerance)
        if reference == "torch":
            judged = [("torch evaluator vs onnxruntime", self.compare(expected, got, tolerance=tol, names=names), "")]
        else:
            oracle = [o.to(t.dtype) for o, t in zip(self.run(m, feeds, runtime="float64"), expected, strict=True)]
            judged = [
                ("float64 oracle vs onnxruntime", self.compare(oracle, got, tolerance=tol, names=names), " [ort vs float64]"),
                ("float64 oracle vs torch evaluator", self.compare(oracle, expected, tolerance=tol, names=names), " [torch vs float64]"),
            ]
        lines: list[str] = []
        for title, report, suffix in judged:
            violations = tol.check(report)
            self._record(report, tol, not violations, suffix)
            if violations:
                lines.append(f"ortdiff: {title} {self.provider} {self.dtype}: tolerance broken ({tol.describe()})")
                lines += [f"  - {v}" for v in violations]
                lines.append(report.render())
        if reference == "float64":
            (_, r_ort, _), (_, r_torch, _) = judged
            closer = _closer(r_ort, r_torch)
            lines_ok = f"closer to the float64 oracle: {closer} (onnxruntime: max {r_ort.max_ulp:g} ulp, {r_ort.mismatches:,} elements off; torch: max {r_torch.max_ulp:g} ulp, {r_torch.mismatches:,} elements off)"
            if lines:
                lines.append(lines_ok)
        if lines:
            if blame if blame is not None else self.blame_on_failure:
                lines.append(self.blame(m, feeds).render())
            raise OrtDiffFailure("\n".join(lines))
        failures: list[str] = []
        if baseline:
            name = baseline if isinstance(baseline, str) else (m.graph.name or "check")
            try:
                self.check_baseline(name, dict(zip(names, got, strict=True)), reference_report=judged[0][1])
            except OrtDiffFailure as exc:
                failures.append(str(exc))
        repro = self._marker_reproducible() if reproducible is None else reproducible
        if repro:
            try:
                self.check_reproducible(m, feeds, **(dict(repro) if isinstance(repro, Mapping) else {}))
            except OrtDiffFailure as exc:
                failures.append(str(exc))
        if failures:
            raise OrtDiffFailure("\n\n".join(failures))
        return judged[0][1]

    def _marker_reproducible(self) -> bool | Mapping[str, Any]:
        marker = self._node.get_closest_marker("ortdiff") if self._node is not None else None
        return marker.kwargs.get("reproducible", False) if marker is not None else False

    # -- baselines and reproducibility ---------------------------------------------------------
    def check_baseline(
        self,
        name: str,
        outputs: Any,
        *,
        tolerance: Tolerance | Mapping[str, Any] | None = None,
        reference_report: DiffReport | None = None,
        max_elements: int | None = None,
    ) -> Any:
        """This run's `outputs` (tensor, list or dict) against the baseline `name` stored for this test id
        × provider × dtype; fails the test on drift, or when the baseline is missing or corrupted.

        Bitwise by default: any changed bit is drift (a baseline catches upgrades that move numbers);
        `tolerance=` accepts drift within it. `--ortdiff-update-baselines` writes missing, corrupted or
        drifted baselines and passes. Outputs above `max_elements` elements (ini
        `ortdiff_baseline_max_elements`, default 65536) are stored as a summary. Returns a
        `baseline.BaselineOutcome`.
        """
        __tracebackhide__ = True
        from .baseline import baseline_path, check_baseline, settings_for

        if self._node is None:
            raise RuntimeError("check_baseline needs the `ortdiff` fixture: the baseline is stored under the test's id")
        if not isinstance(name, str) or not name:
            raise ValueError(f"baseline name must be a non-empty string, got {name!r}")
        if name in self._baseline_names:
            raise ValueError(f"baseline name {name!r} is used twice in this test; give each check_baseline call its own name")
        self._baseline_names.add(name)
        settings = settings_for(self._node)
        path = baseline_path(settings.directory, settings.test_name, name)
        outcome = check_baseline(
            path,
            outputs,
            test=self._node.nodeid,
            provider=self.provider,
            dtype=self.dtype,
            name=name,
            update=settings.update,
            tolerance=tolerance,
            reference_report=reference_report,
            max_elements=max_elements if max_elements is not None else settings.max_elements,
        )
        self._node.user_properties.append((BASELINE_KEY, {"name": name, "action": outcome.action, "path": str(path), "passed": outcome.passed}))
        comparison = outcome.comparison
        if comparison is not None and comparison.report is not None:
            bitwise = Tolerance(atol=0.0, rtol=0.0)
            self._record(comparison.report, bitwise, outcome.passed, f" [baseline {name}]", describe=comparison.rule)
        if not outcome.passed:
            raise OrtDiffFailure(outcome.message)
        return outcome

    def check_reproducible(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        *,
        runs: int = 5,
        vary: Sequence[str] = ("threads", "graph_optimization"),
        torch_deterministic: bool | None = None,
        session_options: Mapping[str, Any] | None = None,
    ) -> Any:
        """Is `model` bitwise reproducible on this provider? The same session `runs` times, then varied
        intra-op threads and graph optimization levels (`vary`), and on CUDA the torch evaluator with
        `torch.use_deterministic_algorithms` on and off; fails the test with the report (a histogram per
        differing variation) otherwise. Returns a `reproducible.ReproducibilityReport`."""
        __tracebackhide__ = True
        from .reproducible import check_reproducible
        from .runtimes.ort import UnsupportedByProviderError

        self.reproducible_checked = True
        try:
            report = check_reproducible(model, feeds, provider=self.provider, runs=runs, vary=vary, torch_deterministic=torch_deterministic, session_options=session_options)
        except UnsupportedByProviderError as exc:
            self._skip_unsupported(exc)
        self._record(report.worst(), Tolerance(atol=0.0, rtol=0.0), report.reproducible, " [reproducible]", describe="bitwise")
        if not report.reproducible:
            raise OrtDiffFailure(report.render())
        return report

    def fuzz(
        self,
        build: Any,
        *,
        dims: Any = None,
        regime: Any = "uniform",
        tolerance: Tolerance | Mapping[str, Any] | None = None,
        kernels: Mapping[Any, Any] | None = None,
        max_examples: int | None = None,
    ) -> dict[str, Any]:
        """Hypothesis-driven check over shapes and values: the smallest failing case, or statistics.

        `build` is a builder (`models.layer_norm_matmul_add`, called with `dtype=self.dtype`) or a model;
        `dims` a strategy from `strategies.dims(...)` or bounds for it (`{"c": (1, 512)}`); `regime` a
        value regime name or a strategy over them. Hypothesis runs the examples itself (so no fixture state
        is shared across examples and its function-scoped-fixture health check does not apply), shrinks a
        failure to the smallest dims and simplest values, and the failure report shows them with the
        seed and the histogram; hypothesis's database replays it first next time, and `print_blob`
        (profile `ortdiff-ci`) prints the `@reproduce_failure` line. Sessions and the evaluator are
        built once and reused by every example.
        """
        __tracebackhide__ = True
        from hypothesis import given, settings
        from hypothesis import strategies as st

        from . import strategies
        from .runtimes.evaluator import TorchEvaluator
        from .runtimes.ort import OrtRunner, UnsupportedByProviderError, load_model

        # dims a builder takes as arguments (hidden, heads, ...) change the graph itself: one model,
        # session and evaluator per distinct combination, built on first use and reused after
        build_dims = tuple(getattr(build, "build_dims", ())) if callable(build) else ()
        graphs: dict[tuple[tuple[str, int], ...], tuple[Any, list[str], Any, Any]] = {}

        def graph_for(values: Mapping[str, int]) -> tuple[Any, list[str], Any, Any]:
            key = tuple((k, int(values[k])) for k in build_dims if k in values)
            if key not in graphs:
                m = load_model(build(dtype=self.dtype, **dict(key))) if callable(build) else load_model(build)
                graphs[key] = (
                    m,
                    [o.name for o in m.graph.output],
                    OrtRunner(m, provider=self.provider),
                    TorchEvaluator(m, device=self.device, kernels=kernels),
                )
            return graphs[key]

        if isinstance(dims, st.SearchStrategy):
            dims_st = dims
        else:
            dims_st = strategies.dims(build if callable(build) else load_model(build), **dict(dims or {}))
        regime_st = regime if isinstance(regime, st.SearchStrategy) else st.just(regime)
        tol = self._tolerance(tolerance)
        stats: dict[str, Any] = {"examples": 0, "max_abs": 0.0, "max_ulp": 0.0, "worst_dims": None}
        worst: list[DiffReport | None] = [None]

        class _Broken(AssertionError):
            def __init__(self, values: dict[str, int], reg: str, seed: int, report: DiffReport, violations: list[Any]) -> None:
                super().__init__(f"tolerance broken at dims={values} regime={reg!r} seed={seed}")
                self.values, self.regime, self.seed, self.report, self.violations = values, reg, seed, report, violations

        def one(values: dict[str, int], reg: str, seed: int) -> None:
            model, names, runner, evaluator = graph_for(values)
            feeds = strategies.make_feeds(model, values, reg, seed, device=self.device)
            try:
                got = runner.run(None, feeds)
            except UnsupportedByProviderError as exc:
                self._skip_unsupported(exc)
            expected = evaluator.run(None, feeds)
            report = self.compare(expected, got, tolerance=tol, names=names)
            stats["examples"] += 1
            if report.max_abs >= stats["max_abs"]:
                stats["max_abs"], stats["worst_dims"] = report.max_abs, dict(values)
                worst[0] = report
            stats["max_ulp"] = max(stats["max_ulp"], report.max_ulp)
            violations = tol.check(report)
            if violations:
                raise _Broken(values, reg, seed, report, violations)

        test = given(values=dims_st, reg=regime_st, seed=st.integers(0, 2**31 - 1))(one)
        # no deadline: an example that meets a new graph builds its session first (hundreds of ms);
        # the rest (examples, database, derandomize) follows the active hypothesis profile
        extra = {} if max_examples is None else {"max_examples": max_examples}
        test = settings(deadline=None, **extra)(test)
        try:
            test()
        except _Broken as exc:
            self._record(exc.report, tol, False, " [fuzz]")
            lines = [
                f"ortdiff.fuzz: torch evaluator vs onnxruntime {self.provider} {self.dtype}: tolerance broken ({tol.describe()})",
                f"  smallest failing case (shrunk by hypothesis): dims={exc.values} regime={exc.regime!r} seed={exc.seed}",
                f"  reproduce: {self._reproduce_line(build, build_dims, exc.values, exc.regime, exc.seed)}",
            ]
            lines += [f"  - {v}" for v in exc.violations]
            lines.append(exc.report.render())
            raise OrtDiffFailure("\n".join(lines)) from None
        if worst[0] is not None:
            self._record(worst[0], tol, True, " [fuzz]")
        return stats

    def _reproduce_line(self, build: Any, build_dims: Sequence[str], values: Mapping[str, int], regime: str, seed: int) -> str:
        """The two statements that rebuild a fuzz example's model and feeds."""
        args = "".join(f", {k}={values[k]}" for k in build_dims if k in values)
        name = getattr(build, "__name__", "build") if callable(build) else None
        model = f"model = models.{name}(dtype={self.dtype!r}{args}); " if name else ""
        return f"{model}feeds = strategies.make_feeds(model, {dict(values)}, {regime!r}, {seed})"

    def _record(self, report: DiffReport, tol: Tolerance, passed: bool, suffix: str = "", describe: str | None = None) -> None:
        from .report import worst_budget_line

        self.reports.append(report)
        if self._node is None:
            return
        row = {
            "provider": self.provider,
            "dtype": self.dtype,
            "suffix": suffix,
            "max_abs": report.max_abs,
            "max_rel": report.max_rel,
            "max_ulp": report.max_ulp,
            "worst": worst_budget_line(report, tol.budget),  # type: ignore[arg-type]
            "passed": passed,
            "tolerance": describe or tol.describe(),
            "report": report.to_dict(),
        }
        props = self._node.user_properties
        # one row per (test, suffix): under @given a check runs once per example; keep the failing or
        # the worst one, so the summary shows what matters and stays one line per test
        for i, (key, old) in enumerate(props):
            if key == RESULT_KEY and old.get("suffix") == suffix:
                if (not passed, report.max_abs) >= (not old["passed"], old["max_abs"]):
                    props[i] = (RESULT_KEY, row)
                return
        props.append((RESULT_KEY, row))


_EVALUATORS: dict[tuple[str, str, str], Any] = {}


def _evaluator(model: Any, device: str, runtime: str) -> Any:
    """A TorchEvaluator per (model bytes, device, runtime), reused across checks and examples: building
    one runs onnx.checker and shape inference."""
    import hashlib

    import torch

    from .runtimes.evaluator import TorchEvaluator
    from .runtimes.ort import load_model, model_bytes

    key = (hashlib.sha1(model_bytes(model)).hexdigest(), device, runtime)
    ev = _EVALUATORS.get(key)
    if ev is None:
        if len(_EVALUATORS) >= 32:
            _EVALUATORS.pop(next(iter(_EVALUATORS)))
        ev = TorchEvaluator(load_model(model), device=device, compute_dtype=torch.float64 if runtime == "float64" else None)
        _EVALUATORS[key] = ev
    return ev


def _closer(r_ort: DiffReport, r_torch: DiffReport) -> str:
    ko, kt = (r_ort.max_ulp, r_ort.mismatches), (r_torch.max_ulp, r_torch.mismatches)
    return "tie" if ko == kt else ("onnxruntime" if ko < kt else "torch evaluator")


@pytest.fixture
def _ortdiff_case(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(provider, dtype) of this test case; the plugin parametrizes it (indirectly) for every test that
    uses any of the ortdiff fixtures, so ids read `[CPU-float16]` whichever of them a test asks for."""
    return getattr(request, "param", ("CPU", "float32"))


@pytest.fixture
def ort_provider(_ortdiff_case: tuple[str, str]) -> str:
    """The provider of this test case (CPU, CUDA, ...), from `--ort-providers` × the ortdiff marker."""
    return _ortdiff_case[0]


@pytest.fixture
def ort_dtype(_ortdiff_case: tuple[str, str]) -> str:
    """The dtype of this test case (float32, float16, ...), from `--ort-dtypes` × the ortdiff marker."""
    return _ortdiff_case[1]


@pytest.fixture
def ortdiff(request: pytest.FixtureRequest, ort_provider: str, ort_dtype: str) -> OrtDiff:
    """An `OrtDiff` bound to this test's provider and dtype, with the marker's tolerance."""
    marker = request.node.get_closest_marker("ortdiff")
    tol = Tolerance.from_marker(marker.kwargs) if marker else Tolerance()
    return OrtDiff(ort_provider, ort_dtype, tol, node=request.node, blame_on_failure=bool(request.config.getoption("ortdiff_blame", False)))
