"""pytest hooks only: options and ini, the ortdiff marker, provider × dtype parametrization, skips,
and the terminal summary. Imports neither torch nor onnxruntime at import time."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .dtypes import TESTABLE, parse_dtype
from .fixtures import (
    BASELINE_KEY,
    RESULT_KEY,
    SKIP_KEY,
    _ortdiff_case,
    ort_dtype,
    ort_provider,
    ortdiff,
)
from .providers import parse_provider
from .tolerance import Tolerance

__all__ = ["_ortdiff_case", "ort_dtype", "ort_provider", "ortdiff"]

_FIXTURES = ("ortdiff", "ort_provider", "ort_dtype")  # all depend on _ortdiff_case
_MARKER_KWARGS = ("providers", "dtypes", "atol", "rtol", "max_ulp", "budget", "reproducible")
_REPRODUCIBLE_KWARGS = ("runs", "vary", "torch_deterministic", "session_options")
DEFAULT_PROVIDERS = ("CPU",)
DEFAULT_DTYPES = ("float32",)
#: user property naming the (provider, dtype) a test was parametrized with; travels to the xdist controller
CASE_KEY = "ortdiff_case"
#: a test's outcome in --ortdiff-json, worst last: a later report of the same test never makes it better
OUTCOMES = ("passed", "xpassed", "skipped", "xfailed", "failed", "error")


@dataclass
class _State:
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    explicit_providers: frozenset[str] = frozenset()
    providers_given: bool = False
    dtypes_given: bool = False
    skip_unavailable: bool = False
    show_reports: bool = False
    json_path: str | None = None
    json_target: Path | None = None
    json_message: str = ""
    json_failed: bool = False
    results: list[dict[str, Any]] = field(default_factory=list)
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    skips: list[dict[str, Any]] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)


STATE = pytest.StashKey[_State]()
# the running session's selection, for hypothesis strategies built at import time (they see no config)
_ACTIVE: list[_State] = []


def current_selection(kind: str) -> tuple[str, ...]:
    """The providers or dtypes the running pytest session enabled (defaults outside pytest)."""
    state = _ACTIVE[-1] if _ACTIVE else _State()
    return state.providers if kind == "providers" else state.dtypes


def _register_hypothesis_profiles() -> None:
    from hypothesis import HealthCheck, Verbosity, settings

    # CI: reproducible runs (derandomized), bounded, no deadline (first calls build sessions), and the
    # @reproduce_failure blob printed with every failure
    settings.register_profile(
        "ortdiff-ci",
        derandomize=True,
        max_examples=50,
        deadline=None,
        print_blob=True,
        verbosity=Verbosity.normal,
        suppress_health_check=[HealthCheck.too_slow],
    )
    # local iteration: fewer examples, randomized, database on so failures replay first
    settings.register_profile("ortdiff-dev", max_examples=20, deadline=None, print_blob=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ortdiff", "numerical diff of ONNX models: torch vs onnxruntime per provider × dtype")
    group.addoption(
        "--ort-providers",
        dest="ort_providers",
        default=None,
        help="comma list of providers to test: CPU, CUDA, TensorRT, ... or full EP names; 'available' = all "
        "that onnxruntime offers here (default: CPU; ini: ortdiff_providers)",
    )
    group.addoption(
        "--ort-dtypes",
        dest="ort_dtypes",
        default=None,
        help=f"comma list of dtypes to test: {', '.join(TESTABLE)} (default: float32; ini: ortdiff_dtypes)",
    )
    group.addoption(
        "--ort-skip-unavailable",
        dest="ort_skip_unavailable",
        action="store_true",
        default=None,
        help="skip, instead of failing the run, when a provider named in --ort-providers is unavailable here",
    )
    group.addoption(
        "--ortdiff-reports",
        dest="ortdiff_reports",
        action="store_true",
        default=None,
        help="print the full diff report (histogram) of every check in the summary, passing ones too",
    )
    group.addoption(
        "--ortdiff-blame",
        dest="ortdiff_blame",
        action="store_true",
        default=False,
        help="add the blame table (each node swapped to onnxruntime in turn) to every failure report",
    )
    group.addoption(
        "--ortdiff-json",
        dest="ortdiff_json",
        default=None,
        metavar="PATH",
        help="write every check's result and report, and every test's outcome, as JSON to PATH (one file per CI "
        "job; written even when no check ran; merge them with `python -m pytest_ortdiff merge`)",
    )
    group.addoption(
        "--ortdiff-baseline-dir",
        dest="ortdiff_baseline_dir",
        default=None,
        metavar="DIR",
        help="store baselines under DIR/<test module path>/ (default: <test dir>/<module>_ortdiff_baselines/; "
        "ini: ortdiff_baseline_dir)",
    )
    group.addoption(
        "--ortdiff-update-baselines",
        dest="ortdiff_update_baselines",
        action="store_true",
        default=False,
        help="write missing baselines and rewrite corrupted or drifted ones (deliberately no ini twin: "
        "without it a baseline is never written)",
    )
    parser.addini("ortdiff_baseline_dir", "directory for baselines (as --ortdiff-baseline-dir), relative to the ini file", default="")
    parser.addini("ortdiff_baseline_max_elements", "outputs with more elements are stored as a summary (checksum, quantiles, sample); default 65536", default="")
    parser.addini("ortdiff_providers", "comma list of providers (as --ort-providers)", default="")
    parser.addini("ortdiff_dtypes", "comma list of dtypes (as --ort-dtypes)", default="")
    parser.addini("ortdiff_skip_unavailable", "skip unavailable providers (as --ort-skip-unavailable)", type="bool", default=False)
    parser.addini("ortdiff_reports", "print every check's report (as --ortdiff-reports)", type="bool", default=False)


def _split(value: str | None) -> list[str]:
    if not value:
        return []
    return [v.strip() for v in value.replace(";", ",").split(",") if v.strip()]


def _parse_providers(names: list[str], source: str) -> tuple[list[str], bool]:
    """Short names, and whether 'available' was asked for."""
    out: list[str] = []
    wants_available = False
    for name in names:
        if name.lower() == "available":
            wants_available = True
            from .providers import available

            out.extend(p for p in available() if p not in out)
            continue
        try:
            p = parse_provider(name)
        except ValueError as exc:
            raise pytest.UsageError(f"{source}: {exc}") from None
        if p not in out:
            out.append(p)
    return out, wants_available


def _testable_dtype(name: Any) -> str:
    """The short name of a dtype the checks can run in; ValueError naming the valid ones otherwise."""
    d = parse_dtype(name).short
    if d not in TESTABLE:
        raise ValueError(f"{d} is not a floating dtype to test; valid: {', '.join(TESTABLE)}")
    return d


def _parse_dtypes(names: list[str], source: str) -> list[str]:
    out: list[str] = []
    for name in names:
        try:
            d = _testable_dtype(name)
        except ValueError as exc:
            raise pytest.UsageError(f"{source}: {exc}") from None
        if d not in out:
            out.append(d)
    return out


def _given_but_empty(value: str | None, option: str, example: str) -> None:
    # `--ort-dtypes=` (an unset CI variable) must not quietly test the defaults
    if value is not None and not _split(value):
        raise pytest.UsageError(f"{option} is empty; give e.g. {example}")


def _json_target(value: str, invocation_dir: Path) -> Path:
    """Where --ortdiff-json writes, checked before any test runs: a file path whose nearest existing
    ancestor is a writable directory (missing directories are created when the file is written)."""
    if not value.strip():
        raise pytest.UsageError("--ortdiff-json is empty; give a file path such as jobs/cpu-float32.json")
    target = invocation_dir / value  # an absolute value replaces the invocation dir

    def shown(p: Path) -> str:
        try:
            return str(p.relative_to(invocation_dir))
        except ValueError:
            return str(p)

    if target.is_dir():
        raise pytest.UsageError(f"--ortdiff-json={value}: {shown(target)} is a directory; give a file path such as {Path(value) / 'job.json'}")
    if target.exists() and not target.is_file():
        raise pytest.UsageError(f"--ortdiff-json={value}: {shown(target)} exists and is not a regular file")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise pytest.UsageError(f"--ortdiff-json={value}: {shown(parent)} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"--ortdiff-json={value}: cannot create files in {shown(parent)} (permission denied)")
    return target


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before hypothesis's own plugin loads --hypothesis-profile
    _register_hypothesis_profiles()
    config.addinivalue_line(
        "markers",
        "ortdiff(providers=None, dtypes=None, atol=None, rtol=None, max_ulp=None, budget=None, reproducible=False): run the test "
        "for each provider × dtype (intersected with --ort-providers/--ort-dtypes) and set its tolerance; "
        "values may be per dtype, e.g. atol={'float16': 0.5}; budget={1e-2: 0.001, 1.0: 0} allows 0.1 % of "
        "elements above 1e-2 and none above 1; reproducible=True (or a dict of check_reproducible arguments: "
        "runs, vary, torch_deterministic, session_options) makes ortdiff.check() also check bitwise "
        "reproducibility, and fails a test that never runs such a check",
    )
    raw = config.getini("ortdiff_baseline_max_elements").strip()
    if raw and (not raw.isdigit() or int(raw) < 1):
        raise pytest.UsageError(f"ini ortdiff_baseline_max_elements: expected a positive number of elements such as 65536, got {raw!r}")
    state = _State()
    cli_p = config.getoption("ort_providers")
    _given_but_empty(cli_p, "--ort-providers", "CPU,CUDA (valid: CPU, CUDA, TensorRT, ..., or 'available')")
    _given_but_empty(config.getoption("ort_dtypes"), "--ort-dtypes", f"float32,float16 (valid: {', '.join(TESTABLE)})")
    ini_p = config.getini("ortdiff_providers")
    source = "--ort-providers" if cli_p else "ini ortdiff_providers"
    names = _split(cli_p) or _split(ini_p)
    state.skip_unavailable = bool(config.getoption("ort_skip_unavailable") or config.getini("ortdiff_skip_unavailable"))
    if names:
        providers, wants_available = _parse_providers(names, source)
        state.providers = tuple(providers)
        state.providers_given = True
        state.explicit_providers = frozenset(p for p in providers) if not wants_available else frozenset(
            parse_provider(n) for n in names if n.lower() != "available"
        )
        if not providers:
            raise pytest.UsageError(f"{source}={','.join(names)}: onnxruntime offers no provider here; install pytest-ortdiff[cpu] or [gpu]")
        if not state.skip_unavailable:
            from .providers import unavailable_reason

            for p in state.explicit_providers:
                reason = unavailable_reason(p)
                if reason:
                    raise pytest.UsageError(f"{source}: {reason}. Drop it, or pass --ort-skip-unavailable to skip its tests instead of failing the run")
    d_cli = config.getoption("ort_dtypes")
    d_names = _split(d_cli) or _split(config.getini("ortdiff_dtypes"))
    if d_names:
        state.dtypes = tuple(_parse_dtypes(d_names, "--ort-dtypes" if d_cli else "ini ortdiff_dtypes"))
        state.dtypes_given = True
    state.show_reports = bool(config.getoption("ortdiff_reports") or config.getini("ortdiff_reports"))
    state.json_path = config.getoption("ortdiff_json")
    if state.json_path is not None and not hasattr(config, "workerinput"):  # xdist workers never write it
        state.json_target = _json_target(state.json_path, config.invocation_params.dir)
    config.stash[STATE] = state
    _ACTIVE.append(state)
    config.pluginmanager.register(_Collector(state), "ortdiff-collector")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None and state in _ACTIVE:
        _ACTIVE.remove(state)


# -- parametrization ---------------------------------------------------------------------------


def _marker_list(value: Any, kind: str, test: str) -> list[str]:
    if isinstance(value, str):
        value = _split(value)
    if not isinstance(value, list | tuple) or not value:
        pytest.fail(f"@pytest.mark.ortdiff on {test}: {kind} must be a non-empty list such as ['CPU', 'CUDA'], got {value!r}", pytrace=False)
    out = []
    for name in value:
        try:
            out.append(parse_provider(name) if kind == "providers" else _testable_dtype(name))
        except ValueError as exc:
            pytest.fail(f"@pytest.mark.ortdiff on {test}: {exc}", pytrace=False)
    return out


def _validate_marker(marker: pytest.Mark, test: str) -> None:
    if marker.args:
        pytest.fail(f"@pytest.mark.ortdiff on {test} takes keyword arguments only ({', '.join(_MARKER_KWARGS)}), got positional {marker.args!r}", pytrace=False)
    unknown = sorted(set(marker.kwargs) - set(_MARKER_KWARGS))
    if unknown:
        pytest.fail(f"@pytest.mark.ortdiff on {test}: unknown argument(s) {unknown}; valid: {', '.join(_MARKER_KWARGS)}", pytrace=False)
    try:
        Tolerance.from_marker(marker.kwargs)
    except (TypeError, ValueError) as exc:
        pytest.fail(f"@pytest.mark.ortdiff on {test}: {exc}", pytrace=False)
    repro = marker.kwargs.get("reproducible", False)
    if isinstance(repro, dict):
        bad = sorted(set(repro) - set(_REPRODUCIBLE_KWARGS))
        if bad:
            pytest.fail(f"@pytest.mark.ortdiff on {test}: reproducible: unknown argument(s) {bad}; valid: {', '.join(_REPRODUCIBLE_KWARGS)}", pytrace=False)
    elif not isinstance(repro, bool):
        pytest.fail(f"@pytest.mark.ortdiff on {test}: reproducible must be True, False or a dict of check_reproducible arguments ({', '.join(_REPRODUCIBLE_KWARGS)}), got {repro!r}", pytrace=False)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("ortdiff")
    uses = any(f in metafunc.fixturenames for f in _FIXTURES)
    test = metafunc.definition.nodeid
    if marker is not None:
        _validate_marker(marker, test)
        if not uses:
            pytest.fail(f"@pytest.mark.ortdiff on {test}, which uses none of the fixtures {', '.join(_FIXTURES)}: add the `ortdiff` argument", pytrace=False)
    if not uses:
        return
    state = metafunc.config.stash[STATE]
    providers = list(state.providers)
    dtypes = list(state.dtypes)
    if marker is not None:
        if "providers" in marker.kwargs:
            wanted = _marker_list(marker.kwargs["providers"], "providers", test)
            providers = [p for p in providers if p in wanted] if state.providers_given else wanted
        if "dtypes" in marker.kwargs:
            wanted = _marker_list(marker.kwargs["dtypes"], "dtypes", test)
            dtypes = [d for d in dtypes if d in wanted] if state.dtypes_given else wanted
    params = [pytest.param((p, d), id=f"{p}-{d}") for p in providers for d in dtypes]
    if not params:
        reason = f"no provider × dtype left: marker asks for {marker.kwargs.get('providers', 'any')} × {marker.kwargs.get('dtypes', 'any')}, the run selects {list(state.providers)} × {list(state.dtypes)}" if marker else "no provider × dtype selected"
        params = [pytest.param(("-", "-"), id="ortdiff-none", marks=pytest.mark.skip(reason=reason))]
    metafunc.parametrize("_ortdiff_case", params, indirect=True)


def pytest_itemcollected(item: pytest.Item) -> None:
    case = _case(item)
    if case is not None:
        item.user_properties.append((CASE_KEY, {"provider": case[0], "dtype": case[1]}))


def _case(item: pytest.Item) -> tuple[str, str] | None:
    """(provider, dtype) of a test the plugin parametrized, None for others and for the named-skip case."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or "_ortdiff_case" not in callspec.params or callspec.params["_ortdiff_case"][0] == "-":
        return None
    provider, dtype = callspec.params["_ortdiff_case"]
    return provider, dtype


