"""Checker: the engine behind the `ortdiff` fixture and the command line, without pytest. It runs a model on
one (provider, dtype) through onnxruntime, the torch evaluator and the float64 oracle and judges them,
returning typed results and raising domain exceptions that the fixture turns into failures and skips."""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ..numerics.dtypes import dtype_of
from ..numerics.results import CheckRow, closer_to_oracle
from ..numerics.tolerance import Tolerance, Violation
from ..runtimes.model_io import (
    CheckedModel,
    check_feeds,
    check_model,
    compute_dtype,
    load_model,
    model_path,
)
from ..runtimes.providers import (
    KNOWN,
    option_values,
    parse_provider,
    provider_options_in_force,
    tf32_in_play,
    tf32_line,
    torch_device,
)
from ..runtimes.selection import ResidentGrowth, trim_cache

if TYPE_CHECKING:
    import torch

    from ..numerics.diff import DiffReport
    from ..runtimes.evaluator import MissingKernelError, TorchEvaluator
    from .baseline import BaselineOutcome
    from .blame import BlameTable
    from .reproducible import ReproducibilityReport

__all__ = [
    "MISSING",
    "REFERENCES",
    "RUNTIMES",
    "BaselineFailed",
    "CheckFailed",
    "CheckResult",
    "Checker",
    "Judgement",
    "MissingKernel",
    "NotReproducible",
    "NothingCompared",
    "OrtDiffDtypeWarning",
    "OrtRunError",
    "ToleranceBroken",
    "ToleranceLike",
    "UnsupportedByProvider",
    "ops_hint",
    "row_for",
]

Runtime = Literal["ort", "torch", "float64"]
Reference = Literal["torch", "float64"]
Missing = Literal["error", "ort"]
RUNTIMES: tuple[Runtime, ...] = ("ort", "torch", "float64")
REFERENCES: tuple[Reference, ...] = ("torch", "float64")
MISSING: tuple[Missing, ...] = ("error", "ort")
#: what `tolerance=` takes: a Tolerance, a dict of its arguments, or an (atol, rtol) pair as compare() takes
ToleranceLike: TypeAlias = "Tolerance | Mapping[str, Any] | tuple[float, float] | None"
BITWISE = Tolerance(atol=0.0, rtol=0.0)


# ------------------------------------------------------------------------------------------------
# domain exceptions


class CheckFailed(AssertionError):
    """A check's verdict is negative: the message is the rendered report, `result` the typed result."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class ToleranceBroken(CheckFailed):
    """onnxruntime and the reference differ by more than the tolerance allows (`result`: a CheckResult,
    or a fuzz.FuzzResult holding the smallest failing case)."""


class NothingCompared(ToleranceBroken):
    """Every output was empty (a feed with a dim of 0): the check compared 0 elements, which is not a pass
    (`result`: the CheckResult, whose judgements carry the violation naming the outputs and the empty feeds)."""


class BaselineFailed(CheckFailed):
    """Outputs drifted from their stored baseline, or the baseline is missing or corrupted (`result`: the
    baseline.BaselineOutcome)."""


class NotReproducible(CheckFailed):
    """Repeated or varied runs are not bitwise identical (`result`: the reproducible.ReproducibilityReport)."""


class UnsupportedByProvider(Exception):
    """onnxruntime has no kernel for `op` at `dtype` on `provider`: a hole in the provider × dtype matrix,
    not a numerical failure. `reason` is the sentence a skip shows."""

    def __init__(self, provider: str, dtype: str, op: str, detail: str = "") -> None:
        self.provider = provider
        self.dtype = dtype
        self.op = op
        self.detail = detail
        self.reason = f"{provider}-{dtype}: onnxruntime {KNOWN.get(provider, provider)} has no {dtype} kernel for {op}"
        super().__init__(self.reason)


class OrtRunError(RuntimeError):
    """onnxruntime refused the model or failed while running it: `detail` is the first line of its message
    (what a person reads), `full` all of it."""

    def __init__(self, provider: str, detail: str, full: str = "") -> None:
        self.provider = provider
        self.detail = detail
        self.full = full or detail
        super().__init__(f"onnxruntime {KNOWN.get(provider, provider)} cannot run the model: {detail}")


class OrtDiffDtypeWarning(UserWarning):
    """The model checked in a case is not of the case's dtype."""


def __getattr__(name: str) -> Any:
    # MissingKernel is the evaluator's MissingKernelError; importing it here would load torch with this module
    if name == "MissingKernel":
        from ..runtimes.evaluator import MissingKernelError

        return MissingKernelError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    MissingKernel = MissingKernelError


# ------------------------------------------------------------------------------------------------
# typed results


@dataclass(frozen=True)
class Judgement:
    """One comparison of a check: `title` ("torch evaluator vs onnxruntime"), its DiffReport, the rules
    it breaks, and the suffix of its summary row (" [ort vs float64]")."""

    title: str
    report: DiffReport
    violations: tuple[Violation, ...]
    suffix: str = ""

    @property
    def passed(self) -> bool:
        return not self.violations


