"""The `ortdiff`, `ort_provider` and `ort_dtype` fixtures, and `OrtDiff`: a Checker bound to one test item,
the only place where results become summary rows, skips and failures. Cheap to import: torch and
onnxruntime load when a check runs."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import pytest

from ..engine.check import (
    Checker,
    CheckFailed,
    Missing,
    OrtDiffDtypeWarning,
    Reference,
    Runtime,
    ToleranceLike,
    UnsupportedByProvider,
    missing_ops,
    ops_hint,
)
from ..numerics.results import CheckRow, SkipRow
from ..numerics.tolerance import Tolerance
from ..runtimes.providers import (
    ProviderOptions,
    normalize_provider_options,
    provider_options_in_force,
)
from .session import BASELINE_KEY, RESULT_KEY, SKIP_KEY

if TYPE_CHECKING:
    import torch

    from ..analyses.fuzz import FuzzResult
    from ..engine.baseline import BaselineOutcome
    from ..engine.blame import BlameTable
    from ..engine.reproducible import ReproducibilityReport
    from ..numerics.diff import DiffReport

__all__ = ["BASELINE_KEY", "OrtDiff", "OrtDiffDtypeWarning", "OrtDiffFailure", "_ortdiff_case", "ort_dtype", "ort_provider", "ortdiff"]


class OrtDiffFailure(CheckFailed):
    """A check failed in a test (tolerance broken, baseline drifted or missing, not reproducible): the
    message is the rendered report, `result` the typed result."""


class OrtDiff:
    """A Checker bound to one test case (provider × dtype) and its test item.

    - `run(model, feeds, runtime="ort"|"torch"|"float64")`: the outputs as torch tensors.
    - `compare(expected, got)`: a DiffReport with this test's thresholds and tolerance.
    - `check(model, feeds, *, tolerance=None)`: torch evaluator (expected) vs onnxruntime (got) on this
      provider; fails the test with the report when the tolerance is broken, returns the report otherwise.
    - `check_baseline(name, outputs)`: this run's outputs vs the stored baseline (bitwise by default).
    - `check_reproducible(model, feeds)`: repeated runs and varied threads / graph optimizations, bitwise.
    - `blame(model, feeds)`, `fuzz(build, ...)`.
    - `check_deployment(original, deployed, feeds)`: did a deployment step (optimizer, float16, quantization,
      int4, genai) move the numbers; the first divergence named.
    Every check adds its row to the run's summary; an op onnxruntime lacks at this dtype skips the test,
    naming the op.
    """

    def __init__(
        self, provider: str, dtype: str, tolerance: ToleranceLike = None, node: Any = None, blame_on_failure: bool = False, provider_options: Mapping[str, Any] | None = None
    ) -> None:
        self.checker = Checker(provider, dtype, tolerance=tolerance, provider_options=provider_options)
        self._node = node
        self.blame_on_failure = blame_on_failure
        self.reports: list[DiffReport] = []
        self._baseline_names: set[str] = set()
        #: set by check_reproducible; the plugin fails a `reproducible=True` test that never ran one
        self.reproducible_checked = False

    def __repr__(self) -> str:
        return f"OrtDiff(provider={self.provider!r}, dtype={self.dtype!r}, tolerance={self.tolerance.describe()!r})"

    @property
    def provider(self) -> str:
        return self.checker.provider

    @property
    def dtype(self) -> str:
        return self.checker.dtype

    @property
    def tolerance(self) -> Tolerance:
        return self.checker.tolerance

    @property
    def provider_options(self) -> dict[str, str]:
        """onnxruntime's options for this provider in this test (command line, ini, marker), e.g. {"use_tf32": "0"}."""
        return self.checker.provider_options

    @property
    def device(self) -> str:
        return self.checker.device

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.checker.torch_dtype

    # -- running -----------------------------------------------------------------------------
    def run(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        *,
        runtime: Runtime = "ort",
        output_names: Sequence[str] | None = None,
        kernels: Mapping[Any, Any] | None = None,
        missing: Missing = "error",
    ) -> list[torch.Tensor]:
        """Outputs of `model` on this provider: `runtime` is "ort" (onnxruntime), "torch" (the torch
        evaluator on the provider's device) or "float64" (the torch evaluator as float64 oracle).
        `kernels=` overrides the evaluator's kernels (see `TorchEvaluator`), e.g. `{("", "Hardmax"): "ort"}`
        for an op it has no kernel for; `missing="ort"` does that for every such op."""
        __tracebackhide__ = True
        try:
            return self.checker.run(model, feeds, runtime=runtime, output_names=output_names, kernels=kernels, missing=missing)
        except Exception as exc:
            self._raise(exc, f"ortdiff.run(model, feeds, runtime={runtime!r}, kernels={{...}})")

    def compare(self, expected: Any, got: Any, *, tolerance: ToleranceLike = None, names: Sequence[str] | None = None) -> DiffReport:
        """A DiffReport whose histogram includes this test's budget thresholds and allclose count (it asserts
        nothing: only `check` fails a test)."""
        return self.checker.compare(expected, got, tolerance=tolerance, names=names)

    def blame(self, model: Any, feeds: Mapping[str, Any], *, kernels: Mapping[Any, Any] | None = None, missing: Missing = "error") -> BlameTable:
        """The BlameTable of `model` on this provider: each node swapped to onnxruntime in turn."""
        __tracebackhide__ = True
        try:
            return self.checker.blame(model, feeds, kernels=kernels, missing=missing)
        except Exception as exc:
            self._raise(exc, "ortdiff.blame(model, feeds, kernels={...})")

    # -- judging -------------------------------------------------------------------------------
    def check(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        *,
        tolerance: ToleranceLike = None,
        reference: Reference = "torch",
        blame: bool | None = None,
        baseline: bool | str = False,
        reproducible: bool | Mapping[str, Any] | None = None,
        kernels: Mapping[Any, Any] | None = None,
        missing: Missing = "error",
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
        kernels=...)`: `{("", "Hardmax"): "ort"}` runs an op it has no kernel for with onnxruntime;
        `missing="ort"` runs every such op with onnxruntime, and the report and the summary row name them.
        The model must pass `onnx.checker` and every feed be a torch tensor or numpy array: both are
        checked before any runtime sees them. Integer and bool outputs compare exactly; the tolerance
        is for the floating ones. Returns the DiffReport of onnxruntime against the reference.
        """
        __tracebackhide__ = True
        use_blame = blame if blame is not None else self.blame_on_failure
        try:
            result = self.checker.check(model, feeds, tolerance=tolerance, reference=reference, kernels=kernels, missing=missing, blame=use_blame)
        except CheckFailed as exc:
            for j in exc.result.judgements:
                self.reports.append(j.report)
            self._record(*exc.result.rows())
            raise OrtDiffFailure(str(exc), exc.result) from None
        except Exception as exc:
            self._raise(exc, "ortdiff.check(model, feeds, kernels={...})")
        for j in result.judgements:
            self.reports.append(j.report)
        self._record(*result.rows())
        failures: list[str] = []
        if baseline:
            name = baseline if isinstance(baseline, str) else (result.model or "check")
            try:
                self.check_baseline(name, dict(result.outputs), reference_report=result.report)
            except OrtDiffFailure as exc:
                failures.append(str(exc))
        repro = self._marker_reproducible() if reproducible is None else reproducible
        if repro is True or isinstance(repro, Mapping):  # ({} asks for it too, with the defaults)
            try:
                args = dict(repro) if isinstance(repro, Mapping) else {}
                self.check_reproducible(model, feeds, **{"kernels": kernels, "missing": missing, **args})
            except OrtDiffFailure as exc:
                failures.append(str(exc))
        if failures:
            raise OrtDiffFailure("\n\n".join(failures), result)
        return result.report

    def _marker_reproducible(self) -> bool | Mapping[str, Any]:
        marker = self._node.get_closest_marker("ortdiff") if self._node is not None else None
        return marker.kwargs.get("reproducible", False) if marker is not None else False

    # -- baselines and reproducibility ---------------------------------------------------------
    def check_baseline(
        self,
        name: str,
        outputs: Any,
        *,
        tolerance: ToleranceLike = None,
        reference_report: DiffReport | None = None,
        max_elements: int | None = None,
    ) -> BaselineOutcome:
        """This run's `outputs` (tensor, list or dict) against the baseline `name` stored for this test id
        × provider × dtype; fails the test on drift, or when the baseline is missing or corrupted.

        Bitwise by default: any changed bit is drift (a baseline catches upgrades that move numbers);
        `tolerance=` accepts drift within it. `--ortdiff-update-baselines` writes missing, corrupted or
        drifted baselines and passes. Outputs above `max_elements` elements (ini
        `ortdiff_baseline_max_elements`, default 65536) are stored as a summary. Returns the
        `baseline.BaselineOutcome`.
        """
        __tracebackhide__ = True
        from ..engine.baseline import baseline_path, check_outputs, settings_for

        if self._node is None:
            raise RuntimeError("check_baseline needs the `ortdiff` fixture: the baseline is stored under the test's id")
        if not isinstance(name, str) or not name:
            raise ValueError(f"baseline name must be a non-empty string, got {name!r}")
        if name in self._baseline_names:
            raise ValueError(f"baseline name {name!r} is used twice in this test; give each check_baseline call its own name")
        check_outputs(f"check_baseline({name!r}, ...)", outputs)
        self._baseline_names.add(name)
        settings = settings_for(self._node)
        path = baseline_path(settings.directory, settings.test_name, name)
        try:
            outcome = self.checker.check_baseline(
                path,
                outputs,
                name=name,
                test=self._node.nodeid,
                update=settings.update,
                tolerance=tolerance,
                reference_report=reference_report,
                max_elements=max_elements if max_elements is not None else settings.max_elements,
            )
        except CheckFailed as exc:
            outcome = exc.result
        self._node.user_properties.append((BASELINE_KEY, outcome.row(name).to_dict()))
        row = self.checker.baseline_row(outcome, name)
        if row is not None:
            self._record(row)
        if not outcome.passed:
            raise OrtDiffFailure(outcome.message, outcome)
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
        missing: Missing = "error",
        threads: Sequence[int] | None = None,
    ) -> ReproducibilityReport:
        """Is `model` bitwise reproducible on this provider? The same session `runs` times, then varied
        intra-op threads (`threads`, default 1, 2 and the machine's cores) and graph optimization levels
        (`vary`), and on CUDA the torch evaluator with `torch.use_deterministic_algorithms` on and off;
        fails the test with the report (a histogram per differing variation) otherwise. Returns a
        `reproducible.ReproducibilityReport`."""
        __tracebackhide__ = True
        self.reproducible_checked = True
        try:
            report = self.checker.check_reproducible(
                model, feeds, runs=runs, vary=vary, torch_deterministic=torch_deterministic, session_options=session_options, kernels=kernels, missing=missing,
                threads=threads,
            )
        except CheckFailed as exc:
            report = exc.result
        except Exception as exc:
            self._raise(exc, "ortdiff.check_reproducible(model, feeds, kernels={...})")
        self._record(self.checker.reproducible_row(report))
        self.reports.append(report.worst())
        if not report.reproducible:
            raise OrtDiffFailure(report.render(), report)
        return report

    def fuzz(
        self,
        build: Any,
        *,
        dims: Any = None,
        regime: Any = "uniform",
        tolerance: ToleranceLike = None,
        kernels: Mapping[Any, Any] | None = None,
        missing: Missing = "error",
        max_examples: int | None = None,
    ) -> FuzzResult:
        """Hypothesis-driven check over shapes and values: the smallest failing case, or statistics.

        `build` is a builder (`models.layer_norm_matmul_add`, called with `dtype=self.dtype`) or a model;
        `dims` a strategy from `strategies.dims(...)` or bounds for it (`{"c": (1, 512)}`, each at least
        1 or the builder's declared low); `regime` a value regime name (`strategies.REGIMES`), a list of
        them, or a strategy over them; bad dims and regimes are errors before any example runs.
        Hypothesis runs the examples itself (so no fixture state is shared across examples and its
        function-scoped-fixture health check does not apply), shrinks a failure to the smallest dims and
        simplest values, and the failure report shows them with the seed and the histogram; hypothesis's
        database replays it first next time, and `print_blob` (profile `ortdiff-ci`) prints the
        `@reproduce_failure` line. Sessions and the evaluator are built once and reused by every example.
        Returns a `fuzz.FuzzResult` (`.examples`, `.max_abs`, `.max_ulp`, `.worst_dims`).
        """
        __tracebackhide__ = True
        from ..analyses.fuzz import fuzz

        try:
            result = fuzz(self.checker, build, dims=dims, regime=regime, tolerance=tolerance, kernels=kernels, missing=missing, max_examples=max_examples)
        except CheckFailed as exc:
            failed: FuzzResult = exc.result
            row = failed.row()
            if row is not None:
                self._record(row)
            raise OrtDiffFailure(str(exc), failed) from None
        except Exception as exc:
            self._raise(exc, "ortdiff.fuzz(build, kernels={...})")
        row = result.row()
        if row is not None:
            self._record(row)
        return result

    # -- checks built on other modules (precision, parity, align, dynamo): each inserts its methods below this line
    if TYPE_CHECKING:
        from ..analyses.precision.keep import ConversionCheck

    def check_half_precision(
        self, model: Any, feeds_iter: Any, *, budget: Mapping[float, float] | None = None, tolerance: ToleranceLike = None, keep_io_types: bool = True
    ) -> ConversionCheck:
        """The float32 `model` converted to this case's dtype, float16 or bfloat16 (the marker's dtypes decide
        which are tried), by onnxruntime's converter, run on this provider and in half-precision arithmetic
        against the float64 oracle on every feed dict of `feeds_iter` (`precision.check_conversion`). Fails
        the test with the range audit and the keep-in-float32 list that fixes it (`precision.keep_float32`)
        when `budget` (or `tolerance`, else this test's) is broken. A float32 or float64 case skips: it has no
        half type to convert to. Returns the `precision.ConversionCheck`."""
        __tracebackhide__ = True
        from ..analyses.precision.keep import check_conversion

        if self.dtype not in ("float16", "bfloat16"):
            pytest.skip(
                f"check_half_precision converts a float32 model to float16 or bfloat16; this case is {self.dtype}: "
                "put the half types in the marker, e.g. @pytest.mark.ortdiff(dtypes=['float16', 'bfloat16'])"
            )
        if budget is not None and tolerance is not None:
            raise ValueError("check_half_precision: pass budget= or tolerance=, not both")
        tol = self.checker.tolerance_for(Tolerance(budget=budget) if budget is not None else tolerance)
        try:
            verdict = check_conversion(model, feeds_iter, dtype=self.dtype, tolerance=tol, keep_io_types=keep_io_types, provider=self.provider)
        except Exception as exc:
            self._raise(exc, "ortdiff.check_half_precision(model, feeds_iter)")
        if verdict.worst.report is not None:
            self.reports.append(verdict.worst.report)
        self._record(*verdict.rows())
        if not verdict.passed:
            raise OrtDiffFailure(verdict.render(), verdict)
        return verdict

    if TYPE_CHECKING:
        from ..analyses.parity import Exporter, ExportParityReport

    def check_export(
        self,
        module: Any,
        args: Any,
        kwargs: Mapping[str, Any] | None = None,
        *,
        dynamic_shapes: Any = None,
        exporter: Exporter = "dynamo",
        opset: int | None = None,
        tolerance: ToleranceLike = None,
        custom_translation_table: Mapping[Any, Any] | None = None,
        export_options: Mapping[str, Any] | None = None,
    ) -> ExportParityReport:
        """`module` exported (`exporter="dynamo"` or `"torchscript"`) and run by onnxruntime on this provider,
        against the module in eager torch, module and floating inputs in this case's dtype
        (`parity.check_export`). Fails the test with the report when the tolerance (default: this test's)
        is broken: the first module scope whose output diverges, the first FX node (dynamo), a per-scope
        table in execution order. A module the exporter cannot export fails the test with the exporter's
        error (`parity.ExportFailed`). `custom_translation_table` (dynamo: torch op -> onnxscript function) and
        `export_options` (any other `torch.onnx.export` argument) go to the exporter. Returns the
        `parity.ExportParityReport`."""
        __tracebackhide__ = True
        from ..analyses.parity import ExportFailed, check_export

        tol = self.checker.tolerance_for(tolerance)
        try:
            report = check_export(
                module, args, kwargs, dynamic_shapes=dynamic_shapes, exporter=exporter, opset=opset, provider=self.provider, dtype=self.dtype,
                tolerance=tol, custom_translation_table=custom_translation_table, export_options=export_options,
            )
        except ExportFailed as exc:
            self._record(exc.row(self.provider, self.dtype, tol))
            raise
        except Exception as exc:
            self._raise(exc, "ortdiff.check_export(module, args)")
        self.reports.append(report.outputs)
        self._record(report.row())
        if not report.passed:
            raise OrtDiffFailure(report.render(), report)
        return report

    if TYPE_CHECKING:
        from ..analyses.dynamo import CompileCheck

    def check_compile(
        self,
        module: Any,
        args: Any,
        kwargs: Mapping[str, Any] | None = None,
        *,
        train_steps: int = 0,
        loss_fn: Any = None,
        optimizer: Any = None,
        tolerance: ToleranceLike = None,
        allow_fallback: bool = True,
        opset: int | None = None,
        custom_translation_table: Mapping[Any, Any] | None = None,
        fullgraph: bool = False,
        dynamic: bool | None = False,
    ) -> CompileCheck:
        """`module` under `torch.compile` with the onnxruntime backend (`dynamo.ort_backend`) on this provider,
        against eager, in this case's dtype: `ortdiff.check_compile(model, (x,), train_steps=3)`.

        Two deep copies of `module` (same weights); `train_steps=0` compares one forward under no_grad,
        `train_steps=N` N steps of `optimizer` (params -> Optimizer, default SGD lr=0.01) on `loss_fn(output)`
        (default: mean of squares of the outputs), losses, gradients and final parameters compared. Every
        graph's onnxruntime outputs are also compared per call with the same FX graph in eager. Fails the test
        with the per-step losses and the per-graph, per-call diff table; graphs the exporter cannot take run
        eagerly and are listed (`allow_fallback=False` fails on them); skips without onnxscript. Returns the
        `dynamo.CompileCheck`.
        """
        __tracebackhide__ = True
        from ..analyses.dynamo import ExportUnavailable, check_compile

        try:
            result = check_compile(
                module,
                args,
                kwargs,
                provider=self.provider,
                dtype=self.dtype,
                tolerance=self.checker.tolerance_for(tolerance),
                train_steps=train_steps,
                loss_fn=loss_fn,
                optimizer=optimizer,
                opset=opset,
                custom_translation_table=custom_translation_table,
                fullgraph=fullgraph,
                dynamic=dynamic,
                allow_fallback=allow_fallback,
            )
        except CheckFailed as exc:
            self._record(exc.result.row())
            raise OrtDiffFailure(str(exc), exc.result) from None
        except ExportUnavailable as exc:
            pytest.skip(str(exc))
        except Exception as exc:
            self._raise(exc, "ortdiff.check_compile(module, args)")
        self._record(result.row())
        return result

    if TYPE_CHECKING:
        from ..analyses.align import OptimizationReport

    def check_optimization(
        self,
        model: Any,
        feeds: Mapping[str, Any] | Sequence[Any],
        *,
        levels: Sequence[str] = ("disable", "basic", "extended", "all"),
        tolerance: ToleranceLike = None,
    ) -> OptimizationReport:
        """Which onnxruntime graph optimization level moves `model`'s outputs on this provider, and the fused
        node it produced: each level's outputs against the previous level's and the unoptimized ones, the two
        graphs aligned side by side (`align.check_optimization`). Fails the test with the report when a level
        moves the outputs beyond `tolerance` (default: this test's); returns the `align.OptimizationReport`."""
        __tracebackhide__ = True
        from ..analyses.align import check_optimization
        from ..engine.check import row_for
        from ..runtimes.ort import UnsupportedByProviderError

        tol = self.checker.tolerance_for(tolerance)
        try:
            report = check_optimization(model, feeds, provider=self.provider, levels=levels, tolerance=tol)
        except UnsupportedByProviderError as exc:
            self._raise(UnsupportedByProvider(self.provider, self.dtype, exc.op, str(exc)), "ortdiff.check_optimization(model, feeds)")
        except Exception as exc:
            self._raise(exc, "ortdiff.check_optimization(model, feeds)")
        worst = report.worst()
        self.reports.append(worst)
        culprit = report.culprit
        where = f"{culprit.level}: {culprit.culprit.describe()}" if culprit is not None and culprit.culprit is not None else None
        self._record(row_for(worst, tol, report.passed, provider=self.provider, dtype=self.dtype, suffix=" [optimization]", worst=where))
        if not report.passed:
            raise OrtDiffFailure(report.render(), report)
        return report

    if TYPE_CHECKING:
        from ..analyses.align import DeploymentReport

    def check_deployment(
        self,
        original: Any,
        deployed: Any,
        feeds: Any,
        *,
        tolerance: ToleranceLike = None,
        runtime: Literal["ort", "torch"] = "ort",
        session_options: Mapping[str, Any] | None = None,
        align: bool | None = None,
    ) -> DeploymentReport:
        """Did my deployment step move the numbers? `deployed` (the file onnxruntime's optimizer, float16 converter,
        quantizers or onnxruntime-genai's builder made from `original`) against `original` on this provider, output
        to output, judged by `tolerance` (default: this test's) in the narrower dtype of the two (a float16 model
        behind float32 I/O: float16). Fails the test with the report when the outputs moved beyond it: the
        histogram, the first divergence named (the deployed model's node, e.g. MatMulNBits, and its error) and the
        two graphs side by side around it (`align.check_deployment`). `feeds`: the deployed model's
        (`models.transformer_feeds`), each model taking its own inputs. Returns the `align.DeploymentReport`."""
        __tracebackhide__ = True
        from ..analyses.align import check_deployment

        spec = self.checker.tolerance_spec if tolerance is None else tolerance  # (resolved for the dtype judged in)
        try:
            report = check_deployment(original, deployed, feeds, provider=self.provider, tolerance=spec, runtime=runtime, session_options=session_options, align=align)
        except Exception as exc:
            self._raise(exc, "ortdiff.check_deployment(original, deployed, feeds)")
        self.reports.append(report.outputs)
        self._record(report.row(self.dtype))
        if not report.passed:
            raise OrtDiffFailure(report.render(), report)
        return report

    # -- results -> summary rows, skips, failures ---------------------------------------------------
    def _raise(self, exc: Exception, call: str) -> NoReturn:
        """An exception of the checker, as a test sees it: an op onnxruntime lacks at this dtype skips
        the test (a named hole in the matrix); an op the evaluator lacks says how to pass `kernels=` (or
        `missing="ort"`) through the fixture; anything else as it is."""
        __tracebackhide__ = True
        if isinstance(exc, UnsupportedByProvider):
            if self._node is not None:
                self._node.user_properties.append((SKIP_KEY, SkipRow(self.provider, self.dtype, exc.reason).to_dict()))
            pytest.skip(exc.reason)
        from ..runtimes.evaluator import MissingKernelError

        if isinstance(exc, MissingKernelError):
            raise _with_kernel_hint(exc, call) from None
        raise exc

    def _record(self, *rows: CheckRow) -> None:
        """Attach summary rows to the test's report. One row per (test, suffix): under @given a check runs
        once per example; keep the failing or the worst one, so the summary stays one line per test.
        The rows kept are also flat properties (`report.junit_properties`: `ortdiff.max_abs`, ...), as
        `record_property` adds them, for `--junitxml`; they replace those of the row they replace."""
        if self._node is None:
            return
        from ..numerics.report import junit_names, junit_properties

        props = self._node.user_properties
        kept = []
        for row in rows:
            data = row.to_dict()
            del data["test"]  # the session names the row after the report's node id
            for i, (key, old) in enumerate(props):
                if key == RESULT_KEY and old.get("suffix", "") == row.suffix:
                    if (not row.passed, row.max_abs or 0.0) >= (not old["passed"], old["max_abs"] or 0.0):
                        props[i] = (RESULT_KEY, data)
                        kept.append(row)
                    break
            else:
                props.append((RESULT_KEY, data))
                kept.append(row)
        flat = junit_properties(kept)
        # all of a replaced row's properties go, those the new row has no value for too (a blame table's)
        names = {name for name, _ in flat}.union(*(junit_names(row) for row in kept))
        props[:] = [(key, value) for key, value in props if key not in names] + flat


def _with_kernel_hint(exc: Exception, call: str) -> Exception:
    """The evaluator's MissingKernelError, plus the one call that runs the model in a test: the kernels=
    dict naming every op without a kernel, or missing="ort"."""
    ops = missing_ops(exc)
    fixed = call.replace("kernels={...}", f"kernels={ops_hint(ops)}") if ops else call
    fallback = call.replace("kernels={...}", "missing='ort'")
    new = copy.copy(exc)
    new.args = (f"{exc}; in a test: {fixed} (or {fallback})",)
    return new


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


#: the run's provider options (ini ortdiff_provider_options, then --ort-provider-options over it), set by the plugin
PROVIDER_OPTIONS = pytest.StashKey[ProviderOptions]()


@pytest.fixture
def ortdiff(request: pytest.FixtureRequest, ort_provider: str, ort_dtype: str) -> Iterator[OrtDiff]:
    """An `OrtDiff` bound to this test's provider and dtype, with the marker's tolerance. onnxruntime takes the
    provider options of the run and of the marker (the marker's win) in every session the test makes."""
    marker = request.node.get_closest_marker("ortdiff")
    tol = Tolerance.from_marker(marker.kwargs) if marker else Tolerance()
    options = dict(request.config.stash.get(PROVIDER_OPTIONS, {}).get(ort_provider, {}))
    if marker is not None and marker.kwargs.get("provider_options"):
        options.update(normalize_provider_options(marker.kwargs["provider_options"]).get(ort_provider, {}))
    checker = OrtDiff(
        ort_provider, ort_dtype, tol, node=request.node, blame_on_failure=bool(request.config.getoption("ortdiff_blame", False)), provider_options=options
    )
    with provider_options_in_force({ort_provider: options} if options else {}):
        yield checker
