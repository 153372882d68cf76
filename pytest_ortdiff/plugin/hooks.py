"""pytest hooks only: options and ini, the ortdiff marker, provider × dtype parametrization and skips.
Results are collected by session.py; imports neither torch nor onnxruntime at import time."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..numerics.dtypes import TESTABLE, dtype_of, parse_dtype
from ..numerics.results import SkipRow
from ..numerics.tolerance import Tolerance
from ..reports.targets import foreign_report
from ..runtimes import selection
from ..runtimes.providers import (
    KNOWN,
    normalize_provider_options,
    parse_provider,
    parse_provider_options,
    torch_device,
)
from .fixtures import PROVIDER_OPTIONS
from .session import CASE_KEY, SKIP_KEY, RunResults

_FIXTURES = ("ortdiff", "ort_provider", "ort_dtype")  # all depend on _ortdiff_case
_MARKER_KWARGS = ("providers", "dtypes", "atol", "rtol", "max_ulp", "budget", "reproducible", "provider_options")
_REPRODUCIBLE_KWARGS = ("runs", "vary", "torch_deterministic", "session_options", "threads")
DEFAULT_PROVIDERS = selection.DEFAULT.providers
DEFAULT_DTYPES = selection.DEFAULT.dtypes


@dataclass
class _State:
    """The run's options, parsed once at configure time."""

    selection: selection.Selection = selection.DEFAULT
    explicit_providers: frozenset[str] = frozenset()
    providers_given: bool = False
    dtypes_given: bool = False
    skip_unavailable: bool = False

    @property
    def providers(self) -> tuple[str, ...]:
        return self.selection.providers

    @property
    def dtypes(self) -> tuple[str, ...]:
        return self.selection.dtypes


STATE = pytest.StashKey[_State]()
RESULTS = pytest.StashKey[RunResults]()


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
        "--ort-provider-options",
        dest="ort_provider_options",
        action="append",
        default=None,
        metavar="PROVIDER:KEY=VALUE[,KEY=VALUE...]",
        help="onnxruntime options of a provider, as you deploy it, e.g. CUDA:use_tf32=0 (IEEE float32 MatMul/Gemm "
        "on CUDA); repeat for other providers; over ini ortdiff_provider_options, under a marker's provider_options",
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
        "--ortdiff-html",
        dest="ortdiff_html",
        default=None,
        metavar="PATH",
        help="write one self-contained HTML report of the run to PATH (offline: no network, no scripts from "
        "elsewhere): the tests × provider/dtype matrix as a heat map, each check's histogram, tolerance, blame and "
        "baseline drift; `python -m pytest_ortdiff merge --html` makes one for several CI jobs",
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
    parser.addini(
        "ortdiff_cache_mb",
        f"MiB of models each cache (onnxruntime sessions, torch evaluators) keeps, least recently used out first; "
        f"default {selection.DEFAULT_CACHE_MB}; ${selection.CACHE_ENV} overrides it",
        default="",
    )
    parser.addini("ortdiff_providers", "comma list of providers (as --ort-providers)", default="")
    parser.addini("ortdiff_dtypes", "comma list of dtypes (as --ort-dtypes)", default="")
    parser.addini("ortdiff_provider_options", "onnxruntime provider options, one PROVIDER:KEY=VALUE[,KEY=VALUE...] per line (as --ort-provider-options)", type="linelist", default=[])
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
            from ..runtimes.providers import available

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
    """The short name of a dtype the checks can run in: a name, or a torch/numpy dtype object (they name
    one dtype each; an int could be an onnx code or anything else, so it is not taken). ValueError naming
    the valid ones otherwise."""
    if isinstance(name, str):
        d = parse_dtype(name).short
    elif _is_array_dtype(name):
        d = dtype_of(name).short
    else:
        raise ValueError(f"dtypes: {name!r} is not a dtype; valid: {', '.join(TESTABLE)} (names, or torch/numpy dtypes such as torch.float16)")
    if d not in TESTABLE:
        raise ValueError(f"{d} is not a floating dtype to test; valid: {', '.join(TESTABLE)}")
    return d


def _is_array_dtype(value: Any) -> bool:
    """A torch dtype, a numpy dtype, or a numpy scalar type (np.float16), without importing either."""
    kind = value if isinstance(value, type) else type(value)
    return kind.__module__.split(".")[0] in ("torch", "numpy")


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


