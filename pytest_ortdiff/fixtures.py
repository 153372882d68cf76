"""The `ortdiff`, `ort_provider` and `ort_dtype` fixtures, and `OrtDiff`: the checker bound to one
(provider, dtype). Cheap to import: torch and onnxruntime load when a check runs."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from .dtypes import dtype_of
from .tolerance import Tolerance

if TYPE_CHECKING:
    from .diff import DiffReport

__all__ = ["BASELINE_KEY", "OrtDiff", "OrtDiffDtypeWarning", "OrtDiffFailure", "_ortdiff_case", "ort_dtype", "ort_provider", "ortdiff"]

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
    def run(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        runtime: str = "ort",
        output_names: Sequence[str] | None = None,
        *,
        kernels: Mapping[Any, Any] | None = None,
    ) -> list[Any]:
        """Outputs of `model` on this provider: `runtime` is "ort" (onnxruntime), "torch" (the torch
        evaluator on the provider's device) or "float64" (the torch evaluator as float64 oracle).
        `kernels=` overrides the evaluator's kernels (see `TorchEvaluator`), e.g. `{("", "Hardmax"): "ort"}`
        for an op it has no kernel for."""
        __tracebackhide__ = True
        from .runtimes.ort import load_model

        if runtime not in ("ort", "torch", "float64"):
            raise ValueError(f"runtime must be 'ort', 'torch' or 'float64', got {runtime!r}")
        if kernels and runtime == "ort":
            raise ValueError("kernels= applies to the torch evaluator (runtime='torch' or 'float64'), not to runtime='ort'")
        m = load_model(model)
        _check_feeds(m, feeds)
        digest = _check_model(m)
        hint = f"ortdiff.run(model, feeds, runtime={runtime!r}, kernels={{...}})"
        return self._run(m, digest, feeds, runtime, output_names, kernels, hint)

    def _run(self, m: Any, digest: str, feeds: Mapping[str, Any], runtime: str, output_names: Sequence[str] | None, kernels: Mapping[Any, Any] | None, hint: str) -> list[Any]:
        """`run` on a loaded, checked model whose feeds are checked."""
        __tracebackhide__ = True
        if runtime == "ort":
            from .runtimes.ort import OrtRunner, UnsupportedByProviderError

            try:
                return OrtRunner(m, provider=self.provider).run(output_names, feeds)
            except UnsupportedByProviderError as exc:
                self._skip_unsupported(exc)
        return _evaluator(m, self.device, runtime, kernels=kernels, digest=digest, hint=hint).run(output_names, feeds)

    def _skip_unsupported(self, exc: Any) -> None:
        from .providers import KNOWN

        reason = f"{self.provider}-{self.dtype}: onnxruntime {KNOWN.get(exc.provider, exc.provider)} has no {self.dtype} kernel for {exc.op}"
        if self._node is not None:
            self._node.user_properties.append((SKIP_KEY, {"provider": self.provider, "dtype": self.dtype, "reason": reason}))
        pytest.skip(reason)

    # -- judging -----------------------------------------------------------------------------
    def _tolerance(self, tolerance: Tolerance | Mapping[str, Any] | tuple[float, float] | None) -> Tolerance:
        if tolerance is None:
            return self.tolerance
        if isinstance(tolerance, Mapping):
            tolerance = Tolerance(**tolerance)
        elif isinstance(tolerance, tuple | list) and len(tolerance) == 2:
            tolerance = Tolerance(atol=tolerance[0], rtol=tolerance[1])  # (atol, rtol), as compare() takes
        elif not isinstance(tolerance, Tolerance):
            raise TypeError(
                f"tolerance must be a Tolerance, a dict of its arguments or an (atol, rtol) pair, got {tolerance!r}; "
                'e.g. tolerance=Tolerance(atol=1e-3, rtol=1e-3), {"budget": {1e-2: 0.001}} or (1e-3, 1e-3)'
            )
        return tolerance.for_dtype(self.dtype)

    def compare(self, expected: Any, got: Any, *, tolerance: Tolerance | Mapping[str, Any] | tuple[float, float] | None = None, names: Sequence[str] | None = None) -> DiffReport:
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
        tolerance: Tolerance | Mapping[str, Any] | tuple[float, float] | None = None,
        reference: str = "torch",
        blame: bool | None = None,
        baseline: bool | str = False,
        reproducible: bool | Mapping[str, Any] | None = None,
        kernels: Mapping[Any, Any] | None = None,
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
        `kernels=` overrides kernels of the torch evaluator (and of the oracle), as `TorchEvaluator(model,
        kernels=...)`: `{("", "Hardmax"): "ort"}` runs an op it has no kernel for with onnxruntime.
        The model must pass `onnx.checker` and every feed be a torch tensor or numpy array: both are
        checked before any runtime sees them. Integer and bool outputs compare exactly; the tolerance
        is for the floating ones.
        """
        __tracebackhide__ = True
        from .runtimes.ort import load_model

        if reference not in ("torch", "float64"):
            raise ValueError(f"reference must be 'torch' or 'float64', got {reference!r}")
        m = load_model(model)
        _check_feeds(m, feeds)
        digest = _check_model(m)
        _warn_other_dtype(m, self.dtype)
        names = [o.name for o in m.graph.output]
        hint = "ortdiff.check(model, feeds, kernels={...})"
        got = self._run(m, digest, feeds, "ort", None, None, hint)
        expected = self._run(m, digest, feeds, "torch", None, kernels, hint)
        tol = self._tolerance(tolerance)
        if reference == "torch":
            judged = [("torch evaluator vs onnxruntime", self.compare(expected, got, tolerance=tol, names=names), "")]
        else:
            oracle = [o.to(t.dtype) for o, t in zip(self._run(m, digest, feeds, "float64", None, kernels, hint), expected, strict=True)]
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
                lines.append(self.blame(m, feeds, kernels=kernels).render())
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
                args = dict(repro) if isinstance(repro, Mapping) else {}
                self.check_reproducible(m, feeds, **{"kernels": kernels, **args})
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
        tolerance: Tolerance | Mapping[str, Any] | tuple[float, float] | None = None,
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
        _check_outputs(f"check_baseline({name!r}, ...)", outputs)
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
        if comparison is not None:
            bitwise = Tolerance(atol=0.0, rtol=0.0)
            if comparison.report is not None:
                self._record(comparison.report, bitwise, outcome.passed, f" [baseline {name}]", describe=comparison.rule)
            else:  # no output comparable (shapes, dtypes or names changed): a row all the same
                why = next((o.note for o in comparison.outputs if o.status != "identical" and o.note), "no output comparable")
                from .diff import DiffReport

                self._record(DiffReport(name=name, differ=0), bitwise, outcome.passed, f" [baseline {name}]", describe=comparison.rule, worst=why)
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
        kernels: Mapping[Any, Any] | None = None,
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
            report = check_reproducible(model, feeds, provider=self.provider, runs=runs, vary=vary, torch_deterministic=torch_deterministic, session_options=session_options, kernels=kernels)
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
        tolerance: Tolerance | Mapping[str, Any] | tuple[float, float] | None = None,
        kernels: Mapping[Any, Any] | None = None,
        max_examples: int | None = None,
    ) -> dict[str, Any]:
        """Hypothesis-driven check over shapes and values: the smallest failing case, or statistics.

        `build` is a builder (`models.layer_norm_matmul_add`, called with `dtype=self.dtype`) or a model;
        `dims` a strategy from `strategies.dims(...)` or bounds for it (`{"c": (1, 512)}`, each at least
        1 or the builder's declared low); `regime` a value regime name (`strategies.REGIMES`), a list of
        them, or a strategy over them; bad dims and regimes are errors before any example runs.
        Hypothesis runs the examples itself (so no fixture state
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
        from .runtimes.evaluator import MissingKernelError, TorchEvaluator
        from .runtimes.ort import OrtRunner, UnsupportedByProviderError, load_model

        # dims a builder takes as arguments (hidden, heads, ...) change the graph itself: one model,
        # session and evaluator per distinct combination, built on first use and reused after
        build_dims = tuple(getattr(build, "build_dims", ())) if callable(build) else ()
        graphs: dict[tuple[tuple[str, int], ...], tuple[Any, list[str], Any, Any]] = {}

        def graph_for(values: Mapping[str, int]) -> tuple[Any, list[str], Any, Any]:
            key = tuple((k, int(values[k])) for k in build_dims if k in values)
            if key not in graphs:
                m = load_model(build(dtype=self.dtype, **dict(key))) if callable(build) else load_model(build)
                _check_model(m)
                try:
                    evaluator = TorchEvaluator(m, device=self.device, kernels=kernels, check_model=False)
                except MissingKernelError as exc:
                    raise _with_kernel_hint(exc, "ortdiff.fuzz(build, kernels={...})") from None
                graphs[key] = (m, [o.name for o in m.graph.output], OrtRunner(m, provider=self.provider), evaluator)
            return graphs[key]

        if isinstance(dims, st.SearchStrategy):
            dims_st = dims
        else:
            target = build if callable(build) else load_model(build)
            _check_fuzz_dims(target, dims)
            dims_st = strategies.dims(target, **dict(dims or {}))
        regime_st = _regime_strategy(regime)
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

    def _record(self, report: DiffReport, tol: Tolerance, passed: bool, suffix: str = "", describe: str | None = None, worst: str | None = None) -> None:
        from .report import worst_budget_line

        self.reports.append(report)
        if self._node is None:
            return
        row = {
            "provider": self.provider,
            "dtype": self.dtype,
            "suffix": suffix,
            # (no element compared, e.g. a baseline whose shape changed: no numbers, `worst` says why)
            "max_abs": report.max_abs if report.n or worst is None else None,
            "max_rel": report.max_rel if report.n or worst is None else None,
            "max_ulp": report.max_ulp if report.n or worst is None else None,
            "worst": worst or worst_budget_line(report, tol.budget),  # type: ignore[arg-type]
            "passed": passed,
            "tolerance": describe or tol.describe(),
            "report": report.to_dict(),
        }
        props = self._node.user_properties
        # one row per (test, suffix): under @given a check runs once per example; keep the failing or
        # the worst one, so the summary shows what matters and stays one line per test
        for i, (key, old) in enumerate(props):
            if key == RESULT_KEY and old.get("suffix") == suffix:
                if (not passed, report.max_abs) >= (not old["passed"], old["max_abs"] or 0.0):
                    props[i] = (RESULT_KEY, row)
                return
        props.append((RESULT_KEY, row))


_EVALUATORS: dict[tuple[Any, ...], Any] = {}


def _evaluator(model: Any, device: str, runtime: str, *, kernels: Mapping[Any, Any] | None = None, digest: str | None = None, hint: str = "ortdiff.check(model, feeds, kernels={...})") -> Any:
    """A TorchEvaluator per (model bytes, device, runtime, kernel overrides), reused across checks and
    examples: building one runs shape inference. A missing kernel's error says how to pass `kernels=`
    through the fixture (`hint`, the call to show)."""
    import torch

    from .runtimes.evaluator import MissingKernelError, TorchEvaluator
    from .runtimes.ort import load_model

    if digest is None:
        digest = _check_model(load_model(model))
    key = (digest, device, runtime, _kernels_key(kernels))
    ev = _EVALUATORS.get(key)
    if ev is None:
        if len(_EVALUATORS) >= 32:
            _EVALUATORS.pop(next(iter(_EVALUATORS)))
        try:
            ev = TorchEvaluator(load_model(model), device=device, kernels=kernels, compute_dtype=torch.float64 if runtime == "float64" else None, check_model=False)
        except MissingKernelError as exc:
            raise _with_kernel_hint(exc, hint) from None
        _EVALUATORS[key] = ev
    return ev


def _kernels_key(kernels: Mapping[Any, Any] | None) -> tuple[Any, ...] | None:
    """Kernel overrides as part of a cache key: op types, node names and value names as they are,
    callables by identity (the cached evaluator holds them, so an id is not reused while cached)."""
    if not kernels:
        return None

    def part(x: Any) -> Any:
        if isinstance(x, str) or (isinstance(x, tuple) and all(isinstance(i, str) for i in x)):
            return x
        return ("id", id(x), repr(x))

    return tuple((part(k), part(v)) for k, v in kernels.items())


def _with_kernel_hint(exc: Exception, call: str) -> Exception:
    """The evaluator's MissingKernelError, plus how to pass its suggested `kernels=` through the fixture."""
    import re

    message = str(exc)
    suggested = re.search(r"kernels=(\{.*\})\)\s*$", message)
    if suggested:
        call = call.replace("kernels={...}", f"kernels={suggested.group(1)}")
    return type(exc)(f"{message}; in a test: {call}")


