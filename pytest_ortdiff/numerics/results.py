"""Typed results of a run — check rows, skip rows, baseline rows, test outcomes, the job's environment — their
JSON form with a schema version (the `--ortdiff-json` file `merge` reads back through the same classes), and atomic writes."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Literal, Protocol

__all__ = [
    "OUTCOMES",
    "SCHEMA_VERSION",
    "UNFINISHED_RUN",
    "BaselineRow",
    "CheckRow",
    "Environment",
    "ResultsFile",
    "ResultsFileError",
    "SkipRow",
    "TestOutcome",
    "check_report",
    "closer_to_oracle",
    "module_version",
    "write_atomically",
]

#: the version of the --ortdiff-json layout this code writes; files without a "schema" are version 1
#: (results, skips and, later, tests; no ran_on_ort in rows); version 2 has no environment and no baselines
SCHEMA_VERSION = 3
Outcome = Literal["passed", "xpassed", "skipped", "xfailed", "failed", "error"]
#: a test's outcome, worst last: a later report of the same test never makes it better
OUTCOMES: tuple[Outcome, ...] = ("passed", "xpassed", "skipped", "xfailed", "failed", "error")
#: the order a malformed file's message lists them in (as users read them)
_OUTCOMES_LISTED = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
Closer = Literal["onnxruntime", "torch", "tie"]


class ResultsFileError(ValueError):
    """An --ortdiff-json file that cannot be read: the message names the file and the problem."""


# ------------------------------------------------------------------------------------------------
# rows


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class CheckRow:
    """One check of one test: the summary table's row, and an entry of the JSON file's "results".

    `suffix` (" [baseline out]", " [fuzz]", ...) travels from the fixture to the session, which makes it
    part of `test`; `outcome` is set by the session ("passed", "failed", or "xfailed" for a broken check
    the test expected). `ran_on_ort`: ops the torch evaluator ran on onnxruntime for lack of a kernel.
    `blame`: the blame table of a failed check run with blame (`BlameTable.to_dict(top=BlameTable.TOP)`).
    `notes`: what the gate did to accept the model (its nodes sorted topologically), one short line each.
    """

    test: str
    provider: str | None = None
    dtype: str | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    max_ulp: float | None = None
    worst: str = ""
    passed: bool | None = None
    tolerance: str | None = None
    report: Mapping[str, Any] | None = None
    outcome: str | None = None
    suffix: str = ""
    ran_on_ort: tuple[str, ...] = ()
    blame: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def blame_top(self) -> str | None:
        """The blame table's first row as one line, "node (Op) 87 %" (`~1 %` for an estimate); None without
        a table, or where its first node explains nothing (under half a percent: no node to name)."""
        rows = (self.blame or {}).get("rows") or []
        first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], Mapping) else None
        if first is None:
            return None
        share = first.get("explained")
        share = float(share) if isinstance(share, int | float) and not isinstance(share, bool) else 0.0
        if not share >= 0.005:
            return None
        mark = "" if first.get("exact", True) else "~"
        return f"{first.get('node', '?')} ({first.get('op_type', '?')}) {mark}{share * 100:.0f} %"

    @property
    def ulp(self) -> float | None:
        """The ULP error a summary shows and `max_ulp` judges: its report's `max_ulp_floored` (ULPs at the
        output's scale), else `max_ulp` (a file written before floored errors existed). `max_ulp` stays the
        raw distance, which near zero counts thousands of ULPs for an error of 1e-7."""
        floored = self.report.get("max_ulp_floored") if isinstance(self.report, Mapping) else None
        if isinstance(floored, int | float | str) and not isinstance(floored, bool) and (not isinstance(floored, str) or floored in _SPECIAL):
            return float(floored)
        return self.max_ulp

    @property
    def ok(self) -> bool:
        """Passed, or failed as its test expected: what `merge --strict` accepts."""
        return self.outcome in ("passed", "xfailed")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "test": self.test,
            "provider": self.provider,
            "dtype": self.dtype,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "max_ulp": self.max_ulp,
            "worst": self.worst,
            "passed": self.passed,
            "tolerance": self.tolerance,
            "report": dict(self.report) if self.report is not None else None,
            "outcome": self.outcome,
            "ran_on_ort": list(self.ran_on_ort),
        }
        if self.suffix:
            out["suffix"] = self.suffix
        if self.blame is not None:
            out["blame"] = dict(self.blame)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "row") -> CheckRow:
        """A row from its JSON form; ResultsFileError naming `where` when it is not one."""
        if not isinstance(data, Mapping):
            raise ResultsFileError(f"{where} is not an object")
        if not isinstance(data.get("test"), str):
            raise ResultsFileError(f"{where} has no 'test' (a string)")
        report = data.get("report")
        if report is not None:
            check_report(report, f"{where}.report")
        ran = data.get("ran_on_ort") or ()
        notes = data.get("notes") or ()
        return cls(
            test=data["test"],
            provider=_text(data.get("provider")),
            dtype=_text(data.get("dtype")),
            max_abs=_number(data.get("max_abs")),
            max_rel=_number(data.get("max_rel")),
            max_ulp=_number(data.get("max_ulp")),
            worst=str(data.get("worst") or ""),
            passed=data["passed"] if isinstance(data.get("passed"), bool) else None,
            tolerance=_text(data.get("tolerance")),
            report=report if isinstance(report, Mapping) else None,
            outcome=_text(data.get("outcome")),
            suffix=str(data.get("suffix") or ""),
            ran_on_ort=tuple(str(op) for op in ran) if isinstance(ran, list | tuple) else (),
            blame=data["blame"] if isinstance(data.get("blame"), Mapping) else None,
            notes=tuple(str(n) for n in notes) if isinstance(notes, list | tuple) else (),
        )


#: a DiffReport's fields (`DiffReport.to_dict`) by kind: values (a number, an integer output's exact value, or
#: "nan"/"inf"/"-inf"), element counts, and indices or shapes (lists of integers)
_REPORT_VALUES = ("max_abs", "max_rel", "max_ulp", "mean_abs", "expected_at_max", "got_at_max", "rel_floor", "max_rel_floored", "max_ulp_floored", "expected_at_outside", "got_at_outside")
_REPORT_COUNTS = ("n", "nan_mismatch", "inf_mismatch", "out_of_tolerance", "differ")
_REPORT_INDICES = ("shape", "argmax", "outside_at")
_SPECIAL = ("nan", "inf", "-inf")


def check_report(report: Any, where: str) -> None:
    """A row's `report` as DiffReport.to_dict writes it: ResultsFileError naming `where` and the field for a
    value a renderer could not show (a string for a count, an index of strings, a count of 400 digits)."""
    stack = [(report, where)]
    while stack:  # (iterative: an `outputs` nested a thousand deep is an error, not a RecursionError)
        rep, at = stack.pop()
        if not isinstance(rep, Mapping):
            raise ResultsFileError(f"{at} is {_shown(rep)}; expected an object (a DiffReport's to_dict())")
        for key in _REPORT_VALUES:
            v = rep.get(key)
            if v is not None and not (_is_number(v) or v in _SPECIAL):
                raise ResultsFileError(f"{at} has {key!r} {_shown(v)}; expected a number, \"nan\", \"inf\" or null")
        for key in _REPORT_COUNTS:
            v = rep.get(key)
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise ResultsFileError(f"{at} has {key!r} {_shown(v)}; expected a count (an integer >= 0) or null")
        for key in _REPORT_INDICES:
            v = rep.get(key)
            if v is not None and not (isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)):
                raise ResultsFileError(f"{at} has {key!r} {_shown(v)}; expected a list of integers or null")
        counts = rep.get("counts")
        if counts is not None:
            if not isinstance(counts, Mapping):
                raise ResultsFileError(f"{at} has 'counts' {_shown(counts)}; expected an object {{threshold: count}}")
            for t, c in counts.items():
                try:
                    float(t)
                except ValueError:
                    raise ResultsFileError(f"{at}.counts has the threshold {_shown(t)}; expected a number such as \"0.01\"") from None
                if not (isinstance(c, int) and not isinstance(c, bool) and c >= 0):
                    raise ResultsFileError(f"{at}.counts has {_shown(c)} for {_shown(t)}; expected a count (an integer >= 0)")
        tol = rep.get("tolerance")
        if tol is not None and not (isinstance(tol, list) and len(tol) == 2 and all(_is_number(x) for x in tol)):
            raise ResultsFileError(f"{at} has 'tolerance' {_shown(tol)}; expected [atol, rtol] or null")
        outputs = rep.get("outputs")
        if outputs is not None:
            if not isinstance(outputs, list):
                raise ResultsFileError(f"{at} has 'outputs' {_shown(outputs)}; expected a list of reports")
            stack.extend((o, f"{at}.outputs[{i}]") for i, o in enumerate(outputs))


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _shown(value: Any) -> str:
    """A value for an error message: short, and never a control character (the file is someone else's)."""
    text = repr(value) if not isinstance(value, int) or len(str(abs(value))) <= _MAX_INT_DIGITS else f"an integer of {len(str(abs(value))):,} digits"
    text = text if len(text) <= 60 else text[:57] + "..."
    return text.encode("ascii", "backslashreplace").decode("ascii")


@dataclass(frozen=True)
class SkipRow:
    """A test skipped for a hole in the provider × dtype matrix, with the reason naming it."""

    provider: str | None
    dtype: str | None
    reason: str
    test: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"provider": self.provider, "dtype": self.dtype, "reason": self.reason}
        if self.test is not None:
            out["test"] = self.test
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "skip") -> SkipRow:
        if not isinstance(data, Mapping):
            raise ResultsFileError(f"{where} is not an object")
        return cls(_text(data.get("provider")), _text(data.get("dtype")), str(data.get("reason") or ""), _text(data.get("test")))


