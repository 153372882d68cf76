"""The hypothesis runner behind `ortdiff.fuzz`: draws a builder's dims, a value regime and a seed, checks
torch evaluator vs onnxruntime on each example with a Checker, and shrinks a failure to the smallest case."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import progress
from ..engine.check import (
    Checker,
    Missing,
    OrtRunError,
    ToleranceBroken,
    ToleranceLike,
    UnsupportedByProvider,
    row_for,
)
from ..numerics.formatting import g
from ..numerics.results import CheckRow
from ..numerics.tolerance import Tolerance, Violation
from ..runtimes.model_io import check_model, load_model, model_path

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from ..numerics.diff import DiffReport

__all__ = ["FuzzCase", "FuzzResult", "check_dims", "fuzz", "regime_strategy"]


@dataclass(frozen=True)
class FuzzCase:
    """The smallest failing example hypothesis found: its dims, value regime and seed, the rules it breaks
    and the two statements that rebuild it (`reproduce`)."""

    dims: Mapping[str, int]
    regime: str
    seed: int
    report: DiffReport
    violations: tuple[Violation, ...]
    reproduce: str


@dataclass(frozen=True)
class FuzzResult:
    """A fuzz run: how many examples ran, the largest errors seen and the dims of the worst example; the
    failing case when the tolerance broke. `result["examples"]` reads like the dict it used to be."""

    provider: str
    dtype: str
    tolerance: Tolerance
    examples: int = 0
    max_abs: float = 0.0
    max_ulp: float = 0.0
    worst_dims: Mapping[str, int] | None = None
    worst: DiffReport | None = field(default=None, repr=False)
    failure: FuzzCase | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def __getitem__(self, key: str) -> Any:
        if key not in ("examples", "max_abs", "max_ulp", "worst_dims"):
            raise KeyError(key)
        return getattr(self, key)

    def __str__(self) -> str:
        """One line a person reads: "40 examples; worst at a=2, b=17, c=640: max abs 0.000122 (floored:
        rel 2.4e-07, 2 ulp); max ulp of any example 812" (ULPs near zero run high: the floored ones
        are at the output's scale, see `DiffReport.max_ulp_floored`)."""
        text = f"{self.examples} example{'' if self.examples == 1 else 's'}"
        if self.worst_dims is None:
            return text
        dims = ", ".join(f"{k}={v}" for k, v in self.worst_dims.items()) or "fixed dims"
        text += f"; worst at {dims}: max abs {g(self.max_abs)}"
        w = self.worst
        if w is not None and w.max_rel_floored is not None and w.max_ulp_floored is not None:
            text += f" (floored: rel {g(w.max_rel_floored)}, {g(w.max_ulp_floored)} ulp)"
        return text + f"; max ulp of any example {g(self.max_ulp)}"

    def render(self) -> str:
        """The failure report (smallest case, how to reproduce it, violations, histogram), or one line."""
        if self.failure is None:
            return f"ortdiff.fuzz: torch evaluator vs onnxruntime {self.provider} {self.dtype}: passed ({self.tolerance.describe()}); {self}"
        f = self.failure
        lines = [
            f"ortdiff.fuzz: torch evaluator vs onnxruntime {self.provider} {self.dtype}: tolerance broken ({self.tolerance.describe()})",
            f"  smallest failing case (shrunk by hypothesis): dims={dict(f.dims)} regime={f.regime!r} seed={f.seed}",
            f"  reproduce: {f.reproduce}",
        ]
        lines += [f"  - {v}" for v in f.violations]
        lines.append(f.report.render())
        return "\n".join(lines)

    def row(self) -> CheckRow | None:
        """The summary row: the failing example, else the worst one (None when no example ran)."""
        report = self.failure.report if self.failure is not None else self.worst
        if report is None:
            return None
        return row_for(report, self.tolerance, self.passed, provider=self.provider, dtype=self.dtype, suffix=" [fuzz]")


class _Broken(AssertionError):
    """One example broke the tolerance: hypothesis shrinks on it."""

    def __init__(self, values: dict[str, int], regime: str, seed: int, report: DiffReport, violations: list[Violation]) -> None:
        super().__init__(f"tolerance broken at dims={values} regime={regime!r} seed={seed}")
        self.values, self.regime, self.seed, self.report, self.violations = values, regime, seed, report, violations