_CHECKED: dict[str, str | None] = {}


def _check_model(m: Any) -> str:
    """Run onnx.checker on a ModelProto once per distinct model (by digest of its bytes), before any
    runtime sees it: onnxruntime's own error on an invalid graph is far less clear. Returns the digest."""
    __tracebackhide__ = True
    import hashlib

    import onnx

    digest = hashlib.sha1(m.SerializeToString()).hexdigest()
    if digest not in _CHECKED:
        if len(_CHECKED) >= 256:
            _CHECKED.pop(next(iter(_CHECKED)))
        try:
            onnx.checker.check_model(m)
            _CHECKED[digest] = None
        except onnx.checker.ValidationError as exc:
            problem = " ".join(line.strip() for line in str(exc).splitlines() if line.strip()).rstrip(".")
            _CHECKED[digest] = problem if len(problem) <= 500 else problem[:497] + "..."
    problem = _CHECKED[digest]
    if problem is not None:
        raise ValueError(f"the model fails onnx.checker: {problem}; fix the graph")
    return digest


class OrtDiffDtypeWarning(UserWarning):
    """The model checked in a case is not of the case's dtype."""


def _warn_other_dtype(m: Any, dtype: str) -> None:
    """A case whose model has floating inputs/outputs, none of them of the case's dtype: most likely a
    model built without dtype=ortdiff.dtype, judged under the wrong dtype's tolerance."""
    found = set()
    for v in [*m.graph.input, *m.graph.output]:
        elem = v.type.tensor_type.elem_type
        with contextlib.suppress(KeyError, ValueError):
            dt = dtype_of(elem)
            if dt.is_floating_point:
                found.add(dt.short)
    if found and dtype not in found:
        import warnings

        builder = _builder_name(m)
        example = f"models.{builder}(dtype=ortdiff.dtype)" if builder else "dtype=ortdiff.dtype in your model builder"
        warnings.warn(
            OrtDiffDtypeWarning(
                f"this case is {dtype}, but the model's floating inputs and outputs are {', '.join(sorted(found))}: "
                f"build it for the case, e.g. {example}"
            ),
            stacklevel=3,
        )