@dataclass(frozen=True)
class CheckResult:
    """What `Checker.check` found: one Judgement (torch evaluator vs onnxruntime), or two against the
    float64 oracle with the verdict of which runtime is closer to it; the ops the evaluator ran on
    onnxruntime for lack of a kernel; onnxruntime's outputs by name; the blame table when asked for."""

    provider: str
    dtype: str
    tolerance: Tolerance
    reference: Reference
    judgements: tuple[Judgement, ...]
    outputs: Mapping[str, Any] = field(default_factory=dict, repr=False)
    ran_on_ort: tuple[str, ...] = ()
    closer: Literal["onnxruntime", "torch", "tie"] | None = None
    blame: BlameTable | None = None
    model: str = ""
    #: outputs of a floating dtype the diff has no rules for (float8), compared as float32: "y float8_e4m3fn"
    widened: tuple[str, ...] = ()
    #: lines the report adds, one short line each: what the gate did to accept the model (CheckedModel.notes),
    #: how onnxruntime ran it (an IR version read as an older one; TF32 in play on a CUDA float32 failure)
    notes: tuple[str, ...] = ()
    #: those of `notes` the summary row carries too: the gate's (a row's cell is no place for paragraphs)
    row_notes: tuple[str, ...] = ()
    #: why the blame table asked for is not there (blame itself failed): the report comes all the same
    blame_error: str | None = None
    #: the dtype the outputs were judged in when not the case's: the half type a model computes in behind
    #: float32 inputs and outputs (onnxruntime's float16 converter's keep_io_types=True)
    judged_dtype: str | None = None

    @property
    def dtype_label(self) -> str:
        """"float16" or, judged in the model's compute dtype, "float16 (float32 inputs and outputs)"."""
        if self.judged_dtype is None or self.judged_dtype == self.dtype:
            return self.dtype
        return f"{self.judged_dtype} (its compute dtype, behind {self.dtype} inputs and outputs)"

    @property
    def passed(self) -> bool:
        return all(j.passed for j in self.judgements)

    @property
    def report(self) -> DiffReport:
        """The first judgement's report: onnxruntime against the reference."""
        return self.judgements[0].report

    @property
    def violations(self) -> tuple[Violation, ...]:
        return tuple(v for j in self.judgements for v in j.violations)

    def closer_line(self) -> str | None:
        """"closer to the float64 oracle: onnxruntime (onnxruntime: max 1 ulp, 3 elements off; torch: ...)"."""
        if self.closer is None or len(self.judgements) < 2:
            return None
        r_ort, r_torch = self.judgements[0].report, self.judgements[1].report
        who = "torch evaluator" if self.closer == "torch" else self.closer
        return (
            f"closer to the float64 oracle: {who} (onnxruntime: max {r_ort.max_ulp_floored:g} ulp, {r_ort.mismatches:,} elements off; "
            f"torch: max {r_torch.max_ulp_floored:g} ulp, {r_torch.mismatches:,} elements off; ULPs at the output's scale)"
        )

    def ran_on_ort_line(self) -> str | None:
        return f"ran on onnxruntime (no torch kernel): {', '.join(self.ran_on_ort)}" if self.ran_on_ort else None

    def render(self) -> str:
        """The failure report: per broken judgement its headline, violations and histogram; then which
        runtime is closer to the oracle, the ops run on onnxruntime for lack of a kernel, the blame table."""
        lines: list[str] = []
        for j in self.judgements:
            if j.passed:
                continue
            if not j.report.n:  # (a histogram of nothing would only look like a pass)
                lines.append(f"ortdiff: {j.title} {self.provider} {self.dtype_label}: compared 0 elements, not a pass")
                lines += [f"  - {v}" for v in j.violations]
                continue
            if any(v.rule == "empty" for v in j.violations):  # (every node on onnxruntime: its histogram is of itself)
                lines.append(f"ortdiff: {j.title} {self.provider} {self.dtype_label}: onnxruntime compared with itself, not a pass")
                lines += [f"  - {v}" for v in j.violations if v.rule == "empty"]
                continue
            lines.append(f"ortdiff: {j.title} {self.provider} {self.dtype_label}: tolerance broken ({self.tolerance.describe()})")
            lines += [f"  - {v}" for v in j.violations]
            lines.append(j.report.render())
        if not lines:
            lines.append(f"ortdiff: {self.judgements[0].title} {self.provider} {self.dtype_label}: passed ({self.tolerance.describe()})")
            lines.append(self.report.render())
        empty = [_described(o) for o in _outputs_of(self.report) if not o.n] if self.report.n else []
        extra = [
            f"compared as the float32 values they hold (each value of theirs is one): {', '.join(self.widened)}" if self.widened else None,
            f"empty in both runtimes (shapes compared, no values): {', '.join(empty)}" if empty else None,
            self.closer_line() if not self.passed else None,
            self.ran_on_ort_line(),
            *(f"note: {n}" for n in self.notes),
            self.blame.render() if self.blame is not None else None,
            f"blame failed, no table: {self.blame_error}" if self.blame_error else None,
        ]
        lines += [x for x in extra if x]
        return "\n".join(lines)

    def rows(self) -> tuple[CheckRow, ...]:
        """The summary rows of this check: one per judgement; the first that failed carries the blame table,
        if any (its top rows: `BlameTable.TOP`; with reference="float64", `[ort vs float64]` may have passed
        where `[torch vs float64]` failed)."""
        rows = [
            row_for(
                j.report, self.tolerance, j.passed, provider=self.provider, dtype=self.dtype, suffix=j.suffix, ran_on_ort=self.ran_on_ort, notes=self.row_notes,
                worst=None if j.report.n else "; ".join(str(v) for v in j.violations) or None,
            )
            for j in self.judgements
        ]
        if self.blame is not None and rows:
            at = next((i for i, j in enumerate(self.judgements) if not j.passed), 0)
            rows[at] = replace(rows[at], blame=self.blame.to_dict(top=self.blame.TOP))
        return tuple(rows)