def _json_target(value: str, invocation_dir: Path, option: str = "--ortdiff-json", example: str = "jobs/cpu-float32.json") -> Path:
    """Where --ortdiff-json (or --ortdiff-html) writes, checked before any test runs: a file path whose
    nearest existing ancestor is a writable directory (missing directories are created when the file is written)."""
    if not value.strip():
        raise pytest.UsageError(f"{option} is empty; give a file path such as {example}")
    target = invocation_dir / value  # an absolute value replaces the invocation dir

    def shown(p: Path) -> str:
        try:
            return str(p.relative_to(invocation_dir))
        except ValueError:
            return str(p)

    if target.is_dir():
        name = Path(example).name if option == "--ortdiff-html" else "job.json"
        raise pytest.UsageError(f"{option}={value}: {shown(target)} is a directory; give a file path such as {Path(value) / name}")
    if target.exists() and not target.is_file():
        raise pytest.UsageError(f"{option}={value}: {shown(target)} exists and is not a regular file")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise pytest.UsageError(f"{option}={value}: {shown(parent)} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise pytest.UsageError(f"{option}={value}: cannot create files in {shown(parent)} (permission denied)")
    why = foreign_report(target, "html" if option == "--ortdiff-html" else "json")
    if why:
        # (`--ortdiff-json tests/test_models.py`, a space for the `=`, names the module: it would be lost)
        raise pytest.UsageError(
            f"{option}={value}: {shown(target)} exists and {why}, so it is not overwritten: give the report a path "
            f"of its own, e.g. {option}={example}, or remove the file first if it is to be replaced"
        )
    return target


def _same_file(a: Path, b: Path) -> bool:
    """Whether two report paths end up as one file (`out/r` and `out/./r`, or links to one)."""
    if os.path.abspath(a) == os.path.abspath(b):
        return True
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before hypothesis's own plugin loads --hypothesis-profile
    _register_hypothesis_profiles()
    # xdist registers it too; without xdist the GPU cases' group mark must still be a known marker
    config.addinivalue_line("markers", "xdist_group(name): run the tests of one group on one xdist worker (--dist loadgroup)")
    from .. import progress

    progress.configure_for_pytest(config)  # long work draws its bar past the capture; none under -q or xdist
    config.addinivalue_line(
        "markers",
        "ortdiff(providers=None, dtypes=None, atol=None, rtol=None, max_ulp=None, budget=None, reproducible=False, provider_options=None): run the test "
        "for each provider × dtype (intersected with --ort-providers/--ort-dtypes) and set its tolerance; "
        "values may be per dtype, e.g. atol={'float16': 0.5}; budget={1e-2: 0.001, 1.0: 0} allows 0.1 % of "
        "elements above 1e-2 and none above 1; reproducible=True (or a dict of check_reproducible arguments: "
        "runs, vary, torch_deterministic, session_options, threads) makes ortdiff.check() also check bitwise "
        "reproducibility, and fails a test that never runs such a check; provider_options={'CUDA': {'use_tf32': 0}} sets "
        "onnxruntime's options for the test (over --ort-provider-options)",
    )
    baseline_dir = config.getoption("ortdiff_baseline_dir")
    if baseline_dir is not None and not baseline_dir.strip():
        # an unset CI variable: baselines would quietly go to (and be read from) the default place
        raise pytest.UsageError("--ortdiff-baseline-dir is empty; give a directory such as tests/baselines, or leave the option out for the default")
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
    providers = DEFAULT_PROVIDERS
    if names:
        parsed, wants_available = _parse_providers(names, source)
        providers = tuple(parsed)
        state.providers_given = True
        state.explicit_providers = frozenset(parsed) if not wants_available else frozenset(
            parse_provider(n) for n in names if n.lower() != "available"
        )
        if not parsed:
            raise pytest.UsageError(f"{source}={','.join(names)}: onnxruntime offers no provider here; install pytest-ortdiff[cpu] or [gpu]")
        if not state.skip_unavailable:
            from ..runtimes.providers import unavailable_reason

            for p in state.explicit_providers:
                reason = unavailable_reason(p)
                if reason:
                    raise pytest.UsageError(f"{source}: {reason}. Drop it, or pass --ort-skip-unavailable to skip its tests instead of failing the run")
    dtypes = DEFAULT_DTYPES
    d_cli = config.getoption("ort_dtypes")
    d_names = _split(d_cli) or _split(config.getini("ortdiff_dtypes"))
    if d_names:
        dtypes = tuple(_parse_dtypes(d_names, "--ort-dtypes" if d_cli else "ini ortdiff_dtypes"))
        state.dtypes_given = True
    cache_mb = None
    try:
        env = os.environ.get(selection.CACHE_ENV, "")
        if env.strip():
            selection.parse_cache_mb(env, f"${selection.CACHE_ENV}")
        ini_cache = config.getini("ortdiff_cache_mb").strip()
        if ini_cache:
            cache_mb = selection.parse_cache_mb(ini_cache, "ini ortdiff_cache_mb")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    state.selection = selection.Selection(providers, dtypes, cache_mb)
    config.stash[PROVIDER_OPTIONS] = _provider_options(config)
    _apply_threads()
    results = RunResults(
        json_path=config.getoption("ortdiff_json"),
        html_path=config.getoption("ortdiff_html"),
        show_reports=bool(config.getoption("ortdiff_reports") or config.getini("ortdiff_reports")),
        providers=state.selection.providers,
        dtypes=state.selection.dtypes,
    )
    results.hide_internal = not hasattr(config, "workerinput")
    if not hasattr(config, "workerinput"):  # xdist workers never write the reports
        if results.html_path is not None:
            results.html_target = _json_target(results.html_path, config.invocation_params.dir, "--ortdiff-html", "reports/ortdiff.html")
        if results.json_path is not None:
            results.json_target = _json_target(results.json_path, config.invocation_params.dir)
        if results.json_target is not None and results.html_target is not None and _same_file(results.json_target, results.html_target):
            raise pytest.UsageError(f"--ortdiff-json and --ortdiff-html name one file ({results.json_path}): give each report its own path")
        if not config.getoption("help", False):  # (--help runs no session that would finish the files)
            results.mark_running()
    config.stash[STATE] = state
    config.stash[RESULTS] = results
    selection.activate(state.selection)
    config.pluginmanager.register(results, "ortdiff-session")


def _apply_threads() -> None:
    """$ORTDIFF_THREADS=N: torch computes on N threads (onnxruntime's sessions take N intra-op threads where
    their options name none): a run's numbers then do not depend on the machine's cores."""
    raw = os.environ.get("ORTDIFF_THREADS", "").strip()
    if not raw:
        return
    from ..runtimes.ort import threads_from_env  # (imports torch: only when asked for)

    try:
        n = threads_from_env()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    import torch

    torch.set_num_threads(n or 1)


def _provider_options(config: pytest.Config) -> dict[str, dict[str, str]]:
    """The run's provider options: the ini file's lines, then each --ort-provider-options over them."""
    out: dict[str, dict[str, str]] = {}
    sources = [(line, "ini ortdiff_provider_options") for line in config.getini("ortdiff_provider_options") if line.strip()]
    sources += [(spec, "--ort-provider-options") for spec in config.getoption("ort_provider_options") or []]
    for spec, source in sources:
        try:
            parsed = parse_provider_options(spec, source)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        for provider, options in parsed.items():
            out.setdefault(provider, {}).update(options)
    return out


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        selection.deactivate(state.selection)


# -- parametrization ---------------------------------------------------------------------------


def _marker_list(value: Any, kind: str, test: str) -> list[str]:
    if isinstance(value, str):
        value = _split(value)
    if not isinstance(value, list | tuple) or not value:
        pytest.fail(f"@pytest.mark.ortdiff on {test}: {kind} must be a non-empty list such as ['CPU', 'CUDA'], got {value!r}", pytrace=False)
    out = []
    for name in value:
        if kind == "providers" and not isinstance(name, str):
            pytest.fail(f"@pytest.mark.ortdiff on {test}: providers: {name!r} is not a provider name; valid: {', '.join(KNOWN)}", pytrace=False)
        try:
            parsed = parse_provider(name) if kind == "providers" else _testable_dtype(name)
        except ValueError as exc:
            pytest.fail(f"@pytest.mark.ortdiff on {test}: {exc}", pytrace=False)
        # one case per dtype or provider, however it is spelt ("float16", "fp16", torch.float16): ids that
        # depended on the command line ([CPU-float16_0] here, [CPU-float16] with --ort-dtypes) lost baselines
        if parsed not in out:
            out.append(parsed)
    return out


def _validate_marker(marker: pytest.Mark, test: str) -> None:
    if marker.args:
        pytest.fail(f"@pytest.mark.ortdiff on {test} takes keyword arguments only ({', '.join(_MARKER_KWARGS)}), got positional {marker.args!r}", pytrace=False)
    unknown = sorted(set(marker.kwargs) - set(_MARKER_KWARGS))
    if unknown:
        import difflib

        near = [m for k in unknown for m in difflib.get_close_matches(k, _MARKER_KWARGS, n=1)]
        hint = f" (did you mean {', '.join(map(repr, near))}?)" if near else ""
        pytest.fail(f"@pytest.mark.ortdiff on {test}: unknown argument(s) {unknown}{hint}; valid: {', '.join(_MARKER_KWARGS)}", pytrace=False)
    try:
        Tolerance.from_marker(marker.kwargs)
        normalize_provider_options(marker.kwargs.get("provider_options"))
    except (TypeError, ValueError) as exc:
        pytest.fail(f"@pytest.mark.ortdiff on {test}: {exc}", pytrace=False)
    repro = marker.kwargs.get("reproducible", False)
    if isinstance(repro, dict):
        bad = sorted(set(repro) - set(_REPRODUCIBLE_KWARGS))
        if bad:
            pytest.fail(f"@pytest.mark.ortdiff on {test}: reproducible: unknown argument(s) {bad}; valid: {', '.join(_REPRODUCIBLE_KWARGS)}", pytrace=False)
        problem = _reproducible_problem(repro)
        if problem:
            pytest.fail(f"@pytest.mark.ortdiff on {test}: reproducible: {problem}", pytrace=False)
    elif not isinstance(repro, bool):
        pytest.fail(f"@pytest.mark.ortdiff on {test}: reproducible must be True, False or a dict of check_reproducible arguments ({', '.join(_REPRODUCIBLE_KWARGS)}), got {repro!r}", pytrace=False)


def _reproducible_problem(args: dict[str, Any]) -> str | None:
    """What is wrong with the check_reproducible arguments of a marker (None: nothing), said at collection
    rather than as a traceback inside the test."""
    if "vary" in args:
        # (imports torch: only for a marker that names variations)
        from ..engine.reproducible import VARIATIONS

        vary = args["vary"]
        names = [vary] if isinstance(vary, str) else vary
        if not isinstance(names, list | tuple) or not all(isinstance(v, str) for v in names):
            return f"vary must be a list of variations such as ['threads']; valid: {', '.join(VARIATIONS)}; got {vary!r}"
        unknown = [v for v in names if v not in VARIATIONS]
        if unknown:
            return f"vary: unknown variation(s) {unknown}; valid: {', '.join(VARIATIONS)}"
    threads = args.get("threads", [1, 2])
    if not isinstance(threads, list | tuple) or len(threads) < 2 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in threads):
        return f"threads must list at least two thread counts such as [1, 2, 4], got {threads!r}"
    runs = args.get("runs", 2)
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        return f"runs must be a positive number of runs such as 5, got {runs!r}"
    return None