@dataclass(frozen=True)
class BaselineRow:
    """What one check_baseline did to its file: "unchanged", "created", "updated", "replaced corrupted",
    "missing", "corrupted", "drift", "within tolerance" or "unwritable"; with what a report shows of the drift: the
    largest absolute change of the outputs since the baseline (None when nothing was compared), the
    environment changes since it was written as (key, baseline, now), and the message the test saw."""

    name: str
    action: str
    path: str
    passed: bool
    test: str | None = None
    max_abs: float | None = None
    env_changes: tuple[tuple[str, str, str], ...] = ()
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "action": self.action, "path": self.path, "passed": self.passed}
        if self.test is not None:
            out["test"] = self.test
        out["max_abs"] = self.max_abs
        out["environment_changes"] = [{"key": k, "baseline": a, "now": b} for k, a, b in self.env_changes]
        if self.message is not None:
            out["message"] = self.message
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "baseline") -> BaselineRow:
        if not isinstance(data, Mapping) or not isinstance(data.get("path"), str):
            raise ResultsFileError(f"{where} is not a baseline row (an object with a 'path')")
        changes = data.get("environment_changes")
        # rows written before drift was recorded have none of the three; a malformed change is left out
        env = tuple(
            (str(c.get("key")), str(c.get("baseline")), str(c.get("now")))
            for c in (changes if isinstance(changes, list) else ())
            if isinstance(c, Mapping) and isinstance(c.get("key"), str)
        )
        return cls(
            str(data.get("name") or ""),
            str(data.get("action") or ""),
            data["path"],
            bool(data.get("passed")),
            _text(data.get("test")),
            _number(data.get("max_abs")),
            env,
            _text(data.get("message")),
        )