def pytest_runtest_setup(item: pytest.Item) -> None:
    case = _case(item)
    if case is None:
        return
    provider, dtype = case
    from .providers import unavailable_reason

    reason = unavailable_reason(provider)
    if reason:
        # explicit ones were checked at start-up unless --ort-skip-unavailable: here we only skip
        item.user_properties.append((SKIP_KEY, {"provider": provider, "dtype": dtype, "reason": reason}))
        pytest.skip(reason)


@pytest.hookimpl(trylast=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    # runs after the test body (pytest's own hook) only when it passed: a test marked reproducible=True
    # that passed without running a reproducibility check checked nothing
    marker = item.get_closest_marker("ortdiff")
    if marker is not None and marker.kwargs.get("reproducible"):
        checker = getattr(item, "funcargs", {}).get("ortdiff")
        if checker is None or not getattr(checker, "reproducible_checked", False):
            pytest.fail(
                f"@pytest.mark.ortdiff(reproducible=...) on {item.nodeid}, but the test ran no reproducibility check: "
                "call ortdiff.check(model, feeds) (which runs it when the marker asks) or ortdiff.check_reproducible(model, feeds)",
                pytrace=False,
            )


# -- results -----------------------------------------------------------------------------------


def _baseline_summary(tr: Any, rows: list[dict[str, Any]]) -> None:
    """What happened to stored baselines: files written, and baselines that are missing or corrupted."""
    written = [r for r in rows if r["action"] in ("created", "updated", "replaced corrupted")]
    missing = [r for r in rows if r["action"] == "missing"]
    corrupted = [r for r in rows if r["action"] == "corrupted"]
    if not (written or missing or corrupted):
        return
    tr.write_sep("-", "ortdiff baselines")
    if written:
        tr.write_line(f"wrote {len(written)} baseline(s) (--ortdiff-update-baselines); review and commit them:")
        for r in sorted(written, key=lambda r: r["path"]):
            tr.write_line(f"  {r['action']:<18} {r['path']}")
    if missing:
        tr.write_line(f"{len(missing)} baseline(s) missing: rerun with --ortdiff-update-baselines to create them")
    if corrupted:
        tr.write_line(f"{len(corrupted)} baseline file(s) corrupted and left untouched:")
        tr.write_line("\n".join(f"  {r['path']}" for r in sorted(corrupted, key=lambda r: r["path"])))


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The line that says why a test failed: the exception's first line (a collection error's last `E`)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        text = crash.message
    else:
        lines = str(report.longrepr).splitlines()
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]
        text = errors[-1] if errors else next((line.strip() for line in lines if line.strip()), "")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= 300 else first[:297] + "..."