def _builder_name(m: Any) -> str | None:
    """The models.* builder that made `m` (None for other models)."""
    from .models.mlp import builder_info

    try:
        return builder_info(m)[0]
    except ValueError:
        return None


def _check_outputs(where: str, outputs: Any) -> None:
    """Outputs to store: tensors or arrays, or lists/tuples/dicts of them (before any file is touched)."""
    __tracebackhide__ = True
    import numpy as np
    import onnx
    import torch

    def one(x: Any) -> bool:
        return isinstance(x, torch.Tensor | np.ndarray | np.generic | onnx.TensorProto)

    values = list(outputs.values()) if isinstance(outputs, Mapping) else list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    bad = next((v for v in values if not one(v)), None)
    if bad is not None or not values:
        got = type(outputs).__name__ if bad is None or bad is outputs else f"a {type(outputs).__name__} holding a {type(bad).__name__}"
        raise TypeError(f"{where}: outputs must be a tensor or array, or a list/tuple/dict of them; got {got}")


def _check_feeds(m: Any, feeds: Any) -> None:
    """Every feed a tensor or an array, before onnxruntime or the evaluator turn a None or a list
    into an obscure error of their own."""
    __tracebackhide__ = True
    import numpy as np
    import onnx
    import torch

    if not isinstance(feeds, Mapping):
        raise TypeError(f"feeds must be a dict {{input name: tensor}}, got {type(feeds).__name__}")
    for name, value in feeds.items():
        if isinstance(value, torch.Tensor | np.ndarray | np.generic | onnx.TensorProto):
            continue
        if value is None:
            raise TypeError(f"feed {name!r} is None; pass a torch tensor or numpy array")
        kind = type(value).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        example = ""
        declared = next((i.type.tensor_type.elem_type for i in m.graph.input if i.name == name), None)
        if declared:
            with contextlib.suppress(KeyError, ValueError):  # an elem type torch has no dtype for
                example = f" (e.g. torch.tensor(value, dtype={dtype_of(declared).torch}))"
        raise TypeError(f"feed {name!r} is {article} {kind}; pass a torch tensor or numpy array{example}")