@dataclass(frozen=True)
class TestOutcome:
    """How one test ended, with or without a check: the JSON file's "tests"."""

    __test__ = False  # not a test class, whatever pytest's collector thinks of the name

    test: str
    outcome: Outcome
    provider: str | None = None
    dtype: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"test": self.test, "outcome": self.outcome}
        for key in ("provider", "dtype", "message"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "test") -> TestOutcome:
        if not isinstance(data, Mapping):
            raise ResultsFileError(f"{where} is not an object")
        if not isinstance(data.get("test"), str):
            raise ResultsFileError(f"{where} has no 'test' (a string)")
        outcome = data.get("outcome")
        if outcome not in OUTCOMES:
            raise ResultsFileError(f"{where} has outcome {outcome!r}; valid: {', '.join(_OUTCOMES_LISTED)}")
        return cls(data["test"], outcome, _text(data.get("provider")), _text(data.get("dtype")), _text(data.get("message")))


# ------------------------------------------------------------------------------------------------
# the job's environment


#: accelerators whose device name torch.cuda reports (ROCm builds of torch answer through torch.cuda too)
_GPU_PROVIDERS = ("CUDA", "TensorRT", "ROCm", "MIGraphX")
#: distributions that install the `onnxruntime` module, the plain one first
_ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn", "ort-nightly", "ort-nightly-gpu")