def _outcome(report: pytest.TestReport) -> str | None:
    """This phase's contribution to the test's outcome (None: a passing setup or teardown says nothing)."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    # other outcomes (pytest-rerunfailures' "rerun") are superseded by the next attempt's
    return "passed" if report.passed and report.when == "call" else None


class _Collector:
    """Receives test reports (on the xdist controller too) and keeps the ortdiff rows and every test's
    outcome in the state."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.state.tests[report.nodeid] = {"test": report.nodeid, "outcome": "error", "message": _message(report)}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is not None:
            entry = self.state.tests.setdefault(report.nodeid, {"test": report.nodeid, "outcome": outcome})
            if OUTCOMES.index(outcome) > OUTCOMES.index(entry["outcome"]):
                entry["outcome"] = outcome
            if outcome in ("failed", "error") and "message" not in entry:
                entry["message"] = _message(report)
        for key, value in report.user_properties:
            if key == CASE_KEY:
                if report.nodeid in self.state.tests:
                    self.state.tests[report.nodeid].update(value)
            elif key == RESULT_KEY and report.when == "call":
                row = dict(value)
                row["test"] = report.nodeid + row.pop("suffix", "")
                # a broken check in a test that xfailed, or that passed anyway (the check ran under
                # pytest.raises), failed as its test expected
                expected = hasattr(report, "wasxfail") or report.passed
                row["outcome"] = "passed" if row.get("passed") else ("xfailed" if expected else "failed")
                self.state.results.append(row)
            elif key == SKIP_KEY and report.skipped:
                self.state.skips.append({**value, "test": report.nodeid})
            elif key == BASELINE_KEY and report.when == "call":
                self.state.baselines.append({**value, "test": report.nodeid})