def row_for(
    report: DiffReport,
    tolerance: Tolerance,
    passed: bool,
    *,
    provider: str,
    dtype: str,
    suffix: str = "",
    describe: str | None = None,
    worst: str | None = None,
    ran_on_ort: tuple[str, ...] = (),
    notes: tuple[str, ...] = (),
) -> CheckRow:
    """A summary row for one DiffReport judged by `tolerance`. Its worst line says where the report stands
    against each rule the tolerance states (`report.worst_line`); `worst` replaces it (and the numbers,
    when nothing was compared: a baseline whose shapes changed says why instead)."""
    from ..numerics.report import worst_line

    blank = not report.n and worst is not None
    return CheckRow(
        test="",
        provider=provider,
        dtype=dtype,
        max_abs=None if blank else report.max_abs,
        max_rel=None if blank else report.max_rel,
        max_ulp=None if blank else report.max_ulp,
        worst=worst or worst_line(report, tolerance),
        passed=passed,
        tolerance=describe or tolerance.describe(),
        report=report.to_dict(),
        suffix=suffix,
        ran_on_ort=ran_on_ort,
        notes=notes,
    )


def ops_hint(ops: Sequence[str]) -> str:
    """The kernels= dict that runs `ops` ("Conv", "com.microsoft::FusedMatMul") on onnxruntime."""
    pairs = []
    for op in ops:
        domain, _, name = op.rpartition("::")
        pairs.append(f"({domain!r}, {name!r}): 'ort'")
    return "{" + ", ".join(pairs) + "}"


def missing_ops(exc: BaseException) -> tuple[str, ...]:
    """The ops a MissingKernelError names: its `ops`, else parsed from its message ("no torch kernel for
    Hardmax (opset 18), com.microsoft::QuickGelu (opset 1); ...")."""
    ops = getattr(exc, "ops", None)
    if ops:
        return tuple(str(op) for op in ops)
    head = str(exc).split(";")[0].removeprefix("no torch kernel for ")
    return tuple(dict.fromkeys(re.sub(r"\s*\(opset \d+\)", "", part).strip() for part in head.split(", ") if part.strip()))


# ------------------------------------------------------------------------------------------------
# the checker