@dataclass(frozen=True)
class Environment:
    """What produced a job's numbers: library versions, python, platform, the device, and the providers and
    dtypes the run selected. Every field is None (or empty) when unknown: files of schema 1 and 2 have none."""

    onnxruntime: str | None = None
    torch: str | None = None
    onnx: str | None = None
    numpy: str | None = None
    python: str | None = None
    platform: str | None = None
    device: str | None = None
    providers: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()

    _TEXT = ("onnxruntime", "torch", "onnx", "numpy", "python", "platform", "device")

    @property
    def empty(self) -> bool:
        return self == Environment()

    @property
    def label(self) -> str:
        """The job's name for a person: "CPU float32 · ort 1.32.0 · torch 2.13.0", with the device named for a
        GPU ("CUDA float16 · NVIDIA H100 80GB HBM3 · ort 1.32.0 · torch 2.13.0"); "" when nothing is known.
        A CPU's model name is left out: it is long, and the jobs of one matrix share it."""
        parts = []
        case = " ".join(p for p in (",".join(self.providers), ",".join(self.dtypes)) if p)
        if case:
            parts.append(case)
        if self.device and any(p in _GPU_PROVIDERS for p in self.providers):
            parts.append(self.device)
        if self.onnxruntime:
            parts.append(f"ort {self.onnxruntime}")
        if self.torch:
            parts.append(f"torch {self.torch}")
        return " · ".join(parts)

    def items(self) -> list[tuple[str, str]]:
        """(key, value) of what is known, in a stable order, for a report's environment table."""
        out = [(k, v) for k in self._TEXT if (v := getattr(self, k))]
        if self.providers:
            out.append(("providers", ", ".join(self.providers)))
        if self.dtypes:
            out.append(("dtypes", ", ".join(self.dtypes)))
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self._TEXT}
        out["providers"], out["dtypes"] = list(self.providers), list(self.dtypes)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Environment:
        """Tolerant: a key this version does not know is ignored, a value of the wrong type read as unknown
        (an environment only labels a job; it never decides a verdict)."""
        if not isinstance(data, Mapping):
            return cls()

        def names(value: Any) -> tuple[str, ...]:
            return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

        return cls(**{k: _text(data.get(k)) for k in cls._TEXT}, providers=names(data.get("providers")), dtypes=names(data.get("dtypes")))

    @classmethod
    def current(cls, providers: tuple[str, ...] = (), dtypes: tuple[str, ...] = ()) -> Environment:
        """This machine's, for a run that selected `providers` and `dtypes`. Versions come from the installed
        distributions' metadata, which imports nothing; torch is imported only to name a GPU when the run
        selected a GPU provider (an xdist controller that ran no test has not imported it)."""
        device = _cpu_model()
        if any(p in _GPU_PROVIDERS for p in providers):
            with contextlib.suppress(Exception):  # no torch, no CUDA build, a driver error: the CPU is still a device
                import torch

                if torch.cuda.is_available():
                    device = torch.cuda.get_device_name()
        return cls(
            onnxruntime=module_version("onnxruntime", _ORT_DISTRIBUTIONS),
            torch=module_version("torch", ("torch",)),
            onnx=module_version("onnx", ("onnx",)),
            numpy=module_version("numpy", ("numpy",)),
            python=platform.python_version(),
            platform=f"{platform.system()} {platform.machine()}",
            device=device,
            providers=tuple(providers),
            dtypes=tuple(dtypes),
        )


def module_version(module: str, distributions: tuple[str, ...]) -> str | None:
    """The version of `module`: its __version__ when it is imported already (what ran), else the first of
    `distributions` installed (None: neither)."""
    from importlib import metadata

    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None)
    if isinstance(version, str):
        return version
    for dist in distributions:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


# ------------------------------------------------------------------------------------------------
# the file


#: the test id of the error row an incomplete file carries (a run killed, interrupted, or still running)
UNFINISHED_RUN = "pytest run (did not finish)"