def pytest_sessionfinish(session: pytest.Session) -> None:
    # runs inside the terminal reporter's own sessionfinish, before the summary that reports it; under
    # xdist only the controller writes (the workers' reports reach it through pytest_runtest_logreport)
    config = session.config
    state = config.stash.get(STATE, None)
    if state is None or state.json_target is None:
        return
    data = {"results": state.results, "skips": state.skips, "tests": list(state.tests.values())}
    try:
        _write_atomically(state.json_target, json.dumps(data, indent=1))
    except OSError as exc:
        # a CI job must not go green without its report
        state.json_message, state.json_failed = f"ortdiff: could not write {state.json_path}: {exc}", True
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    else:
        state.json_message = f"ortdiff: wrote {len(state.results)} result(s) to {state.json_path}"


def _write_atomically(path: Path, text: str) -> None:
    """Write aside in the same directory and rename into place: a reader sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one writer per run: the xdist controller
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from .report import render_table

    state = config.stash[STATE]
    tr = terminalreporter
    if state.results:
        tr.write_sep("=", "ortdiff summary")
        for line in render_table(state.results).splitlines():
            tr.write_line(line)
    if state.skips:
        tr.write_sep("-", "ortdiff: holes in the provider × dtype matrix")
        grouped: dict[str, int] = {}
        for s in state.skips:
            grouped[s["reason"]] = grouped.get(s["reason"], 0) + 1
        for reason, count in sorted(grouped.items()):
            tr.write_line(f"{count} test(s) skipped: {reason}")
    _baseline_summary(tr, state.baselines)
    if state.show_reports and state.results:
        from .diff import DiffReport

        tr.write_sep("-", "ortdiff reports")
        for row in state.results:
            tr.write_line(f"{row['test']} ({row['outcome']}; tolerance {row.get('tolerance', '-')})")
            tr.write_line(DiffReport.from_dict(row["report"]).render())
            tr.write_line("")
    if state.json_message:
        tr.write_line(state.json_message, red=state.json_failed)