def _check_fuzz_dims(target: Any, dims: Any) -> None:
    """fuzz's dims bounds: each low at least 1 (a dim of 0 is an empty input, which onnxruntime rejects
    deep inside a run), or at least the low a builder declares for it (llama's `past` may be 0)."""
    if not dims:
        return
    if not isinstance(dims, Mapping):
        raise TypeError(f"ortdiff.fuzz: dims must be a dict {{name: (low, high) or value}} or a strategy from strategies.dims(), got {type(dims).__name__}")
    from .strategies import symbolic_dims

    is_builder = callable(target) and not hasattr(target, "graph")
    declared = dict(getattr(target, "dims", {}) or {}) if is_builder else {}
    known = set(declared) if is_builder else set(symbolic_dims(target))
    for name, bound in dims.items():
        if name not in known:
            continue  # strategies.dims lists the dims there are
        try:
            lo, hi = (int(bound), int(bound)) if isinstance(bound, int) else (int(bound[0]), int(bound[1]))
        except (TypeError, ValueError, IndexError):
            continue  # strategies.dims names the malformed bound
        floor = int(declared[name][0]) if name in declared else 1
        if lo >= floor:
            continue
        if name in declared:
            why = f"{getattr(target, '__name__', 'the builder')} declares {name!r} in {tuple(int(x) for x in declared[name])}"
            top = hi if hi >= floor else int(declared[name][1])
        else:
            why = "a dim of 0 makes an empty input"
            top = max(hi, floor)
        raise ValueError(f"ortdiff.fuzz: dims={{{name!r}: {bound!r}}}: {name!r} must be at least {floor} ({why}); use e.g. dims={{{name!r}: ({floor}, {top})}}")


def _regime_strategy(regime: Any) -> Any:
    """fuzz's `regime`: a name, a list of names (hypothesis picks among them) or a strategy; unknown
    names are an error up front, not inside a hypothesis failure."""
    from hypothesis import strategies as st

    from .strategies import REGIMES

    valid = f"valid: {', '.join(REGIMES)}"
    if isinstance(regime, st.SearchStrategy):
        return regime
    if isinstance(regime, str):
        if regime not in REGIMES:
            raise ValueError(f"ortdiff.fuzz: unknown regime {regime!r}; {valid}")
        return st.just(regime)
    if isinstance(regime, list | tuple):
        if not regime:
            raise ValueError(f"ortdiff.fuzz: regime={list(regime)!r} names no regime; {valid}")
        unknown = [r for r in regime if r not in REGIMES]
        if unknown:
            raise ValueError(f"ortdiff.fuzz: unknown regime(s) {unknown!r} in regime={list(regime)!r}; {valid}")
        return st.sampled_from(list(regime))
    raise TypeError(f"ortdiff.fuzz: regime must be a name, a list of names or a strategy, got {type(regime).__name__}; {valid}")


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