@dataclass(frozen=True)
class ResultsFile:
    """One --ortdiff-json file: every check's row, every named skip, every test's outcome, what each
    check_baseline did, and the environment the job ran in.

    `complete` is False in the file a run writes when it starts (`running()`) and in the one an
    interrupted run leaves: such a file carries an "error" outcome for UNFINISHED_RUN (added on
    reading if it was removed), so `merge --strict` fails on it and a killed run never leaves the
    previous run's green file behind.
    """

    results: tuple[CheckRow, ...] = ()
    skips: tuple[SkipRow, ...] = ()
    tests: tuple[TestOutcome, ...] = ()
    schema: int = SCHEMA_VERSION
    complete: bool = True
    environment: Environment = Environment()
    baselines: tuple[BaselineRow, ...] = ()

    @classmethod
    def running(cls, started: str | None = None) -> ResultsFile:
        """The file a run writes over its target when it starts, before any test runs."""
        return cls(complete=False).incomplete(started)

    def incomplete(self, started: str | None = None, why: str = "killed, interrupted or still running") -> ResultsFile:
        """This file marked as the results of a run that did not finish: its rows as they are, plus the
        error outcome that fails `merge --strict`."""
        if started is None:
            started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        row = TestOutcome(UNFINISHED_RUN, "error", message=f"started {started} (pid {os.getpid()}) and did not finish ({why}): its results are incomplete")
        tests = tuple(t for t in self.tests if t.test != UNFINISHED_RUN)
        return replace(self, tests=(row, *tests), complete=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "complete": self.complete,
            "results": [r.to_dict() for r in self.results],
            "skips": [s.to_dict() for s in self.skips],
            "tests": [t.to_dict() for t in self.tests],
            "baselines": [b.to_dict() for b in self.baselines],
            "environment": self.environment.to_dict(),
        }

    def test_rows(self) -> tuple[CheckRow, ...]:
        """A row for each test that failed or errored while no failed check of it says why: it failed before
        its check, without any, or after its checks passed (a missing or corrupted baseline, an assert of
        its own). `worst` says what happened; a summary that showed only the check rows would say "passed"."""
        out = []
        for t in self.tests:
            if t.outcome not in ("failed", "error"):
                continue
            own = [r for r in self.results if r.test == t.test or r.test.startswith(t.test + " [")]
            if any(not r.ok for r in own):
                continue
            stored = [b for b in self.baselines if b.test == t.test and b.action in ("missing", "corrupted", "unwritable")]
            if stored:
                why = "; ".join(f"baseline {b.name!r} {b.action}" for b in stored)
            else:
                why = "its checks passed; the test failed" if own else "no check ran"
            out.append(CheckRow(t.test, t.provider, t.dtype, worst=why, outcome=t.outcome))
        return tuple(out)

    @classmethod
    def from_dict(cls, data: Any) -> ResultsFile:
        """The file's content; ResultsFileError saying what is wrong (the caller adds the path)."""
        if not isinstance(data, Mapping) or "results" not in data:
            raise ResultsFileError("has no 'results'")
        version = _schema_version(data)
        results = data["results"]
        if not isinstance(results, list):
            raise ResultsFileError("'results' is not a list")
        rows = tuple(CheckRow.from_dict(row, f"results[{i}]") for i, row in enumerate(results))
        parts: dict[str, list[Any]] = {}
        for key in ("tests", "skips"):
            items = data.get(key, [])  # files written before test outcomes were recorded have no 'tests'
            if not isinstance(items, list):
                raise ResultsFileError(f"{key!r} is not a list")
            parts[key] = items
        tests = tuple(TestOutcome.from_dict(t, f"tests[{i}]") for i, t in enumerate(parts["tests"]))
        skips = tuple(SkipRow.from_dict(s, f"skips[{i}]") for i, s in enumerate(parts["skips"]))
        complete = data.get("complete", True)  # files written before it existed were written at the end
        if not isinstance(complete, bool):
            raise ResultsFileError(f"'complete' is not true or false (got {complete!r})")
        baselines = data.get("baselines", [])  # schema 1 and 2 files have none
        if not isinstance(baselines, list):
            raise ResultsFileError("'baselines' is not a list")
        stored = tuple(BaselineRow.from_dict(b, f"baselines[{i}]") for i, b in enumerate(baselines))
        out = cls(rows, skips, tests, version, complete, Environment.from_dict(data.get("environment")), stored)
        if not complete and not any(t.test == UNFINISHED_RUN and t.outcome == "error" for t in tests):
            out = replace(out, tests=(TestOutcome(UNFINISHED_RUN, "error", message="the run writing this file did not finish"), *tests))
        return out

    @classmethod
    def read(cls, path: str | Path) -> ResultsFile:
        """Read and validate a file; ResultsFileError with one line naming the file and the problem."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"), parse_int=_parse_int)
        except FileNotFoundError:
            raise ResultsFileError(f"{path} does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ResultsFileError(f"{path} is not a JSON report written by --ortdiff-json ({exc})") from None
        except OSError as exc:
            raise ResultsFileError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            _refuse_huge(data)
            return cls.from_dict(data)
        except _SchemaError as exc:
            raise ResultsFileError(f"{path}: {exc}") from None
        except ResultsFileError as exc:
            if str(exc) == "has no 'results'":
                raise ResultsFileError(f"{path} has no 'results': is it a file written by --ortdiff-json?") from None
            raise ResultsFileError(f"{path}: {exc}: is it a file written by --ortdiff-json?") from None

    def write(self, path: str | Path) -> None:
        write_atomically(Path(path), json.dumps(self.to_dict(), indent=1))


#: the most digits an integer of a report of ours has: counts, sizes and indices are below 2**63 (19 digits)
_MAX_INT_DIGITS = 20


class _HugeInt:
    """A JSON integer too long to be a count of ours, held until `_refuse_huge` says where it is (Python
    refuses to read one of 4,300 digits and more, and none above 309 digits converts to a float)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _parse_int(text: str) -> int | _HugeInt:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= _MAX_INT_DIGITS else _HugeInt(digits)