class Checker:
    """Runs models on one (provider, dtype) and judges onnxruntime against the torch evaluator (or the
    float64 oracle).

    - `run(model, feeds, runtime="ort"|"torch"|"float64")`: the outputs as torch tensors; `oracle(...)`
      is the float64 one.
    - `compare(expected, got)`: a DiffReport with the histogram thresholds of the tolerance.
    - `check(model, feeds)`: a CheckResult, or ToleranceBroken carrying it.
    - `blame(model, feeds)`: the BlameTable; `check_baseline(path, outputs, ...)`: a BaselineOutcome or
      BaselineFailed; `check_reproducible(model, feeds)`: a ReproducibilityReport or NotReproducible.

    An op onnxruntime lacks at this dtype raises UnsupportedByProvider; an op the evaluator lacks,
    MissingKernelError (unless `missing="ort"`); onnxruntime refusing the model, OrtRunError.
    """

    def __init__(self, provider: str, dtype: str, *, tolerance: ToleranceLike = None, provider_options: Mapping[str, Any] | None = None) -> None:
        self.provider = parse_provider(provider)
        self.dtype = dtype_of(dtype).short
        self._tolerance_spec = _as_tolerance(tolerance)  # (unresolved: a model computing in another dtype is judged in it)
        self.tolerance = self._tolerance_spec.for_dtype(self.dtype)
        #: onnxruntime's options for this provider, as deployed (e.g. {"use_tf32": 0} on CUDA): every session
        #: this checker makes takes them (blame's, reproducible's, the evaluator's "ort" kernels' too)
        self.provider_options = option_values(self.provider, provider_options or {}, "Checker(provider_options=...)")

    def __repr__(self) -> str:
        options = f", provider_options={self.provider_options!r}" if self.provider_options else ""
        return f"Checker(provider={self.provider!r}, dtype={self.dtype!r}, tolerance={self.tolerance.describe()!r}{options})"

    def options_in_force(self) -> contextlib.AbstractContextManager[None]:
        """A context in which every onnxruntime session made for this provider takes this checker's options."""
        return provider_options_in_force({self.provider: self.provider_options} if self.provider_options else {})

    @property
    def device(self) -> str:
        """The torch device next to this provider ("cpu", "cuda")."""
        return torch_device(self.provider)

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_of(self.dtype).torch

    @property
    def tolerance_spec(self) -> Tolerance:
        """The tolerance as given (per-dtype rules and defaults unresolved): what a check resolves for the dtype
        it judges in (a float16 model behind float32 I/O in a float32 case: float16)."""
        return self._tolerance_spec

    def tolerance_for(self, tolerance: ToleranceLike = None, *, dtype: str | None = None) -> Tolerance:
        """`tolerance` resolved for this dtype (or `dtype`); this checker's own when None."""
        if tolerance is None:
            return self.tolerance if dtype in (None, self.dtype) else self._tolerance_spec.for_dtype(dtype)
        return _as_tolerance(tolerance).for_dtype(dtype or self.dtype)

    def judged_dtype(self, model: Any) -> str:
        """The dtype a check of `model` judges outputs in: this case's, or the half type the model computes in
        behind wider inputs and outputs (`model_io.compute_dtype`: onnxruntime's float16 converter with
        `keep_io_types=True`), whose rounding a float32 tolerance would call a failure."""
        m = model.proto if isinstance(model, CheckedModel) else load_model(model)
        return compute_dtype(m) or self.dtype

    # -- running -------------------------------------------------------------------------------
    def prepare(self, model: Any, feeds: Any) -> CheckedModel:
        """`model` loaded and passed through onnx.checker, `feeds` checked against its inputs: before any
        runtime sees them."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        if isinstance(model, CheckedModel):  # (checked already: the command line's model)
            check_feeds(model.proto, feeds)
            return model
        m = load_model(model)
        check_feeds(m, feeds)
        return check_model(m, path=model_path(model))  # (a model above 2 GB is checked, and run, from its file)

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
        """Outputs of `model` on this provider: `runtime` "ort" (onnxruntime), "torch" (the torch evaluator
        on the provider's device) or "float64" (the evaluator as float64 oracle). `kernels=` overrides the
        evaluator's kernels (see TorchEvaluator); `missing="ort"` runs every op it has no kernel for on
        onnxruntime."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be 'ort', 'torch' or 'float64', got {runtime!r}")
        if kernels and runtime == "ort":
            raise ValueError("kernels= applies to the torch evaluator (runtime='torch' or 'float64'), not to runtime='ort'")
        _check_missing(missing)
        checked = self.prepare(model, feeds)
        if runtime == "ort":
            return self.run_ort(checked, feeds, output_names)
        with self.options_in_force():
            return list(self.evaluator(checked, runtime=runtime, kernels=kernels, missing=missing).run(output_names, feeds))

    def effective_options(self) -> dict[str, str]:
        """The options onnxruntime's sessions for this provider take now: those in force, this checker's over them."""
        from ..runtimes.providers import options_in_force

        return {**options_in_force(self.provider), **self.provider_options}

    def oracle(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        *,
        output_names: Sequence[str] | None = None,
        kernels: Mapping[Any, Any] | None = None,
        missing: Missing = "error",
    ) -> list[torch.Tensor]:
        """The float64 oracle's outputs (floating ones in float64)."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        return self.run(model, feeds, runtime="float64", output_names=output_names, kernels=kernels, missing=missing)

    def run_ort(self, model: CheckedModel, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> list[torch.Tensor]:
        """onnxruntime's outputs for a checked model (sessions are cached per model, provider and options)."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        return self._run_ort(model, feeds, output_names)[0]

    def _run_ort(self, model: CheckedModel, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None) -> tuple[list[torch.Tensor], tuple[str, ...]]:
        """onnxruntime's outputs, and the notes a report adds about how it ran them."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        from ..runtimes.ort import OrtRunner, UnsupportedByProviderError

        try:
            with self.options_in_force():
                runner = OrtRunner(model.source or model.proto, provider=self.provider)
                outputs = runner.run(output_names, feeds)
            return outputs, runner.notes
        except UnsupportedByProviderError as exc:
            raise UnsupportedByProvider(self.provider, self.dtype, exc.op, str(exc)) from None
        except Exception as exc:
            if not _from_onnxruntime(exc):
                raise
            text = str(exc).strip()
            raise OrtRunError(self.provider, text.splitlines()[0] if text else type(exc).__name__, text) from None

    def evaluator(self, model: CheckedModel, *, runtime: Runtime = "torch", kernels: Mapping[Any, Any] | None = None, missing: Missing = "error") -> TorchEvaluator:
        """The torch evaluator (runtime "torch") or the float64 oracle ("float64") of a checked model on
        this provider's device, cached per (model, device, runtime, kernel overrides, missing): building
        one runs shape inference."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        import torch

        from ..runtimes.evaluator import TorchEvaluator

        # (its "ort" kernels keep the sessions they make: one evaluator per provider options)
        key = (model.digest, self.device, runtime, _kernels_key(kernels), missing, tuple(sorted(self.effective_options().items())))
        cached = _EVALUATORS.get(key)
        if cached is not None:
            _EVALUATORS.move_to_end(key)
            return cached[0]
        extra: dict[str, Any] = {"missing": missing} if missing != "error" else {}  # the evaluator's default
        grown = ResidentGrowth()
        ev = TorchEvaluator(
            model.proto, device=self.device, kernels=kernels, compute_dtype=torch.float64 if runtime == "float64" else None, check_model=False, **extra
        )
        # charged what it holds: the model's proto, and its weights decoded into tensors (float64 copies for the
        # oracle): what building it made resident, at least their size
        decoded = model.nbytes * (2 if runtime == "float64" else 1)
        _EVALUATORS[key] = (ev, model.nbytes + max(decoded, grown.stop()))
        trim_cache(_EVALUATORS)
        return ev

    # -- judging -------------------------------------------------------------------------------
    def compare(self, expected: Any, got: Any, *, tolerance: ToleranceLike = None, names: Sequence[str] | None = None) -> DiffReport:
        """A DiffReport whose histogram includes the tolerance's budget thresholds and allclose count."""
        from ..numerics.diff import DEFAULT_THRESHOLDS, compare

        tol = self.tolerance_for(tolerance)
        if names is not None and isinstance(expected, list | tuple):
            expected = dict(zip(names, expected, strict=True))
            got = dict(zip(names, got, strict=True))
        return compare(expected, got, thresholds=sorted(set(DEFAULT_THRESHOLDS) | set(tol.thresholds)), tolerance=tol.allclose)

    def check(
        self,
        model: Any,
        feeds: Mapping[str, Any],
        *,
        tolerance: ToleranceLike = None,
        reference: Reference = "torch",
        kernels: Mapping[Any, Any] | None = None,
        missing: Missing = "error",
        blame: bool = False,
    ) -> CheckResult:
        """Judge onnxruntime on this provider × dtype; ToleranceBroken (carrying the CheckResult) when the
        tolerance is broken.

        `reference="torch"`: the torch evaluator is expected, onnxruntime got. `reference="float64"`: the
        float64 oracle (cast to the tested dtype) is expected, and onnxruntime and the torch evaluator are
        each judged against it; the result says which one is closer, in ULPs of the tested dtype.
        `kernels=`/`missing=` as in `run` (the oracle takes them too). `blame=True` adds the blame table
        to a failure. A model with floating inputs/outputs, none of this dtype, warns (OrtDiffDtypeWarning).
        """
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        if reference not in REFERENCES:
            raise ValueError(f"reference must be 'torch' or 'float64', got {reference!r}")
        _check_missing(missing)
        checked = self.prepare(model, feeds)
        m = checked.proto
        judged = self.judged_dtype(checked)
        other_dtype = _warn_other_dtype(m, self.dtype, compute_dtype(m))
        names = [o.name for o in m.graph.output]
        raw, notes = self._run_ort(checked, feeds)
        ev = self.evaluator(checked, runtime="torch", kernels=kernels, missing=missing)
        with self.options_in_force():  # (the evaluator's "ort" kernels make sessions too)
            expected_raw = ev.run(None, feeds)
        got, widened = _widened(raw, names)
        expected, _ = _widened(expected_raw, names)
        ran_on_ort = tuple(getattr(ev, "ops_run_by_ort", ()) or ())
        tol = self.tolerance_for(tolerance, dtype=judged)

        def judge(title: str, a: Any, b: Any, suffix: str) -> Judgement:
            if judged != self.dtype:  # (exact for both runtimes: their outputs are the half values cast up)
                a, b = _as_dtype(a, judged), _as_dtype(b, judged)
            report = self.compare(a, b, tolerance=tol, names=names)
            violations = tuple(tol.check(report))
            if not report.n:  # every output empty: nothing was compared, which must not read as a pass
                violations += (_nothing_compared(report, feeds),)
            elif ev.computes_nothing:  # every node on onnxruntime: onnxruntime compared with itself, not a pass either
                violations += (_nothing_checked(ran_on_ort),)
            return Judgement(title, report, violations, suffix)

        closer = None
        if reference == "torch":
            judgements: tuple[Judgement, ...] = (judge("torch evaluator vs onnxruntime", expected, got, ""),)
        else:
            ev64 = self.evaluator(checked, runtime="float64", kernels=kernels, missing=missing)
            with self.options_in_force():
                oracle, _ = _widened([o.to(t.dtype) for o, t in zip(ev64.run(None, feeds), expected_raw, strict=True)], names)
            judgements = (
                judge("float64 oracle vs onnxruntime", oracle, got, " [ort vs float64]"),
                judge("float64 oracle vs torch evaluator", oracle, expected, " [torch vs float64]"),
            )
            closer = closer_to_oracle(judgements[0].report, judgements[1].report)
        result = CheckResult(
            provider=self.provider,
            dtype=self.dtype,
            tolerance=tol,
            reference=reference,
            judgements=judgements,
            outputs=dict(zip(names, raw, strict=True)),
            ran_on_ort=ran_on_ort,
            closer=closer,
            model=m.graph.name,
            widened=widened,
            notes=(*checked.notes, *notes, *([other_dtype] if other_dtype else [])),
            row_notes=(*checked.notes, *([other_dtype] if other_dtype else [])),
            judged_dtype=judged if judged != self.dtype else None,
        )
        if not result.passed:
            if not result.report.n or ev.computes_nothing:
                raise NothingCompared(result.render(), result)  # (no blame: there is no gap to explain)
            if tf32_in_play(self.provider, self.dtype, self.effective_options()):
                result = replace(result, notes=(*result.notes, tf32_line(self.effective_options())))
            if blame:
                try:
                    result = replace(result, blame=self.blame(checked, feeds, kernels=kernels, missing=missing))
                except Exception as exc:  # the failure report is the point: a blame that fails must not hide it
                    text = str(exc).strip()
                    result = replace(result, blame_error=f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")
            raise ToleranceBroken(result.render(), result)
        return result

    # -- explaining, storing, repeating ----------------------------------------------------------
    def blame(self, model: Any, feeds: Mapping[str, Any], *, kernels: Mapping[Any, Any] | None = None, missing: Missing = "error") -> BlameTable:
        """The BlameTable of `model` on this provider: each node swapped to onnxruntime in turn."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        import onnx

        from .blame import blame

        _check_missing(missing)
        # a float16 model behind float32 I/O drifts by float16's rounding: its drifts judged as float16 (read off a
        # model at hand; a path is not loaded twice for it)
        dtype = self.judged_dtype(model) if isinstance(model, CheckedModel | onnx.ModelProto) else self.dtype
        try:
            with self.options_in_force():
                return blame(model, feeds, provider=self.provider, dtype=dtype, kernels=kernels, tolerance=self.tolerance_for(dtype=dtype), missing=missing)
        except Exception as exc:
            # onnxruntime refusing the model (or a node of it run on onnxruntime, missing="ort"): the error `check`
            # raises for it, not the evaluator's RuntimeError around it
            refusal = _onnxruntime_refusal(exc, self.provider, self.dtype)
            if refusal is None:
                raise
            raise refusal from None

    def check_baseline(
        self,
        path: str | Path,
        outputs: Any,
        *,
        name: str,
        test: str = "",
        update: bool = False,
        tolerance: ToleranceLike = None,
        reference_report: DiffReport | None = None,
        max_elements: int | None = None,
    ) -> BaselineOutcome:
        """`outputs` (tensor, list or dict) against the baseline stored at `path`: bitwise by default,
        within `tolerance` when given; `update=True` writes a missing, corrupted or drifted one. Returns the
        BaselineOutcome, or raises BaselineFailed carrying it (drift, missing, corrupted)."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        from .baseline import DEFAULT_MAX_ELEMENTS, check_baseline, check_outputs

        check_outputs(f"check_baseline({name!r}, ...)", outputs)
        tol = None if tolerance is None else _as_tolerance(tolerance)
        outcome = check_baseline(
            path,
            outputs,
            test=test,
            provider=self.provider,
            dtype=self.dtype,
            name=name,
            update=update,
            tolerance=tol,
            reference_report=reference_report,
            max_elements=max_elements if max_elements is not None else DEFAULT_MAX_ELEMENTS,
        )
        if not outcome.passed:
            raise BaselineFailed(outcome.message, outcome)
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
        """Is `model` bitwise reproducible on this provider? The same session `runs` times, varied intra-op
        threads (`threads`: the counts compared, default 1, 2 and the machine's cores) and graph optimization
        levels (`vary`), and on CUDA the torch evaluator with deterministic algorithms on and off. Returns the
        ReproducibilityReport, or raises NotReproducible carrying it."""
        __tracebackhide__ = True  # pytest shows the caller's line, not ours
        from ..runtimes.ort import UnsupportedByProviderError
        from .reproducible import check_reproducible

        _check_missing(missing)
        try:
            with self.options_in_force():
                report = check_reproducible(
                    model,
                    feeds,
                    provider=self.provider,
                    runs=runs,
                    vary=vary,
                    torch_deterministic=torch_deterministic,
                    session_options=session_options,
                    kernels=kernels,
                    missing=missing,
                    threads=threads,
                )
        except UnsupportedByProviderError as exc:
            raise UnsupportedByProvider(self.provider, self.dtype, exc.op, str(exc)) from None
        compared = [v.report for v in report.variations if not v.error and v.report is not None]
        if compared and not any(r.n for r in compared):
            # every output empty: bitwise identical runs of nothing say nothing about reproducibility
            given = ", ".join(f"{k} {list(getattr(v, 'shape', ()))}" for k, v in feeds.items())
            raise ValueError(f"check_reproducible: compared 0 elements: every output is empty for the feeds given ({given}); feed a non-empty input")
        if not report.reproducible:
            raise NotReproducible(report.render(), report)
        return report

    def reproducible_row(self, report: ReproducibilityReport) -> CheckRow:
        """The summary row of a reproducibility check: its worst variation, judged bitwise."""
        return row_for(report.worst(), BITWISE, report.reproducible, provider=self.provider, dtype=self.dtype, suffix=" [reproducible]", describe="bitwise")

    def baseline_row(self, outcome: BaselineOutcome, name: str) -> CheckRow | None:
        """The summary row of a baseline check that compared something (None for one created or missing)."""
        from ..numerics.diff import DiffReport

        comparison = outcome.comparison
        if comparison is None:
            return None
        suffix = f" [baseline {name}]"
        if comparison.report is not None:
            return row_for(comparison.report, BITWISE, outcome.passed, provider=self.provider, dtype=self.dtype, suffix=suffix, describe=comparison.rule)
        # no output comparable (shapes, dtypes or names changed): a row all the same, saying why
        why = next((o.note for o in comparison.outputs if o.status != "identical" and o.note), "no output comparable")
        return row_for(DiffReport(name=name, differ=0), BITWISE, outcome.passed, provider=self.provider, dtype=self.dtype, suffix=suffix, describe=comparison.rule, worst=why)


# ------------------------------------------------------------------------------------------------
# helpers

# key -> (evaluator, its weights' bytes), bounded by bytes as onnxruntime's sessions are (selection.trim_cache)
_EVALUATORS: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()


def _widened(values: Sequence[torch.Tensor], names: Sequence[str]) -> tuple[list[torch.Tensor], tuple[str, ...]]:
    """`values` with those of a floating dtype the diff has no rules for (float8: ULPs, tiny, default
    tolerances) as float32, which holds each of their values exactly; and "name dtype" of each so widened."""
    import torch

    out, widened = [], []
    for name, t in zip(names, values, strict=True):
        if t.is_floating_point():
            try:
                dtype_of(t.dtype)
            except (KeyError, ValueError):
                widened.append(f"{name} {str(t.dtype).removeprefix('torch.')}")
                t = t.to(torch.float32)
        out.append(t)
    return out, tuple(dict.fromkeys(widened))


def _outputs_of(report: DiffReport) -> tuple[DiffReport, ...]:
    """The per-output reports of a check's report (itself, for one output compared without its name)."""
    return tuple(report.outputs) or (report,)


def _described(report: DiffReport) -> str:
    """"y float32[0x4]": an output's name, dtype and shape."""
    return f"{report.name} {report.dtype}[{'x'.join(map(str, report.shape))}]".strip()


def _nothing_compared(report: DiffReport, feeds: Mapping[str, Any]) -> Violation:
    """The violation of a check whose every output is empty, naming them and the feeds with a dim of 0."""
    outputs = ", ".join(_described(o).replace(" ", ": ", 1) for o in _outputs_of(report))
    empty = [f"{name} {list(value.shape)}" for name, value in feeds.items() if 0 in tuple(getattr(value, "shape", ()))]
    if empty:
        why = f" for the feeds given (empty: {', '.join(empty)}); feed a non-empty input"
    else:
        why = " for the feeds given; feed inputs for which the model's outputs have elements"
    return Violation("empty", f"compared 0 elements: every output is empty ({outputs}){why}")


def _nothing_checked(ran_on_ort: Sequence[str]) -> Violation:
    """The violation of a check in which every node ran on onnxruntime: nothing of the torch evaluator was checked."""
    ops = f" ({', '.join(ran_on_ort)} without a torch kernel)" if ran_on_ort else ""
    return Violation(
        "empty",
        f"every node ran on onnxruntime{ops}: the check compared onnxruntime with itself, nothing of the torch evaluator; "
        "check a model the evaluator computes a node of (or give it a kernel: kernels={op: callable})",
    )


def _as_tolerance(tolerance: ToleranceLike) -> Tolerance:
    if tolerance is None:
        return Tolerance()
    if isinstance(tolerance, Tolerance):
        return tolerance
    if isinstance(tolerance, Mapping):
        valid = ("atol", "rtol", "max_ulp", "budget")
        unknown = [k for k in tolerance if k not in valid]
        if unknown:  # (Tolerance(**d) would say "unexpected keyword argument" without the valid ones)
            import difflib

            near = [m for k in unknown for m in difflib.get_close_matches(str(k), valid, n=1)]
            hint = f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
            raise TypeError(f"tolerance: unknown key(s) {unknown}{hint}; valid: {', '.join(valid)}")
        return Tolerance(**tolerance)
    if isinstance(tolerance, tuple | list) and len(tolerance) == 2:
        return Tolerance(atol=tolerance[0], rtol=tolerance[1])  # (atol, rtol), as compare() takes
    raise TypeError(
        f"tolerance must be a Tolerance, a dict of its arguments or an (atol, rtol) pair, got {tolerance!r}; "
        'e.g. tolerance=Tolerance(atol=1e-3, rtol=1e-3), {"budget": {1e-2: 0.001}} or (1e-3, 1e-3)'
    )


def _check_missing(missing: str) -> None:
    if missing not in MISSING:
        raise ValueError(f"missing must be 'error' (an op without a torch kernel is an error) or 'ort' (it runs on onnxruntime), got {missing!r}")


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


def _onnxruntime_refusal(exc: BaseException, provider: str, dtype: str) -> UnsupportedByProvider | OrtRunError | None:
    """What `check` raises for onnxruntime refusing to run a model, where `exc` is that refusal or a run's error
    caused by it (the evaluator's RuntimeError around a node run on onnxruntime); None for anything else."""
    from ..runtimes.ort import UnsupportedByProviderError

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, UnsupportedByProvider | OrtRunError):
            return cause
        if isinstance(cause, UnsupportedByProviderError):
            return UnsupportedByProvider(provider, dtype, cause.op, str(cause))
        if _from_onnxruntime(cause):
            text = str(cause).strip()
            return OrtRunError(provider, text.splitlines()[0] if text else type(cause).__name__, text)
        cause = cause.__cause__
    return None