def _wants_reproducible(value: Any) -> bool:
    """True, or a dict of check_reproducible arguments (an empty one: its defaults), asks for the check."""
    return value is True or isinstance(value, dict)


_GPU_GROUP = pytest.mark.xdist_group("ortdiff-gpu")


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
    # GPU cases share one device: under `--dist loadgroup` they run on one xdist worker, never two at once
    params = [pytest.param((p, d), id=f"{p}-{d}", marks=_GPU_GROUP if torch_device(p) != "cpu" else ()) for p in providers for d in dtypes]
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
    from ..runtimes.providers import unavailable_reason

    reason = unavailable_reason(provider)
    if reason:
        # explicit ones were checked at start-up unless --ort-skip-unavailable: here we only skip
        item.user_properties.append((SKIP_KEY, SkipRow(provider, dtype, reason).to_dict()))
        pytest.skip(reason)


@pytest.hookimpl(trylast=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    # runs after the test body (pytest's own hook) only when it passed: a test marked reproducible=True
    # that passed without running a reproducibility check checked nothing
    marker = item.get_closest_marker("ortdiff")
    if marker is not None and _wants_reproducible(marker.kwargs.get("reproducible")):
        checker = getattr(item, "funcargs", {}).get("ortdiff")
        if checker is None or not getattr(checker, "reproducible_checked", False):
            pytest.fail(
                f"@pytest.mark.ortdiff(reproducible=...) on {item.nodeid}, but the test ran no reproducibility check: "
                "call ortdiff.check(model, feeds) (which runs it when the marker asks) or ortdiff.check_reproducible(model, feeds)",
                pytrace=False,
            )