def _refuse_huge(data: Any) -> None:
    """ResultsFileError naming the first integer of more than _MAX_INT_DIGITS digits, and where it is."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, at = stack.pop()
        if isinstance(value, _HugeInt):
            raise ResultsFileError(f"{at or 'the file'} is an integer of {value.digits:,} digits, which no report holds (counts and sizes have at most {_MAX_INT_DIGITS})")
        if isinstance(value, Mapping):
            stack.extend((v, _member(at, str(k))) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(value))))


def _member(at: str, key: str) -> str:
    """`results[0].report` and `counts["0.01"]`: a path into the file, as a person would write it."""
    if key.isidentifier():
        return f"{at}.{key}" if at else key
    return f"{at}[{_shown(key)}]"


class _SchemaError(ResultsFileError):
    """A version this code does not read: no "is it a file written by --ortdiff-json?" question."""


def _schema_version(data: Mapping[str, Any]) -> int:
    if "schema" not in data:
        return 1
    version = data["schema"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _SchemaError(f"unknown schema version {version!r} (this pytest-ortdiff reads versions 1 to {SCHEMA_VERSION})")
    if version > SCHEMA_VERSION:
        raise _SchemaError(
            f"schema version {version} is newer than this pytest-ortdiff reads (1 to {SCHEMA_VERSION}); upgrade pytest-ortdiff to merge it"
        )
    return version


# ------------------------------------------------------------------------------------------------
# shared rules


class _AgainstOracle(Protocol):
    @property
    def max_ulp(self) -> float: ...

    @property
    def mismatches(self) -> int: ...


def closer_to_oracle(ort: _AgainstOracle, torch: _AgainstOracle) -> Closer:
    """Which runtime's outputs are closer to the float64 oracle: the smaller max ULP error at the output's
    scale (`max_ulp_floored` where the two have it: raw ULPs near zero count thousands for an error of 1e-7,
    and would decide on noise), then the fewer elements off; "tie" when both are equal."""
    ko, kt = (floored_ulp(ort), ort.mismatches), (floored_ulp(torch), torch.mismatches)
    return "tie" if ko == kt else ("onnxruntime" if ko < kt else "torch")


def floored_ulp(x: Any) -> float:
    """`x.max_ulp_floored` (a DiffReport's, an OracleError's) when it has one, else `x.max_ulp`."""
    floored = getattr(x, "max_ulp_floored", None)
    return float(x.max_ulp if floored is None else floored)


def write_atomically(path: Path, data: str | bytes | Callable[[IO[bytes]], None]) -> None:
    """Write `data` (text, bytes, or a function writing to a binary file) to `path` so that a reader —
    another xdist worker, the next run after an interrupted one — sees the old file or the new one,
    never half of one: a temporary file created exclusively in the same directory, flushed to disk,
    then renamed over `path`. The temporary's name is random and created with O_EXCL (mkstemp), so a
    file or link planted at a predictable name is never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the pid in the name lets a later run clean the file as soon as a killed writer is gone
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            # mkstemp's 0600 would hide a committed baseline from the rest of the team; set on the open
            # file, not the name, which someone else could have swapped for a link by now
            os.fchmod(f.fileno(), 0o644)
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        # rename() replaces whatever is at `path` (a symlink included) and never follows it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