def fuzz(
    checker: Checker,
    build: Any,
    *,
    dims: Any = None,
    regime: Any = "uniform",
    tolerance: ToleranceLike = None,
    kernels: Mapping[Any, Any] | None = None,
    missing: Missing = "error",
    max_examples: int | None = None,
) -> FuzzResult:
    """Hypothesis-driven check over shapes and values on `checker`'s provider and dtype: a FuzzResult, or
    ToleranceBroken carrying one with the smallest failing case.

    `build` is a builder (`models.layer_norm_matmul_add`, called with `dtype=checker.dtype`) or a model;
    `dims` a strategy from `strategies.dims(...)` or bounds for it (`{"c": (1, 512)}`, each at least 1 or
    the builder's declared low); `regime` a value regime name (`strategies.REGIMES`), a list of them, or a
    strategy over them; bad dims and regimes are errors before any example runs. Dims a builder takes as
    arguments (`build.build_dims`) change the graph: one model, session and evaluator per combination,
    built on first use and reused by every example. No hypothesis deadline (an example meeting a new graph
    builds its session first); everything else follows the active profile.
    """
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ..runtimes.evaluator import MissingKernelError
    from . import strategies

    build_dims = tuple(getattr(build, "build_dims", ())) if callable(build) else ()
    graphs: dict[tuple[tuple[str, int], ...], tuple[Any, list[str], Any]] = {}

    def graph_for(values: Mapping[str, int]) -> tuple[Any, list[str], Any]:
        key = tuple((k, int(values[k])) for k in build_dims if k in values)
        if key not in graphs:
            source = build(dtype=checker.dtype, **dict(key)) if callable(build) else build
            checked = check_model(load_model(source), path=model_path(source))  # (a model above 2 GB: from its file)
            evaluator = checker.evaluator(checked, kernels=kernels, missing=missing)
            graphs[key] = (checked, [o.name for o in checked.proto.graph.output], evaluator)
        return graphs[key]

    if isinstance(dims, st.SearchStrategy):
        dims_st = dims
    else:
        target = build if callable(build) else load_model(build)
        check_dims(target, dims)
        dims_st = strategies.dims(target, **dict(dims or {}))
    regime_st = regime_strategy(regime)
    tol = checker.tolerance_for(tolerance)
    stats: dict[str, Any] = {"examples": 0, "max_abs": 0.0, "max_ulp": 0.0, "worst_dims": None, "worst": None}
    # an op that onnxruntime or the evaluator lacks is not a numerical failure: no example can run, and
    # hypothesis must not shrink on it; the first one stops every later example and is raised after
    stopped: list[BaseException] = []
    shown: list[progress.Bar] = []  # the run's progress bar, once it is drawn

    def one(values: dict[str, int], reg: str, seed: int) -> None:
        if shown:
            shown[0].update()
        if stopped:
            return
        try:
            checked, names, evaluator = graph_for(values)
            feeds = strategies.make_feeds(checked.proto, values, reg, seed, device=checker.device)
            got = checker.run_ort(checked, feeds)
        except (UnsupportedByProvider, MissingKernelError) as exc:
            stopped.append(exc)
            return
        except OrtRunError as exc:  # (shapes onnxruntime refuses: which ones, and what to do)
            exc.add_note(f"ortdiff.fuzz: onnxruntime refused the example at dims {values}; if the model fixes one of them (a weight's size declared as a symbolic dim), give it as a bound: dims={{name: value}}")
            raise
        expected = evaluator.run(None, feeds)
        report = checker.compare(expected, got, tolerance=tol, names=names)
        stats["examples"] += 1
        if report.max_abs >= stats["max_abs"]:
            stats["max_abs"], stats["worst_dims"], stats["worst"] = report.max_abs, dict(values), report
        stats["max_ulp"] = max(stats["max_ulp"], report.max_ulp)
        violations = tol.check(report)
        if violations:
            raise _Broken(values, reg, seed, report, violations)

    test = given(values=dims_st, reg=regime_st, seed=st.integers(0, 2**31 - 1))(one)
    # no deadline: an example that meets a new graph builds its session first (hundreds of ms); the rest
    # (examples, database, derandomize) follows the active hypothesis profile
    test = (settings(deadline=None) if max_examples is None else settings(deadline=None, max_examples=max_examples))(test)
    # a long run (the profile's or the call's max_examples of 50 and more) draws a bar on a terminal;
    # shrinking a failure runs more examples than that, which the bar counts on past its end
    total = max_examples if max_examples is not None else settings().max_examples
    try:
        with progress.bar(total, "ortdiff fuzz", unit="example", min_total=50) as bar:
            shown.append(bar)
            test()
    except _Broken as exc:
        case = FuzzCase(exc.values, exc.regime, exc.seed, exc.report, tuple(exc.violations), _reproduce_line(checker.dtype, build, build_dims, exc.values, exc.regime, exc.seed))
        failed = FuzzResult(checker.provider, checker.dtype, tol, stats["examples"], stats["max_abs"], stats["max_ulp"], stats["worst_dims"], stats["worst"], case)
        raise ToleranceBroken(failed.render(), failed) from None
    if stopped:
        raise stopped[0]
    return FuzzResult(checker.provider, checker.dtype, tol, stats["examples"], stats["max_abs"], stats["max_ulp"], stats["worst_dims"], stats["worst"])


def _reproduce_line(dtype: str, build: Any, build_dims: Sequence[str], values: Mapping[str, int], regime: str, seed: int) -> str:
    """The statements that rebuild a fuzz example's model and feeds, runnable as they are: the package's
    builders as `models.NAME`, a user's builder imported from its own module, a model file loaded from its
    path (a builder defined inside a function cannot be imported: it is named for the reader instead)."""
    feeds = f"feeds = strategies.make_feeds(model, {dict(values)}, {regime!r}, {seed})"
    if isinstance(build, str | Path):
        return f"import onnx; from pytest_ortdiff import strategies; model = onnx.load({str(build)!r}); {feeds}"
    if not callable(build):
        return f"from pytest_ortdiff import strategies; {feeds}  (model: the ModelProto given to fuzz)"
    call = f"(dtype={dtype!r}" + "".join(f", {k}={values[k]}" for k in build_dims if k in values) + ")"
    module = getattr(build, "__module__", None) or ""
    qualname = getattr(build, "__qualname__", None) or getattr(build, "__name__", None) or type(build).__name__
    if module.startswith("pytest_ortdiff.models") and "." not in qualname:
        return f"from pytest_ortdiff import models, strategies; model = models.{qualname}{call}; {feeds}"
    if "<" in qualname or not module or module == "__main__":
        return f"from pytest_ortdiff import strategies; model = {qualname.rpartition('.')[2]}{call}; {feeds}  ({qualname} of {module or 'your code'}: the builder given to fuzz)"
    top = qualname.split(".")[0]
    return f"from {module} import {top}; from pytest_ortdiff import strategies; model = {qualname}{call}; {feeds}"


def check_dims(target: Any, dims: Any) -> None:
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


def regime_strategy(regime: Any) -> SearchStrategy[str]:
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