def _from_onnxruntime(exc: BaseException) -> bool:
    """An error raised by onnxruntime itself: its own exception classes, or a RuntimeError its Python
    wrapper raises (run_with_iobinding's "Error in execution: ...")."""
    if type(exc).__module__.startswith("onnxruntime"):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{Path('onnxruntime') / 'capi'}" in tb.tb_frame.f_code.co_filename


def _user_stacklevel() -> int:
    """The stacklevel of a warning that points at the first frame outside this package (the user's call)."""
    frame = sys._getframe(1)
    level = 1
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("pytest_ortdiff"):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def _as_dtype(values: Sequence[Any], dtype: str) -> list[Any]:
    """Floating tensors wider than `dtype` as `dtype` (outputs of a model computing in it behind float32 I/O)."""
    target = dtype_of(dtype).torch
    return [v.to(target) if v.is_floating_point() and v.element_size() > target.itemsize else v for v in values]


def _warn_other_dtype(m: Any, dtype: str, compute: str | None = None) -> str | None:
    """A case whose model has floating inputs/outputs, none of them of the case's dtype (nor computes in
    it: a float16 model behind float32 I/O is a float16 case's): most likely a model built without
    dtype=ortdiff.dtype, judged under the wrong dtype's tolerance. Warns, and returns the note the check's
    row carries (a float16 column must not read green for a check that ran in float32); None otherwise."""
    found = {compute} if compute else set()
    for v in [*m.graph.input, *m.graph.output]:
        try:
            dt = dtype_of(v.type.tensor_type.elem_type)
        except (KeyError, ValueError):
            continue
        if dt.is_floating_point:
            found.add(dt.short)
    if found and dtype not in found:
        builder = _builder_name(m)
        example = f"models.{builder}(dtype=ortdiff.dtype)" if builder else "dtype=ortdiff.dtype in your model builder"
        warnings.warn(
            OrtDiffDtypeWarning(
                f"this case is {dtype}, but the model's floating inputs and outputs are {', '.join(sorted(found))}: build it for the case, e.g. {example}"
            ),
            stacklevel=_user_stacklevel(),
        )
        return f"the model is {', '.join(sorted(found))}, not this case's {dtype}: checked in {', '.join(sorted(found))}"
    return None


def _builder_name(m: Any) -> str | None:
    """The models.* builder that made `m` (None for other models)."""
    from ..models.mlp import builder_info

    try:
        return builder_info(m)[0]
    except ValueError:
        return None

