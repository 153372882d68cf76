"""`python -m pytest_ortdiff ...`: merge CI jobs' JSON reports into one matrix or table; compare a model file's
torch-evaluator and onnxruntime outputs, blame its nodes, diff it against its deployed form, audit it for
float16; run ONNX's node test suite through the evaluator; run the demo. Arguments are checked before torch,
onnxruntime and onnx are imported: --help and a bad argument answer at once."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .numerics.formatting import printable as _printable
from .numerics.results import (
    BaselineRow,
    CheckRow,
    ResultsFile,
    ResultsFileError,
    SkipRow,
    TestOutcome,
)

if TYPE_CHECKING:
    from .runtimes.model_io import InputSpec

__all__ = ["main"]


def _merge(args: argparse.Namespace) -> int:
    from collections import Counter

    from .reports.targets import foreign_report

    # as pytest's --ortdiff-json/--ortdiff-html: a path holding something else than our report is kept
    for flag, value, kind in (("--output", args.output, "json"), ("--html", args.html, "html")):
        why = foreign_report(Path(value), kind) if value else None  # type: ignore[arg-type]
        if why:
            print(f"error: {flag} {_printable(value)}: {why}, so it is not overwritten: give the report a path of its own", file=sys.stderr)
            return 2
    from .reports.matrix import job_labels, pivot

    same, identical = _same_files(args.files)
    if same:  # one path twice (a shell glob and a name): every check would count twice
        print(f"error: {same}: a job merged twice counts every check twice; give each job's file once", file=sys.stderr)
        return 2
    if identical:  # (two jobs may agree byte for byte; one artifact downloaded twice does too: said, not refused)
        print(f"note: {identical}: if they are one job's file twice (one artifact downloaded twice), every count below is doubled", file=sys.stderr)
    files: list[ResultsFile] = []
    for name in args.files:
        try:
            files.append(_read_results(Path(name)))
        except ResultsFileError as exc:
            print(f"error: {_printable(str(exc))}", file=sys.stderr)
            return 2
    stems = [Path(name).stem for name in args.files]
    if args.label is not None and len(args.label) != len(files):
        print(f"error: --label given {len(args.label)} time(s) for {len(files)} file(s): give one label per file, in the files' order", file=sys.stderr)
        return 2
    labels = list(args.label) if args.label is not None else stems if args.label_from_file else job_labels(files, stems)
    matrix = pivot(files, labels)
    rows: list[CheckRow] = []
    skips: list[SkipRow] = []
    tests: list[TestOutcome] = []
    baselines: list[BaselineRow] = []
    uncovered: list[CheckRow] = []
    for data, stem in zip(files, stems, strict=True):
        job = _printable(stem) if args.label_from_file else ""

        def labelled(test: str, job: str = job) -> str:
            return f"{test} ({job})" if job else test

        uncovered.extend(replace(r, test=labelled(r.test)) for r in data.test_rows())
        rows.extend(replace(r, test=labelled(r.test)) for r in data.results)
        tests.extend(replace(t, test=labelled(t.test)) for t in data.tests)
        skips.extend(data.skips)
        baselines.extend(replace(b, test=labelled(b.test)) if b.test else b for b in data.baselines)

    def order(r: CheckRow) -> tuple[str, str, str]:
        return (r.test, r.provider or "", r.dtype or "")

    rows.sort(key=order)
    # the matrix when the files cover several cases (or asked for), the row listing otherwise (or asked for)
    as_matrix = args.matrix or (not args.rows and matrix.cases > 1)
    try:
        if as_matrix and args.markdown:
            print(matrix.render_markdown(limit=_MARKDOWN_BODY), end="")
        elif as_matrix:
            width = args.width or _terminal_width()
            print("\n".join(_printable(line) for line in matrix.render_text(width).splitlines()))
        elif args.markdown:
            print(_markdown_rows(sorted(rows + uncovered, key=order), tests, skips), end="")
        else:
            from .numerics.report import render_table

            print(render_table([_shown(r) for r in sorted(rows + uncovered, key=order)]))
    except (ValueError, TypeError, OverflowError) as exc:  # a value _read_results let through and the table cannot show
        print(f"error: cannot render the merged table: {_printable(str(exc))}", file=sys.stderr)
        return 2
    # (rows of files written before "xfailed" existed have only passed/failed)
    failed = sum(1 for r in rows if not r.ok)
    expected = sum(1 for r in rows if r.outcome == "xfailed")
    tail = f", {expected} expected to fail (xfailed)" if expected else ""
    print(f"\n{len(rows)} check(s) from {len(args.files)} file(s): {len(rows) - failed - expected} passed, {failed} failed{tail}")
    counts = Counter(t.outcome for t in tests)
    if tests:
        extra = "".join(f", {counts[o]} {o}" for o in ("xfailed", "xpassed") if counts[o])
        print(f"{len(tests)} test(s): {counts['passed']} passed, {counts['failed']} failed, {counts['error']} error(s), {counts['skipped']} skipped{extra}")
    conflicts = matrix.counts().get("conflict", 0)
    if conflicts:
        print(f"{conflicts} conflicting cell(s): jobs report one test and case differently (see the matrix{'' if as_matrix else ': merge --matrix'})")
    if not as_matrix and not args.markdown:  # (the matrix's notes say these already, and the markdown's list)
        for t in tests:
            if t.outcome in ("failed", "error"):
                print(f"{'failed' if t.outcome == 'failed' else 'errored'}: {_printable(t.test)}" + (f": {_printable(t.message)}" if t.message else ""))
        for sk in skips:
            print(f"skipped: {_printable(sk.test or '?')}: {_printable(sk.reason)}")
    if args.output:
        try:
            ResultsFile(tuple(rows), tuple(skips), tuple(tests), baselines=tuple(baselines)).write(Path(args.output))
        except OSError as exc:
            print(f"error: --output {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if args.html:
        from .reports.htmlreport import write_html

        try:
            write_html(Path(args.html), files, labels)
        except OSError as exc:
            print(f"error: --html {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 1 if (failed or counts["failed"] or counts["error"] or conflicts) and args.strict else 0


def _same_files(names: Sequence[str]) -> tuple[str | None, str | None]:
    """("a.json and b.json are one file", "c.json and d.json hold the same report (identical bytes)"): the first
    two of `names` that are one file, and the first two distinct regular files with the same bytes (None:
    none). Only files of equal size are read, in chunks; a pipe is never read here (merge reads it once)."""
    import hashlib
    import os
    import stat

    files: dict[tuple[int, int], str] = {}
    by_size: dict[int, list[str]] = {}
    same = identical = None
    for name in names:
        try:
            st = os.stat(name)
        except OSError:
            continue  # (reading it is _read_results's to report)
        key = (st.st_dev, st.st_ino)
        if key in files:
            same = same or f"{_printable(files[key])} and {_printable(name)} are one file"
            continue
        files[key] = name
        if stat.S_ISREG(st.st_mode):
            by_size.setdefault(st.st_size, []).append(name)

    def digest(name: str) -> str | None:
        h = hashlib.sha256()
        try:
            with open(name, "rb") as f:
                for chunk in iter(lambda: f.read(2**20), b""):
                    h.update(chunk)
        except OSError:
            return None
        return h.hexdigest()

    for group in (g for g in by_size.values() if len(g) > 1):
        seen: dict[str, str] = {}
        for name in group:
            d = digest(name)
            if d is not None and d in seen and identical is None:
                identical = f"{_printable(seen[d])} and {_printable(name)} hold the same report (identical bytes)"
            if d is not None:
                seen.setdefault(d, name)
    return same, identical


def _terminal_width() -> int:
    """The terminal's width when there is one (or $COLUMNS says it); no limit for a pipe or a CI log."""
    import os
    import shutil

    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return shutil.get_terminal_size().columns
    return sys.maxsize


#: fields of a row that must be a string (or null) and of its report that must be an integer (or null)
_TEXT_FIELDS = ("test", "provider", "dtype", "worst", "tolerance", "outcome", "suffix", "message", "reason")
_COUNT_FIELDS = ("n", "nan_mismatch", "inf_mismatch")
#: fields of a row's blame table that must be a list (or null)
_BLAME_LISTS = ("rows", "by_op_type", "by_scope", "notes")


def _read_results(path: Path) -> ResultsFile:
    """ResultsFile.read, plus what it lets through: nesting too deep for the JSON parser, and values of
    the wrong type (a number for a provider, a string for a count), each one ResultsFileError naming the
    file, the row and the field — never a traceback."""
    import json

    try:
        data = ResultsFile.read(path)
    except RecursionError:
        raise ResultsFileError(f"{path} is nested too deeply to be a JSON report written by --ortdiff-json") from None
    raw = json.loads(path.read_text(encoding="utf-8"))  # read fine just above
    if not isinstance(raw, Mapping):
        return data
    for key in ("results", "tests", "skips"):
        items = raw.get(key) or []
        for i, row in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(row, Mapping):
                continue
            for field in _TEXT_FIELDS:
                value = row.get(field)
                if value is not None and not isinstance(value, str):
                    raise ResultsFileError(f"{path}: {key}[{i}] has {field!r} {_short(value)} ({type(value).__name__}); expected a string or null")
            blame = row.get("blame")
            if blame is not None and not isinstance(blame, Mapping):
                raise ResultsFileError(f"{path}: {key}[{i}] has 'blame' {_short(blame)} ({type(blame).__name__}); expected an object")
            for field in _BLAME_LISTS:
                value = blame.get(field) if isinstance(blame, Mapping) else None
                if value is not None and not isinstance(value, list):
                    raise ResultsFileError(f"{path}: {key}[{i}].blame has {field!r} {_short(value)} ({type(value).__name__}); expected a list")
            report = row.get("report")
            if not isinstance(report, Mapping):
                continue
            for field in _COUNT_FIELDS:
                value = report.get(field)
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ResultsFileError(f"{path}: {key}[{i}].report has {field!r} {_short(value)} ({type(value).__name__}); expected an integer")
            counts = report.get("counts")
            if counts is not None and not (isinstance(counts, Mapping) and all(isinstance(c, int) and not isinstance(c, bool) for c in counts.values())):
                raise ResultsFileError(f"{path}: {key}[{i}].report has 'counts' {_short(counts)}; expected an object of integers")
    return data


def _short(value: Any) -> str:
    text = _printable(repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _shown(row: CheckRow, markdown: bool = False) -> CheckRow:
    """The row as the table shows it: control characters escaped, and in markdown every character that would
    form a link, an image, HTML or a column (`formatting.markdown_text`)."""
    from .numerics.formatting import markdown_text

    def text(value: str | None) -> str | None:
        if value is None:
            return None
        return markdown_text(value) if markdown else _printable(value)

    return replace(
        row,
        test=text(row.test) or "",
        provider=text(row.provider),
        dtype=text(row.dtype),
        worst=text(row.worst) or "",
        outcome=text(row.outcome),
        ran_on_ort=tuple(text(op) or "" for op in row.ran_on_ort),
    )


#: what the markdown's table and lists may take: the lines merge prints after them (the counts) fit below
#: MARKDOWN_LIMIT too
_MARKDOWN_BODY = 59_000


def _markdown_rows(table: Sequence[CheckRow], tests: Sequence[TestOutcome], skips: Sequence[SkipRow]) -> str:
    """The row listing in markdown: the table, then the failed tests and the skips as list items, in at most
    _MARKDOWN_BODY characters: the failing rows first, then the list, then the passing rows, as many as fit,
    and a note saying what was left out."""
    from .numerics.formatting import markdown_text
    from .numerics.report import render_table
    from .reports.matrix import MARKDOWN_LIMIT

    head, sep, *lines = render_table([_shown(r, markdown=True) for r in table], markdown=True).splitlines()
    notes = [
        f"- {'failed' if t.outcome == 'failed' else 'errored'}: {markdown_text(t.test)}" + (f": {markdown_text(t.message)}" if t.message else "")
        for t in tests
        if t.outcome in ("failed", "error")
    ]
    notes += [f"- skipped: {markdown_text(sk.test or '?')}: {markdown_text(sk.reason)}" for sk in skips]
    failing = [i for i, r in enumerate(table) if not r.ok]
    passing = [i for i, r in enumerate(table) if r.ok]
    room = _MARKDOWN_BODY - len(head) - len(sep) - 800  # (the note's room)
    kept: list[int] = []
    for i in failing:
        if len(lines[i]) + 1 > room:
            break
        kept.append(i)
        room -= len(lines[i]) + 1
    listed = 0
    while listed < len(notes) and len(notes[listed]) + 1 <= room:
        room -= len(notes[listed]) + 1
        listed += 1
    shown_passing = 0
    for i in passing:
        if len(lines[i]) + 1 > room:
            break
        kept.append(i)
        room -= len(lines[i]) + 1
        shown_passing += 1
    out = [head, sep, *(lines[i] for i in sorted(kept))]
    left = [
        (len(failing) - (len(kept) - shown_passing), f"{len(failing) - (len(kept) - shown_passing):,} of {len(failing):,} failing rows"),
        (len(passing) - shown_passing, f"{len(passing) - shown_passing:,} of {len(passing):,} passing rows"),
        (len(notes) - listed, f"{len(notes) - listed:,} of {len(notes):,} failed tests and skips"),
    ]
    if any(n for n, _ in left):
        out += ["", f"_Cut to stay under {MARKDOWN_LIMIT:,} characters (a GitHub comment holds 65,536): " + "; ".join(w for n, w in left if n) + " not shown. All of it: `merge` without --markdown, or --html._"]
    if listed:
        out += ["", *notes[:listed]]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------
# compare, blame, diff, precision: model files run on drawn or given feeds


class _CompareError(Exception):
    """A bad model or argument: one line on stderr, exit status 2."""


def _command(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`handler` behind the arguments' checks that need no heavy import (files, numbers, names), each bad
    argument one `error:` line (its names from a model file escaped) and exit status 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            _precheck(args)
            return handler(args)
        except _CompareError as exc:
            print(f"error: {_printable(str(exc))}", file=sys.stderr)
            return 2

    return run


def _say(text: str) -> None:
    """Print text that names what a model file named (inputs, outputs, op types): its lines, never an escape
    sequence of the file's."""
    print("\n".join(_printable(line) for line in text.split("\n")))


def _precheck(args: argparse.Namespace) -> None:
    """What can be checked before torch, onnxruntime and onnx are imported (seconds): the files exist, the
    numbers and names are well formed, the provider is one we know, the tolerance is a tolerance."""
    from .runtimes.providers import parse_provider

    for attr in ("model", "original", "deployed"):
        name = getattr(args, attr, None)
        if name is not None:
            _check_file(name, "model file")
    if getattr(args, "feeds", None):
        _check_file(args.feeds, "--feeds", missing=f"--feeds {args.feeds}: the file does not exist")
    if not 0 <= args.seed < 2**63 - max(getattr(args, "samples", 1), 1):
        raise _CompareError(f"--seed {args.seed}: expected an integer from 0 to 2**63-1")
    _dim_items(args.dim or ())
    _range_items(args.input_range or ())
    _kernel_items(getattr(args, "ort_kernel", None) or ())
    try:
        args.provider = parse_provider(args.provider)
    except ValueError as exc:
        raise _CompareError(f"--provider {args.provider}: {exc}") from None
    args.tolerance = _tolerance(args)


def _check_file(name: str, what: str, missing: str | None = None) -> None:
    import os

    if not os.path.exists(name):
        raise _CompareError(missing or f"{what} {name!r} does not exist")
    if os.path.isdir(name):
        raise _CompareError(f"{what} {name!r} is a directory, not a file")
    if not os.path.isfile(name):  # (a device such as /dev/zero reads without end, a pipe waits for a writer)
        raise _CompareError(f"{what} {name!r} is not a regular file (a device, a pipe or a socket): save it to a file first")


def _tolerance(args: argparse.Namespace) -> Any:
    """--atol/--rtol/--max-ulp/--budget as a Tolerance (None: the dtype's defaults)."""
    from .numerics.tolerance import Tolerance, parse_budget

    given = {k: getattr(args, k, None) for k in ("atol", "rtol", "max_ulp")}
    budget = getattr(args, "budget", None)
    for key, value in given.items():
        if value is not None and not value >= 0:  # (NaN too; inf allowed: no bound)
            raise _CompareError(f"--{key.replace('_', '-')} {_num(value)}: expected a number >= 0")
        if value is not None:
            try:
                Tolerance(**{key: value})
            except ValueError as exc:
                raise _CompareError(f"--{key.replace('_', '-')} {_num(value)}: {exc}") from None
    try:
        parsed = parse_budget(budget) if budget else None
        tolerance = Tolerance(**{k: v for k, v in given.items() if v is not None}, budget=parsed)
    except ValueError as exc:
        raise _CompareError(str(exc) if str(exc).startswith("--budget") else f"--budget: {exc}") from None
    return None if tolerance.is_empty else tolerance


@dataclass
class _Model:
    """A model file ready to run: checked, its feeds' names, dims and ranges parsed against its inputs, and
    (with --dtype) converted."""

    path: str
    checked: Any  # CheckedModel
    specs: Mapping[str, InputSpec]  # the inputs as the file declares them (feeds are drawn for these)
    given: dict[str, Any]
    dims: dict[str, int]
    ranges: dict[str, tuple[float, float]]
    kernels: dict[tuple[str, str], str]
    dtype: str
    converted_from: str | None = None
    drawn: Any = None  # the model the feeds are drawn for: the file's (a conversion's inputs are cast from them)

    @property
    def proto(self) -> Any:
        return self.checked.proto

    def feeds(self, seed: int, device: str) -> dict[str, Any]:
        """The inputs from --feeds and the others drawn (seed `seed`), cast to the model's input dtypes."""
        try:
            feeds = _draw_feeds(self.drawn if self.drawn is not None else self.proto, self.specs, self.given, self.dims, self.ranges, seed=seed, device=device)
        except (ValueError, TypeError, RuntimeError, OverflowError, MemoryError) as exc:  # what _check_drawable did not foresee
            raise _CompareError(f"cannot draw feeds for {self.path}: {exc}; give the inputs' values with --feeds FILE.npz") from None
        return _cast_feeds(feeds, self.proto) if self.converted_from else feeds


def _open_model(args: argparse.Namespace, path: str, *, dtype: str | None = None, fed: bool = True) -> _Model:
    """`path` loaded and checked, --feeds/--dim/--input-range/--ort-kernel parsed against it (unless not `fed`:
    a model whose feeds come from another), converted to `dtype` (a float32 model only: onnxruntime's float16
    converter, every node)."""
    from .runtimes.model_io import input_specs

    checked = _load_checked(path)
    model = checked.proto
    specs = input_specs(model)
    if not fed:
        _numeric_outputs(path, model)
        return _Model(path, checked, specs, {}, {}, {}, {}, _model_dtype(model))
    given = _load_feeds(args.feeds, specs) if getattr(args, "feeds", None) else {}
    dims = _parse_dims(args.dim or (), model, specs, given, getattr(args, "feeds", None))
    _check_drawable(specs, given, dims)
    _numeric_outputs(path, model)
    ranges = _parse_ranges(args.input_range or (), specs, given, getattr(args, "feeds", None))
    kernels = _parse_kernels(getattr(args, "ort_kernel", None) or (), model)
    own = _model_dtype(model)
    opened = _Model(path, checked, specs, given, dims, ranges, kernels, own)
    if dtype is None or dtype == own:
        return opened
    if own != "float32":
        raise _CompareError(
            f"--dtype {dtype}: the model computes in {own}; compare converts a float32 model to float16 or bfloat16, not back "
            "(give the float32 model, or leave --dtype out)"
        )
    from .analyses.precision.keep import convert_half
    from .runtimes.model_io import InvalidModelError, check_model

    try:
        converted = convert_half(model, (), dtype=dtype, keep_io_types=False, op_block_list=[])
        opened.checked = check_model(converted, subject=f"{path} converted to {dtype}")
    except (InvalidModelError, ValueError) as exc:
        raise _CompareError(f"--dtype {dtype}: onnxruntime's float16 converter cannot convert {path}: {exc}") from None
    opened.dtype, opened.converted_from, opened.drawn = dtype, own, model
    return opened


def _numeric_outputs(path: str, model: Any) -> None:
    """Every graph output a tensor of numbers or bools (what the commands compare), else one line naming it."""
    import onnx

    for out in model.graph.output:
        kind = out.type.WhichOneof("value")
        if kind == "tensor_type" and out.type.tensor_type.elem_type == onnx.TensorProto.STRING:
            raise _CompareError(
                f"{path}: output {out.name!r} is a string tensor; the commands compare tensors of numbers (and bools): "
                "compare the graph up to the node that makes strings (onnx.utils.extract_model)"
            )
        if kind not in ("tensor_type", None):
            raise _CompareError(f"{path}: output {out.name!r} is a {kind.replace('_type', '')}, not a tensor; the commands compare tensor outputs")


def _cast_feeds(feeds: Mapping[str, Any], model: Any) -> dict[str, Any]:
    """Floating feeds cast to the model's floating input dtypes (a float16 conversion takes float16 inputs)."""
    from .runtimes.model_io import input_specs

    specs = input_specs(model)
    out = {}
    for name, value in feeds.items():
        want = specs[name].torch_dtype if name in specs else None
        if want is not None and value.is_floating_point() and want.is_floating_point and value.dtype != want:
            value = value.to(want)
        out[name] = value
    return out


def _notes(args: argparse.Namespace, m: _Model) -> str:
    """"; feeds from F: x; input ranges: ids=[0, 2); with onnxruntime: Op": what the first line adds."""
    notes = ""
    if m.converted_from:
        how = "" if m.dtype == "float16" else f" (its float16 retyped to {m.dtype}, weights rounded from the {m.converted_from} ones)"
        notes += f"; converted from {m.converted_from} by onnxruntime's float16 converter{how}, every node"
    if m.given:
        notes += f"; feeds from {args.feeds}: {', '.join(m.given)}"
    if m.ranges:
        notes += "; input ranges: " + ", ".join(f"{n}=[{_num(lo)}, {_num(hi)})" for n, (lo, hi) in m.ranges.items())
    if m.kernels:
        notes += f"; with onnxruntime: {', '.join(args.ort_kernel)}"
    if getattr(args, "missing", "error") == "ort":
        notes += "; ops without a torch kernel on onnxruntime"
    return notes


_T = TypeVar("_T")


def _engine(run: Callable[[], _T], m: _Model) -> _T:
    """`run()`, what the runtimes refuse (an op without a kernel, a model onnxruntime rejects) as one line."""
    try:
        return run()
    except Exception as exc:
        error = _engine_error(exc, m)
        if error is None:
            raise
        raise error from None


def _engine_error(exc: BaseException, m: _Model) -> _CompareError | None:
    """The one line for what running the model raised (None: not a refusal we know; raised as it is)."""
    from .engine.check import OrtRunError, UnsupportedByProvider, _from_onnxruntime
    from .runtimes.evaluator import MissingKernelError
    from .runtimes.ort import UnsupportedByProviderError
    from .runtimes.providers import KNOWN

    fix = "so there is nothing to compare the torch evaluator with: use a provider that has it (e.g. --provider CUDA) or another --dtype"
    if isinstance(exc, UnsupportedByProvider):  # a (provider, dtype, op) onnxruntime does not implement
        return _CompareError(f"{exc.reason}, {fix}")
    if isinstance(exc, UnsupportedByProviderError):  # (the same, met outside a check: blame's, precision's runs)
        return _CompareError(f"{exc.provider}-{m.dtype}: onnxruntime {KNOWN.get(exc.provider, exc.provider)} has no {m.dtype} kernel for {exc.op}, {fix}")
    if isinstance(exc, MissingKernelError):
        return _CompareError(_missing_kernel_message(exc))
    hint = _drawn_hint(m.proto, m.specs, m.given, m.ranges)
    if isinstance(exc, OrtRunError):
        return _CompareError(f"onnxruntime cannot run {m.path}: {exc.detail}{hint}")
    if _from_onnxruntime(exc):
        text = str(exc).strip()
        return _CompareError(f"onnxruntime cannot run {m.path}: {text.splitlines()[0] if text else type(exc).__name__}{hint}")
    return None


def _judged(checker: Any, m: _Model) -> tuple[str, Any]:
    """The dtype a check of the model judges in (a float16 model behind float32 I/O: float16) and the
    tolerance resolved for it."""
    judged = checker.judged_dtype(m.checked)
    return judged, checker.tolerance_for(dtype=judged)


def _judged_text(m: _Model, judged: str) -> str:
    """"float32", or "float32 (judged as float16: the model computes in float16 behind float32 inputs and outputs)"."""
    if judged == m.dtype:
        return m.dtype
    return f"{m.dtype} (judged as {judged}: the model computes in {judged} behind {m.dtype} inputs and outputs)"


def _unavailable(provider: str) -> None:
    from .runtimes.providers import unavailable_reason

    why = unavailable_reason(provider)
    if why:
        raise _CompareError(f"--provider {provider}: {why}")


def _tolerance_json(tol: Any) -> dict[str, Any]:
    """A resolved Tolerance as the JSON output states it."""
    budget = dict(tol.budget) if tol.budget else None
    return {
        "atol": None if tol.atol is None else float(tol.atol),
        "rtol": None if tol.rtol is None else float(tol.rtol),
        "max_ulp": None if tol.max_ulp is None else float(tol.max_ulp),
        "budget": None if budget is None else {repr(float(t)): float(f) for t, f in sorted(budget.items())},
        "text": tol.describe(),
    }


def _run_json(args: argparse.Namespace, command: str, m: _Model, provider: str) -> dict[str, Any]:
    """The fields every model command's JSON starts with (schema version 1: keys are only ever added)."""
    return {
        "schema": _JSON_SCHEMA,
        "command": command,
        "model": m.path,
        "provider": provider,
        "dtype": m.dtype,
        "converted_from": m.converted_from,
        "dims": dict(m.dims),
        "seed": args.seed,
        "feeds": {"file": args.feeds, "inputs": list(m.given)} if m.given else None,
        "input_ranges": {n: [lo, hi] for n, (lo, hi) in m.ranges.items()},
        "ort_kernels": list(args.ort_kernel or ()),
        "missing": args.missing,
    }


def _json_text(data: Any) -> str:
    """`data` as strict JSON (what every parser takes): NaN and infinities as the strings "nan", "inf", "-inf",
    as the reports write them (an infinite --atol, a tolerance's bound, a report's NaN mismatch)."""
    import math

    def plain(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if isinstance(x, Mapping):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return json.dumps(plain(data), indent=1, allow_nan=False)


#: the version of the JSON that compare, blame and diff print with --json
_JSON_SCHEMA = 1


def _compare(args: argparse.Namespace) -> int:
    """`compare MODEL`: the torch evaluator vs onnxruntime on the model's own (or --dtype's) dtype; exit 0
    within the tolerance, 1 beyond it."""
    from .engine.check import Checker, ToleranceBroken

    _unavailable(args.provider)
    m = _open_model(args, args.model, dtype=args.dtype)
    checker = Checker(args.provider, m.dtype, tolerance=args.tolerance)
    feeds = m.feeds(args.seed, checker.device)
    judged, tolerance = _judged(checker, m)
    if not args.json:
        _say(f"{args.model}: torch evaluator vs onnxruntime {checker.provider} {_judged_text(m, judged)}, dims {m.dims}, seed {args.seed}{_notes(args, m)}")
    try:
        result = _engine(lambda: checker.check(m.checked, feeds, kernels=m.kernels or None, missing=args.missing), m)  # (checked once, run from its file above 2 GB)
    except ToleranceBroken as exc:
        result = exc.result
    if args.json:
        data = _run_json(args, "compare", m, checker.provider)
        data.update(
            tolerance=_tolerance_json(tolerance),
            passed=result.passed,
            violations=[{"rule": v.rule, "output": v.output, "message": v.message} for v in result.violations],
            ran_on_ort=list(result.ran_on_ort),
            notes=list(result.notes),
            report=result.report.to_dict(),
            judged_dtype=judged,  # (keys are only ever added, at the end)
        )
        print(_json_text(data))
    elif result.passed:
        notes = "\n".join(f"note: {note}" for note in result.notes)
        widened = f"compared as the float32 values they hold (each value of theirs is one): {', '.join(result.widened)}" if result.widened else ""
        _say("\n".join(x for x in (f"passed ({tolerance.describe()})", result.ran_on_ort_line(), widened, notes, result.report.render()) if x))
    else:
        _say(result.render())
    return 0 if result.passed else 1


def _blame(args: argparse.Namespace) -> int:
    """`blame MODEL`: every node swapped to onnxruntime in turn (pytest_ortdiff.blame); exit 0 with the
    table, whatever the gap."""
    from .engine.check import Checker

    _unavailable(args.provider)
    m = _open_model(args, args.model, dtype=args.dtype)
    checker = Checker(args.provider, m.dtype, tolerance=args.tolerance)
    feeds = m.feeds(args.seed, checker.device)
    judged, tolerance = _judged(checker, m)
    if not args.json:
        _say(f"{args.model}: blame, torch evaluator vs onnxruntime {checker.provider} {_judged_text(m, judged)}, dims {m.dims}, seed {args.seed}{_notes(args, m)}")
    table = _engine(lambda: checker.blame(m.checked, feeds, kernels=m.kernels or None, missing=args.missing), m)
    if args.json:
        data = _run_json(args, "blame", m, checker.provider)
        data.update(tolerance=_tolerance_json(tolerance), blame=table.to_dict(), judged_dtype=judged)
        print(_json_text(data))
    else:
        _say(table.render(top=args.top))
    return 0


def _diff(args: argparse.Namespace) -> int:
    """`diff ORIGINAL DEPLOYED`: two model files of one function (an export and its optimized, float16 or
    quantized form) on onnxruntime with the same feeds, output to output, then value by value
    (pytest_ortdiff.align) with the first divergence named; exit 0 within the tolerance, 1 beyond it."""
    from .engine.check import Checker
    from .numerics.diff import DEFAULT_THRESHOLDS, compare
    from .numerics.tolerance import Tolerance
    from .runtimes.model_io import check_feeds, compute_dtype, input_specs

    _unavailable(args.provider)
    a = _open_model(args, args.original)
    b = _open_model(args, args.deployed, fed=False)  # (its feeds are the original's, cast)
    a_names, b_specs = list(a.specs), input_specs(b.proto)
    # inputs by name, else by position (two exporters name inputs differently), as align matches them
    if set(b_specs) != set(a_names) and len(b_specs) != len(a_names):
        raise _CompareError(
            f"{args.deployed} has {len(b_specs)} input(s) ({', '.join(b_specs)}) and {args.original} {len(a_names)} ({', '.join(a_names)}): "
            "diff runs two models of one function on the same feeds, matched by name or else by position"
        )
    by_name = set(b_specs) == set(a_names)
    runner = Checker(args.provider, a.dtype)
    feeds_a = a.feeds(args.seed, runner.device)
    feeds_b = _cast_feeds({n if by_name else bn: feeds_a[n] for n, bn in zip(a_names, b_specs, strict=True)}, b.proto)
    try:
        check_feeds(b_specs, feeds_b)
    except (TypeError, ValueError) as exc:  # (the same function takes the same inputs: these two do not)
        raise _CompareError(
            f"{args.deployed} does not take the inputs drawn for {args.original}: {exc}; diff runs two models of one function on the same "
            "feeds (check that DEPLOYED was made from ORIGINAL, and its --dim values)"
        ) from None
    out_a = _engine(lambda: runner.run_ort(a.checked, feeds_a), a)
    out_b = _engine(lambda: Checker(args.provider, b.dtype).run_ort(b.checked, feeds_b), b)
    pairs = _output_pairs(args, a.proto, b.proto)
    # a float16 model behind float32 inputs and outputs (the converter's keep_io_types=True) computes in float16:
    # judged as float16, as check_deployment judges it
    compute = compute_dtype(b.proto)
    expected, got, compared = {}, {}, []
    for (ia, na), (ib, nb) in pairs:
        ea, gb, as_dtype = _comparable(out_a[ia], out_b[ib], floor=compute)
        if ea.shape != gb.shape:
            raise _CompareError(
                f"output {na!r} of {args.original} is {list(ea.shape)} and {nb!r} of {args.deployed} is {list(gb.shape)} on the same feeds: "
                "not one function's outputs"
            )
        expected[na], got[na] = ea, gb
        compared.append({"original": na, "deployed": nb, "compared_as": as_dtype})
    dtypes = list(dict.fromkeys(c["compared_as"] for c in compared))
    tol = args.tolerance or Tolerance()
    report = compare(expected, got, thresholds=sorted({*DEFAULT_THRESHOLDS, *tol.thresholds}), tolerance=tol)
    violations = list(tol.check(report))
    if report.n == 0:  # every output empty: nothing compared is not a pass
        from .engine.check import _nothing_compared

        violations.append(_nothing_compared(report, feeds_a))
    shown = tol.for_dtype(dtypes[0])
    # every pair judged by the tolerance the outputs are (not each pair's narrower dtype's defaults): the first
    # divergence is then the first value beyond what the outputs were allowed
    alignment, why_not = _alignment(args, a, b, feeds_a, args.tolerance or shown)
    if args.json:
        data = {
            "schema": _JSON_SCHEMA,
            "command": "diff",
            "original": args.original,
            "deployed": args.deployed,
            "provider": args.provider,
            "dtype": ", ".join(dtypes),
            "dims": dict(a.dims),
            "seed": args.seed,
            "feeds": {"file": args.feeds, "inputs": list(a.given)} if a.given else None,
            "input_ranges": {n: [lo, hi] for n, (lo, hi) in a.ranges.items()},
            "tolerance": _tolerance_json(shown),
            "passed": not violations,
            "violations": [{"rule": v.rule, "output": v.output, "message": v.message} for v in violations],
            "outputs": compared,
            "report": report.to_dict(),
            "alignment": alignment.to_dict() if alignment is not None else {"error": why_not},
            "compute_dtype": compute,
        }
        print(_json_text(data))
        return 1 if violations else 0
    why = f" (the deployed model's compute dtype: it computes in {compute} behind its outputs' dtype)" if compute in dtypes else ""
    lines = [
        f"{args.original} -> {args.deployed}: onnxruntime {args.provider}, the same feeds (dims {a.dims}, seed {args.seed}{_notes(args, a)}), "
        f"outputs compared as {', '.join(dtypes)}{why}" + ("" if by_name else " (inputs and outputs matched by position)")
    ]
    if violations:
        lines.append("nothing compared:" if report.n == 0 else f"outputs moved beyond the tolerance ({shown.describe()}):")
        lines += [f"  - {v}" for v in violations]
        if args.tolerance is None and report.n:
            lines.append(
                f"  (that is {dtypes[0]}'s default tolerance; a deployment step such as quantization moves outputs by design: "
                "give the one it is allowed, e.g. --atol 0.01 --rtol 0.01 or --budget 0.01:0.001)"
            )
    else:
        lines.append(f"outputs within the tolerance ({shown.describe()})")
    lines.append(report.render())
    lines.append("node by node (the values of the two graphs aligned):")
    lines.append(alignment.render(around=args.around) if alignment is not None else f"  not aligned: {why_not}")
    _say("\n".join(lines))
    return 1 if violations else 0


def _output_pairs(args: argparse.Namespace, a: Any, b: Any) -> list[tuple[tuple[int, str], tuple[int, str]]]:
    """The outputs of the two models paired: by name when the deployed model has every output of the
    original, else by position."""
    na, nb = [o.name for o in a.graph.output], [o.name for o in b.graph.output]
    if all(n in nb for n in na):
        return [((i, n), (nb.index(n), n)) for i, n in enumerate(na)]
    if len(na) == len(nb):
        return list(zip(enumerate(na), enumerate(nb), strict=True))
    raise _CompareError(
        f"{args.deployed} has {len(nb)} output(s) ({', '.join(nb)}) and {args.original} {len(na)} ({', '.join(na)}): "
        "diff compares outputs matched by name or else by position"
    )


def _comparable(a: Any, b: Any, floor: str | None = None) -> tuple[Any, Any, str]:
    """Two outputs in one dtype: the narrower floating one when both are floating (float32 against a float16
    deployment: the original rounded to float16, its ULPs the deployment's), and `floor` (the deployed model's
    compute dtype) when that is narrower still and both outputs fit in its range; the floating one when one
    is, int64 when neither is."""
    import torch

    from .numerics.dtypes import dtype_of

    # the float8s, which the diff has no rules for: compared as the float32 values they hold (each is one)
    a, b = (x.to(torch.float32) if x.is_floating_point() and x.element_size() == 1 else x for x in (a, b))
    fa, fb = a.is_floating_point(), b.is_floating_point()
    if fa and fb:
        target = a.dtype if a.dtype.itemsize < b.dtype.itemsize else b.dtype
        if floor is not None and dtype_of(floor).torch.itemsize < target.itemsize:
            half = dtype_of(floor).torch
            top = float(torch.finfo(half).max)
            # judged in the compute dtype only when the outputs fit in it: a value beyond its range (a float32
            # scale after the float16 part) would round to inf, or clamp, on both sides and hide any difference
            if not any(bool((x[torch.isfinite(x)].abs() > top).any()) for x in (a, b)):
                target = half
    elif fa or fb:
        target = a.dtype if fa else b.dtype
    else:
        target = a.dtype if a.dtype == b.dtype else torch.int64
    return a.to(target), b.to(target), dtype_of(target).short


def _alignment(args: argparse.Namespace, a: _Model, b: _Model, feeds: Mapping[str, Any], tol: Any) -> tuple[Any, str]:
    """compare_executions of the two models on the feeds (None and why, when they cannot be aligned: the
    outputs' verdict stands without it)."""
    from .analyses.align import compare_executions

    try:
        return compare_executions(a.proto, b.proto, feeds, provider=args.provider, tolerance=tol, labels=(args.original, args.deployed)), ""
    except (ValueError, TypeError, RuntimeError, NotImplementedError) as exc:
        return None, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _precision(args: argparse.Namespace) -> int:
    """`precision MODEL`: the audit table and keep_float32's report (pytest_ortdiff.precision) on drawn or
    given feeds; exit 0 for a verified list, 1 when none meets the budget, 2 for bad arguments."""
    from .analyses.precision.keep import keep_float32
    from .runtimes.providers import torch_device

    if not 1 <= args.samples <= _MAX_SAMPLES:
        raise _CompareError(f"--samples {args.samples}: expected 1 to {_MAX_SAMPLES:,} samples (each is a run of the search)")
    if args.write_converted is not None:
        _check_writable_model(args.write_converted, args.model)
    _unavailable(args.provider)
    m = _open_model(args, args.model)
    feeds = [m.feeds(args.seed + i, torch_device(args.provider)) for i in range(args.samples)]
    from .engine.check import NothingCompared

    try:
        report = _engine(lambda: keep_float32(m.proto, feeds, dtype=args.dtype, tolerance=args.tolerance, provider=args.provider, missing=args.missing), m)
    except NothingCompared as exc:  # every output empty on the feeds: a search that compared nothing fails, as compare does
        print(f"error: {_printable(str(exc))}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        raise _CompareError(str(exc)) from None
    assert report.audit is not None
    seeds = f"seed {args.seed}" if args.samples == 1 else f"seeds {args.seed} and {args.seed + 1}" if args.samples == 2 else f"seeds {args.seed} to {args.seed + args.samples - 1}"
    samples = f"{args.samples} sample{'' if args.samples == 1 else 's'} ({seeds})"
    # the finished search is printed first: a full disk costs the written model, never the list; a reader gone
    # (`precision ... | head`) costs neither the model (written all the same) nor a traceback (exit 141 after)
    closed = False
    try:
        _say(f"{args.model}: {samples}, dims {m.dims}{_notes(args, m)}\n\n{report.audit.render()}\n\n{report.render()}")
        sys.stdout.flush()
    except BrokenPipeError:
        closed = True
        _stdout_to_devnull()
    status = _write_converted(args, report)
    if closed:
        raise BrokenPipeError
    return status


def _write_converted(args: argparse.Namespace, report: Any) -> int:
    """--write-converted after the search: the model written (or why not); the command's exit status."""
    if args.write_converted:
        if report.converted_model is None:
            print(f"\nnot written: {args.write_converted} (no verified list)")
        else:
            try:
                report.write_converted(args.write_converted)
            except (ValueError, OSError) as exc:
                print(f"error: --write-converted {_printable(args.write_converted)}: {_printable(str(exc))} (the list above stands; what was at that path is untouched)", file=sys.stderr)
                return 2
            print(f"\nwrote {args.write_converted}")
    return 0 if report.verified else 1


#: precision --samples at most
_MAX_SAMPLES = 1000


def _check_writable_model(out: str, model: str) -> None:
    """--write-converted OUT checked before the search: a path, not the model it converts, and never over a
    file that is not an ONNX model (a misplaced argument must not cost a user's file)."""
    import os

    flag = f"--write-converted {out!r}"
    if not out.strip():
        raise _CompareError(f"{flag}: an empty path; give the file to write, e.g. --write-converted model_fp16.onnx")
    if os.path.isdir(out):
        raise _CompareError(f"{flag} is a directory; give the file to write in it, e.g. {os.path.join(out, 'model_fp16.onnx')}")
    if not os.path.exists(out):
        return
    if os.path.samefile(out, model):
        raise _CompareError(f"{flag} is the model being converted: writing there would replace it; give the converted model a path of its own")
    if not _is_onnx_model(out):
        raise _CompareError(f"{flag} holds a file that is not an ONNX model, so it is not overwritten: give the converted model a path of its own")


def _is_onnx_model(path: str) -> bool:
    """Whether the file holds a serialized ModelProto (what --write-converted may replace): its first fields
    are a ModelProto's (IR's version, then one of its other fields: a serialized TensorProto also starts with a
    varint of field 1, its dims), and, up to 64 MiB, it parses as one with a graph, read as protobuf whatever
    its extension (onnx.load would read a .json or .textproto as text). An empty file holds nothing to lose."""
    import os

    size = os.path.getsize(path)
    if size == 0:
        return True
    with open(path, "rb") as f:
        head = f.read(32)
    if not _model_header(head):
        return False
    if size > 64 * 2**20:
        return True
    from onnx import ModelProto

    try:
        with open(path, "rb") as f:
            model = ModelProto.FromString(f.read())
    except Exception:  # (protobuf's DecodeError, and whatever else bytes that are no model raise)
        return False
    return model.HasField("graph")


#: ModelProto's fields after ir_version (1): number -> wire type (2 length-delimited, 0 varint)
_MODEL_FIELDS = {2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2}


def _model_header(head: bytes) -> bool:
    """`head` starts as a serialized ModelProto: field 1 (ir_version, a varint), then a ModelProto field."""
    if not head or head[0] != 0x08:
        return False
    i = 1
    while i < len(head) and head[i] & 0x80:  # (ir_version's varint)
        i += 1
    i += 1
    tag, shift = 0, 0
    while i < len(head):
        tag |= (head[i] & 0x7F) << shift
        shift += 7
        if not head[i] & 0x80:
            return _MODEL_FIELDS.get(tag >> 3) == tag & 7
        i += 1
    return False


def _load_checked(name: str) -> Any:
    """The model file, loaded and passed through onnx.checker (whose message beats onnxruntime's): the
    CheckedModel (a model above 2 GB is checked, and run by onnxruntime, from the file)."""
    from .runtimes.model_io import InvalidModelError, ModelLoadError, check_model, load_model

    try:
        model = load_model(name)
    except ModelLoadError as exc:
        raise _CompareError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise _CompareError(f"cannot load {name!r}: {exc}") from None
    try:
        return check_model(model, subject=name, path=name)
    except InvalidModelError as exc:
        raise _CompareError(str(exc)) from None


def _load_feeds(path: str, specs: Mapping[str, InputSpec]) -> dict[str, Any]:
    """--feeds FILE.npz: named arrays for some of the model's inputs, each checked against its input
    (dtype, rank, fixed dims), and the symbolic dims they share consistent. The file is someone else's: its
    members' names are checked before any is read, and each member's header before its data is inflated,
    at most _MAX_FEED_BYTES of it (a 472-byte file must not claim 40 TB, a 1 MB one inflate to a GiB)."""
    import zipfile

    import torch

    from .runtimes.model_io import check_feed, feed_dims

    how = "write one with numpy.savez(path, input_name=array, ...)"
    inputs = ", ".join(f"{n}: {s.describe()}" for n, s in specs.items())
    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            single = f.read(6) == b"\x93NUMPY"
        what = "a single array, not a .npz file of named arrays" if single else "not a .npz file of named arrays (not a zip file)"
        raise _CompareError(f"--feeds {path}: {what}; {how}") from None
    except OSError as exc:
        raise _CompareError(f"--feeds {path}: cannot read it ({exc.strerror or exc})") from None
    with z:
        members = z.infolist()
        odd = [i.filename for i in members if not i.filename.endswith(".npy")]
        if odd:
            raise _CompareError(f"--feeds {path}: {odd[0]!r} is not an array (.npy): not a file numpy.savez wrote; {how}")
        names = [i.filename[:-4] for i in members]
        if not names:
            raise _CompareError(f"--feeds {path}: the file holds no arrays; the model's inputs: {inputs}")
        unknown = list(dict.fromkeys(n for n in names if n not in specs))
        if unknown:
            unnamed = all(re.fullmatch(r"arr_\d+", n) for n in unknown)
            hint = "; save them by name: numpy.savez(path, input_name=array, ...)" if unnamed else ""
            raise _CompareError(f"--feeds {path}: {', '.join(map(repr, unknown))} {'is not an input' if len(unknown) == 1 else 'are not inputs'} of the model; its inputs: {inputs}{hint}")
        twice = [n for n in names if names.count(n) > 1]
        if twice:
            raise _CompareError(f"--feeds {path}: {twice[0]!r} is in the file twice; {how}")
        arrays = {name: _read_member(z, info, name, path) for name, info in zip(names, members, strict=True)}
    for name, arr in arrays.items():
        if arr.dtype.kind not in "biuf":  # (strings, dates, complex, raw bytes, records: no input of a model takes them)
            raise _CompareError(
                f"--feeds {path}: {name!r} holds {arr.dtype} values ({_NPY_KINDS.get(arr.dtype.kind, 'not numbers')}); the model declares "
                f"{specs[name].describe()}: save it as an array of that dtype"
            )
    try:
        for name, arr in arrays.items():
            check_feed(specs[name], arr)
        feed_dims(specs, arrays)
    except (TypeError, ValueError) as exc:
        raise _CompareError(f"--feeds {path}: {exc}") from None
    return {name: torch.from_numpy(arr) for name, arr in arrays.items()}


#: numpy's dtype kinds that are not numbers, as a person names them
_NPY_KINDS = {"U": "text", "S": "bytes", "M": "dates", "m": "time spans", "c": "complex numbers", "V": "raw bytes or records", "O": "Python objects"}

#: the most bytes --feeds reads of one member, and of an .npy header (numpy's own default cap)
_MAX_FEED_BYTES = 2**31
_NPY_HEADER_MAX = 10_000


def _read_member(z: Any, info: Any, name: str, path: str) -> Any:
    """One .npy member: its header read first, its data inflated only up to the size the header claims,
    which must be at most _MAX_FEED_BYTES; an array of Python objects is refused (numpy would unpickle it)."""
    import io
    import math
    import zlib

    import numpy as np

    try:
        with z.open(info) as f:
            head = f.read(_NPY_HEADER_MAX + 16)
            buf = io.BytesIO(head)
            version = np.lib.format.read_magic(buf)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(buf, max_header_size=_NPY_HEADER_MAX)
            if dtype.hasobject:
                raise _CompareError(f"--feeds {path}: {name!r} holds Python objects, which --feeds does not read (they would be unpickled)")
            count = math.prod(shape)
            nbytes = count * dtype.itemsize
            if nbytes > _MAX_FEED_BYTES:
                raise _CompareError(
                    f"--feeds {path}: {name!r} claims shape {tuple(shape)} of {dtype.name}: {nbytes:,} bytes, more than --feeds reads ({_MAX_FEED_BYTES:,} bytes a member)"
                )
            data = bytearray(nbytes)
            rest = head[buf.tell() :][:nbytes]
            data[: len(rest)] = rest
            got = len(rest)
            view = memoryview(data)
            while got < nbytes:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
            extra = len(head) - buf.tell() > nbytes or bool(f.read(1))
    except _CompareError:
        raise
    except (ValueError, OSError, EOFError, zlib.error, NotImplementedError, SyntaxError) as exc:  # (a header numpy cannot parse, a damaged stream)
        raise _CompareError(f"--feeds {path}: {name!r} is not an array numpy.save wrote ({exc})") from None
    if got != nbytes or extra:
        raise _CompareError(f"--feeds {path}: {name!r}: its header says shape {tuple(shape)} of {dtype.name} ({nbytes:,} bytes), its data is {'shorter' if got < nbytes else 'longer'}")
    arr = np.frombuffer(data, dtype=dtype, count=count)
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    return np.ascontiguousarray(arr.astype(dtype.newbyteorder("="), copy=False))


def _dim_items(items: Sequence[str]) -> list[tuple[str, int]]:
    """--dim NAME=VALUE, well formed."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise _CompareError(f"--dim {item!r}: expected NAME=VALUE with a positive integer, e.g. --dim batch=2")
        if not 1 <= int(value) <= _MAX_DIM:
            raise _CompareError(f"--dim {item}: expected a positive integer up to {_MAX_DIM:,}, e.g. --dim {name}=2")
        out.append((name, int(value)))
    return out


def _parse_dims(items: Sequence[str], model: Any, specs: Mapping[str, InputSpec], given: Mapping[str, Any], feeds_file: str | None) -> dict[str, int]:
    """--dim NAME=VALUE for every symbolic dim the feeds from --feeds do not fix already."""
    from .analyses.strategies import PinnedDims, pinned_dims, symbolic_dims
    from .runtimes.model_io import feed_dims

    known = symbolic_dims(model)
    fixed = feed_dims(specs, given)
    dims: dict[str, int] = dict(fixed)
    # the dims the model itself fixes (a weight's size exported as a symbolic dim), or makes equal to another
    pins = pinned_dims(model) if any(d not in fixed for d in known) else PinnedDims()
    for (name, value), item in zip(_dim_items(items), items, strict=True):
        if name not in known:
            where = f"its symbolic dims: {', '.join(known)}" if known else "its inputs have none"
            raise _CompareError(f"--dim {item}: the model has no symbolic dim {name!r}; {where}")
        if name in fixed and fixed[name] != value:
            raise _CompareError(f"--dim {item}: the feeds in {feeds_file} have {name}={fixed[name]}; drop --dim {name} or change the file")
        if name in pins.fixed and pins.fixed[name] != value:
            raise _CompareError(f"--dim {item}: {pins.why(name)}, and onnxruntime fails on any other value; drop --dim {name} (it is taken as {pins.fixed[name]})")
        dims[name] = value
    for name, pinned in pins.fixed.items():
        dims.setdefault(name, pinned)
    for name, other in pins.same.items():
        if name in dims and other in dims and dims[name] != dims[other]:
            raise _CompareError(f"--dim {name}={dims[name]} and {other}={dims[other]}: {pins.why(name)}; give the same value, or only --dim {other}")
        if other in dims:
            dims.setdefault(name, dims[other])
        elif name in dims:
            dims[other] = dims[name]
    # only the inputs drawn need their dims
    drawn = {d for n, s in specs.items() if n not in given for d in (s.dims or ()) if isinstance(d, str)}
    missing = [d for d in known if d not in dims and d in drawn and d not in pins.same]  # (a dim drawn as another: that one's value)
    if missing:
        raise _CompareError(
            f"the model's inputs have symbolic dims {missing}: give each a value, e.g. " + " ".join(f"--dim {d}=2" for d in missing)
        )
    return dims


#: the largest --dim, and the most elements compare draws for one input (1 GiB of float32): a declared
#: 2**31 x 2**31 input is refused with a line, not attempted
_MAX_DIM = 2**31 - 1
_MAX_DRAWN_ELEMENTS = 2**28


def _check_drawable(specs: Mapping[str, InputSpec], given: Mapping[str, Any], dims: Mapping[str, int]) -> None:
    """Every input compare draws (those --feeds does not give) can be drawn: a numeric type, every dim
    known (fixed, or a named dim with a value), and a size within _MAX_DRAWN_ELEMENTS."""
    import math

    how = "give its values with --feeds FILE.npz"
    for name, spec in specs.items():
        if name in given:
            continue
        dt = spec.dtype
        if dt is None:
            raise _CompareError(f"input {name!r} is {spec.describe()}: compare draws numeric tensors only; {how}, or compare a model with numeric inputs")
        unnamed = [axis for axis, d in enumerate(spec.dims or ()) if d is None]
        if unnamed:
            raise _CompareError(f"input {name!r} ({spec.describe()}) has an unnamed dim (axis {unnamed[0]}), which --dim cannot set; {how}, or name the dim in the model")
        shape = [d if isinstance(d, int) else dims.get(str(d), 1) for d in spec.dims or ()]
        count = math.prod(shape)
        if count > _MAX_DRAWN_ELEMENTS:
            raise _CompareError(
                f"input {name!r} ({spec.describe()}) would have {count:,} elements with shape {shape}: more than compare draws "
                f"({_MAX_DRAWN_ELEMENTS:,}); give smaller dims with --dim, or {how}"
            )


_RANGE_EXAMPLE = "e.g. --input-range token_type_ids=0:2 (HI excluded: draws 0 and 1)"


def _range_items(items: Sequence[str]) -> list[tuple[str, str, str]]:
    """--input-range NAME=LO:HI, well formed: (NAME, LO, HI) as text (their type is the input's)."""
    out = []
    for item in items:
        name, sep, text = item.partition("=")
        lo_text, sep2, hi_text = text.partition(":")
        if not (sep and sep2 and name and lo_text.strip() and hi_text.strip()):
            raise _CompareError(f"--input-range {item!r}: expected NAME=LO:HI, {_RANGE_EXAMPLE}")
        out.append((name, lo_text, hi_text))
    return out


def _parse_ranges(items: Sequence[str], specs: Mapping[str, InputSpec], given: Mapping[str, Any], feeds_file: str | None) -> dict[str, tuple[float, float]]:
    """--input-range NAME=LO:HI: the values a drawn input takes, LO included and HI excluded (integers:
    0:2 draws 0 and 1, as range(0, 2))."""
    from .numerics.dtypes import DType

    ranges: dict[str, tuple[float, float]] = {}
    for (name, lo_text, hi_text), item in zip(_range_items(items), items, strict=True):
        example = _RANGE_EXAMPLE
        if name not in specs:
            raise _CompareError(f"--input-range {item}: the model has no input {name!r}; its inputs: {', '.join(specs)}")
        if name in given:
            raise _CompareError(f"--input-range {item}: {name!r} comes from --feeds {feeds_file}; drop one of the two")
        dt = specs[name].dtype
        if dt == DType.BOOL:
            raise _CompareError(f"--input-range {item}: {name!r} is a bool input: its values are False and True")
        integer = dt is not None and not dt.is_floating_point
        try:
            lo, hi = (int(lo_text), int(hi_text)) if integer else (float(lo_text), float(hi_text))
        except ValueError:
            kind = "integers" if integer else "numbers"
            raise _CompareError(f"--input-range {item}: LO and HI must be {kind} ({name!r} is {dt.short if dt else 'of an unknown type'}), {example}") from None
        if not lo < hi:
            raise _CompareError(f"--input-range {item}: LO must be below HI (HI is excluded: {name}=0:2 draws 0 and 1)")
        ranges[name] = (lo, hi)
    return ranges


def _draw_feeds(
    model: Any, specs: Mapping[str, InputSpec], given: Mapping[str, Any], dims: Mapping[str, int], ranges: Mapping[str, tuple[float, float]], *, seed: int, device: str
) -> dict[str, Any]:
    """The feeds: the inputs from --feeds as they are, the others drawn by random_feeds (in their
    --input-range, else their recorded range: floats [-1, 1), integers [0, 10))."""
    import onnx

    from .models import random_feeds
    from .models.feeds import set_feed_range

    if not given and not ranges:
        return random_feeds(model, dims=dims, seed=seed, device=device)
    # random_feeds reads a model's inputs and recorded ranges only: a model of just the drawn inputs
    # draws them without copying the graph (which may be large) to record the ranges
    inputs = onnx.ModelProto()
    inputs.graph.input.extend(vi for vi in model.graph.input if vi.name in specs and vi.name not in given)
    inputs.metadata_props.extend(model.metadata_props)
    for name, (lo, hi) in ranges.items():
        set_feed_range(inputs, name, lo, hi)
    drawn = random_feeds(inputs, dims=dims, seed=seed, device=device) if len(inputs.graph.input) else {}
    fed = {name: value.to(device) for name, value in given.items()}
    return {name: fed[name] if name in fed else drawn[name] for name in specs}


def _drawn_hint(model: Any, specs: Mapping[str, InputSpec], given: Mapping[str, Any], ranges: Mapping[str, tuple[float, float]]) -> str:
    """When onnxruntime fails on drawn integer inputs (ids out of an embedding's range, most likely):
    where they were drawn from, and how to give them."""
    from .models.feeds import _ranges

    recorded = _ranges(model)
    drawn = [n for n, s in specs.items() if n not in given and n not in ranges and s.dtype is not None and not s.dtype.is_floating_point and s.dtype.short != "bool"]
    if not drawn:
        return ""
    where = ", ".join(f"{n} from [{_num(recorded.get(n, (0, 10))[0])}, {_num(recorded.get(n, (0, 10))[1])})" for n in drawn)
    return f" (integer inputs were drawn: {where}; give their range with --input-range NAME=LO:HI or their values with --feeds FILE.npz)"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _kernel_items(items: Sequence[str]) -> list[tuple[str, str]]:
    """--ort-kernel OP or DOMAIN::OP, well formed: (domain, op), the default domain as ""."""
    out = []
    for item in items:
        domain, _, op = item.rpartition("::")
        if not op or (item.count("::") and not domain):
            raise _CompareError(
                f"--ort-kernel {item!r}: expected OP or DOMAIN::OP, e.g. --ort-kernel LayerNormalization or --ort-kernel com.microsoft::FusedMatMul"
            )
        out.append(("" if domain == "ai.onnx" else domain, op))
    return out


def _parse_kernels(items: Sequence[str], model: Any) -> dict[tuple[str, str], str]:
    """--ort-kernel OP or DOMAIN::OP -> TorchEvaluator's kernels={(domain, op): "ort"}."""
    ops = sorted({_op_label(n.domain, n.op_type) for n in model.graph.node})
    kernels: dict[tuple[str, str], str] = {}
    for (domain, op), item in zip(_kernel_items(items), items, strict=True):
        if _op_label(domain, op) not in ops:
            raise _CompareError(f"--ort-kernel {item}: the model has no {item} node; its ops: {', '.join(ops)}")
        kernels[(domain, op)] = "ort"
    return kernels


def _op_label(domain: str, op: str) -> str:
    return f"{domain}::{op}" if domain and domain != "ai.onnx" else op


def _missing_kernel_message(exc: Exception) -> str:
    """"no torch kernel for com.microsoft::QuickGelu (opset 1); run it with onnxruntime instead:
    --ort-kernel com.microsoft::QuickGelu (or --missing=ort)" (the evaluator's own message lists every
    known op)."""
    from .engine.check import missing_ops

    head = str(exc).split(";")[0]
    ops = missing_ops(exc)
    them = "it" if len(ops) == 1 else "them"
    return f"{head}; run {them} with onnxruntime instead: " + " ".join(f"--ort-kernel {op}" for op in ops) + " (or --missing=ort)"


def _model_dtype(model: Any) -> str:
    """The dtype the model computes in, for the tolerance: its first floating output's, else its first
    floating initializer's, else its first floating input's (an int64 ids input says nothing)."""
    from .numerics.dtypes import DType

    codes = [vi.type.tensor_type.elem_type for vi in model.graph.output]
    codes += [t.data_type for t in model.graph.initializer]
    codes += [vi.type.tensor_type.elem_type for vi in model.graph.input]
    for code in codes:
        try:
            dt = DType(code)
        except ValueError:  # string, float8, ...: not a dtype the checks run in
            continue
        if dt.is_floating_point:
            return dt.short
    return "float32"


def _demo(args: argparse.Namespace) -> int:
    import subprocess

    example = Path(__file__).resolve().parent.parent / "examples" / "test_layer_norm_matmul_add.py"
    if not example.exists():
        print(f"error: the demo runs {example}, which is in the source checkout only", file=sys.stderr)
        return 2
    # a fresh interpreter: in this one pytest_ortdiff is imported already, so pytest could not rewrite
    # the plugin's asserts and warns (an error under the checkout's filterwarnings = error)
    pytest_args = [str(example), "--ort-providers=available", "--ort-dtypes=float32,float16", "--ortdiff-reports", *args.pytest_args]
    return subprocess.call([sys.executable, "-m", "pytest", *pytest_args])


def _model_arguments(p: argparse.ArgumentParser, *, kernels: bool = True, missing: bool = True) -> None:
    """The arguments of every command that runs a model file: provider, feeds, dims, ranges, seed, and for those
    that run the torch evaluator what it does with an op it has no kernel for."""
    p.add_argument("--provider", default="CPU", help="the onnxruntime provider: CPU (default), CUDA, ...")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="a symbolic dim of the inputs, e.g. --dim batch=2 (repeat)")
    p.add_argument("--feeds", metavar="FILE.npz", help="named inputs from a file written by numpy.savez(path, input_name=array, ...); the inputs it lacks are drawn")
    p.add_argument(
        "--input-range",
        action="append",
        metavar="NAME=LO:HI",
        help="draw input NAME in [LO, HI), HI excluded (integers: token_type_ids=0:2 draws 0 and 1; default: floats [-1, 1), integers [0, 10)) (repeat)",
    )
    p.add_argument("--seed", type=int, default=0, help="the seed of the drawn inputs (default 0)")
    if kernels:
        p.add_argument(
            "--ort-kernel",
            action="append",
            metavar="OP",
            help="run this op (OP, or DOMAIN::OP such as com.microsoft::FusedMatMul) with onnxruntime inside the torch "
            "evaluator as well, as kernels={(domain, op): 'ort'} does: for an op it has no torch kernel for (repeat)",
        )
    if not missing:  # (diff runs onnxruntime only)
        return
    p.add_argument(
        "--missing",
        choices=("error", "ort"),
        default="error",
        help="an op the torch evaluator has no kernel for: 'error' (default) names them all; 'ort' runs each on onnxruntime, and the output says which",
    )


def _dtype_argument(p: argparse.ArgumentParser, what: str, choices: Sequence[str] = ("float32", "float16", "bfloat16"), default: str | None = None) -> None:
    aliases = {"float32": "fp32", "float16": "fp16, half", "bfloat16": "bf16"}
    p.add_argument("--dtype", type=_dtype_name, choices=choices, default=default, help=f"{what} ({', '.join(aliases[c] for c in choices)} name them too)")


def _count(text: str) -> int:
    """An argument that counts rows: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of rows (0 or more)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected 0 or more rows")
    return value


def _dtype_name(text: str) -> str:
    """A dtype's canonical name from the names pytest's --ort-dtypes takes too (fp16, half, bf16, fp32); the
    text as given when it names none (argparse's choices then list the valid ones)."""
    from .numerics.dtypes import parse_dtype

    try:
        return parse_dtype(text).short
    except ValueError:
        return text


def _tolerance_arguments(p: argparse.ArgumentParser, default: str = "(default: the dtype's atol/rtol; any flag given replaces them all)") -> None:
    p.add_argument("--atol", type=float, metavar="X", help=f"absolute tolerance: |expected - got| <= atol + rtol * |expected| {default}")
    p.add_argument("--rtol", type=float, metavar="X", help="relative tolerance (with --atol; the other one is 0 when only one is given)")
    p.add_argument("--max-ulp", type=float, metavar="N", help="at most N units in the last place of the dtype, at the output's scale (floored ULPs)")
    p.add_argument(
        "--budget",
        action="append",
        metavar="T:F",
        help="at most the share F of elements off by more than T, e.g. --budget 0.01:0.001 --budget 1:0 (repeat)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (`python -m pytest_ortdiff`, `pytest-ortdiff`): its exit status."""
    try:
        status = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`... | head`): the rest of the output goes nowhere, quietly, as for any Unix tool
        _stdout_to_devnull()
        return 141  # 128 + SIGPIPE: what a shell reports for a tool the closed pipe stopped
    return status


def _stdout_to_devnull() -> None:
    """stdout's descriptor onto /dev/null: what is still printed (and Python's flush at exit) goes nowhere."""
    import os

    with contextlib.suppress(OSError, ValueError, AttributeError):  # (a stdout without a file descriptor)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m pytest_ortdiff", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "merge",
        help="merge --ortdiff-json files of CI jobs into one matrix (tests × provider/dtype, × onnxruntime version when jobs differ) or table",
        description="Merge the --ortdiff-json files of CI jobs. When they cover several provider × dtype cases the output is the matrix: "
        "a row per test (its id without the provider/dtype part), a column per case (× onnxruntime version when the jobs differ in it), "
        "each cell the max abs error, worst ULP error and verdict; cells that jobs report differently are conflicts. Otherwise, or with "
        "--rows, one row per check.",
    )
    p.add_argument("files", nargs="+")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--matrix", action="store_true", help="the matrix, even for files covering one case")
    shape.add_argument("--rows", action="store_true", help="one row per check (and per test that failed without a failed check), even for several cases")
    p.add_argument("--markdown", action="store_true", help="markdown for a pull-request comment or CI job summary (the matrix: collapsed details per failing cell)")
    p.add_argument("--html", metavar="PATH", help="also write one self-contained HTML report of every job to PATH")
    p.add_argument("--output", help="also write the merged JSON here")
    p.add_argument(
        "--label",
        action="append",
        metavar="LABEL",
        help="name a job in the matrix and the HTML report, once per file in the files' order (default: from its environment, "
        "e.g. 'CPU float16 · ort 1.32.0 · torch 2.13.0', else the file's stem)",
    )
    p.add_argument("--label-from-file", action="store_true", help="name each job by its file's stem; in the row listing, append it to the test ids")
    p.add_argument("--width", type=int, metavar="N", help="fit the text matrix to N columns (default: the terminal's; unlimited for a pipe)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when any check failed, any test failed or errored (with or without a check), or two jobs report one cell differently (a conflict)",
    )
    p.set_defaults(func=_merge)
    p = sub.add_parser(
        "compare",
        help="torch evaluator vs onnxruntime on a model file, with random or given feeds: exit 0 within the tolerance, 1 beyond it",
        description="Run a model file through the torch evaluator and onnxruntime on the same feeds and compare the outputs "
        "(the histogram report). Exit status: 0 within the tolerance, 1 beyond it or nothing compared (every output empty, or every node "
        "on onnxruntime), 2 for a bad model or argument.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    _model_arguments(p)
    _dtype_argument(p, "the dtype to check in (default: the model's own); a float32 model is converted to float16 or bfloat16 first (onnxruntime's converter, every node)")
    _tolerance_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (schema 1: see the command line reference) instead of the report")
    p.set_defaults(func=_command(_compare))
    p = sub.add_parser(
        "blame",
        help="which node explains the gap between the torch evaluator and onnxruntime on a model file: the blame table",
        description="Swap every node of the model to onnxruntime in turn inside the torch evaluator (pytest_ortdiff.blame): how much of the "
        "gap each explains, its own error, and both runtimes against the float64 oracle. Exit status: 0 with the table, 2 for a bad model or argument.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    _model_arguments(p)
    _dtype_argument(p, "the dtype to blame in (default: the model's own); a float32 model is converted to float16 or bfloat16 first")
    _tolerance_arguments(p, "(blame: which node output is the first to drift; default any difference beyond the dtype's defaults)")
    p.add_argument("--top", type=_count, default=15, metavar="N", help="the nodes the table shows before '... N more nodes' (default 15)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the whole table instead")
    p.set_defaults(func=_command(_blame))
    p = sub.add_parser(
        "diff",
        help="did a deployment step move the numbers? two model files of one function on the same feeds, output to output and node to node",
        description="Run ORIGINAL.onnx and DEPLOYED.onnx (its optimized, float16, int4 or quantized form) on onnxruntime with the same feeds "
        "(drawn for ORIGINAL, cast to each model's input dtypes), compare their outputs (in the narrower dtype of each pair), and align "
        "their values node to node, naming the first that diverges (pytest_ortdiff.align). Exit status: 0 within the tolerance, 1 beyond it or nothing compared, "
        "2 for a bad model or argument.",
    )
    p.add_argument("original", metavar="ORIGINAL.onnx")
    p.add_argument("deployed", metavar="DEPLOYED.onnx")
    _model_arguments(p, kernels=False, missing=False)
    _tolerance_arguments(p, "(default: the compared dtype's atol/rtol)")
    p.add_argument("--around", type=_count, default=4, metavar="K", help="rows of the node-by-node table shown on either side of the first divergence (default 4)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the outputs' report and the whole alignment) instead")
    p.set_defaults(func=_command(_diff))
    p = sub.add_parser(
        "precision",
        help="float16/bfloat16 range audit of a float32 model and its smallest verified keep-in-float32 list",
        description="Audit a float32 model for float16 or bfloat16 and search the smallest list of nodes to keep in float32 "
        "(pytest_ortdiff.precision). Exit status: 0 for a verified list, 1 when none meets the tolerance, 2 for a bad model or argument.",
    )
    p.add_argument("model", metavar="MODEL.onnx")
    _dtype_argument(p, "the half-precision dtype to audit for and convert to (default float16)", choices=("float16", "bfloat16"), default="float16")
    _model_arguments(p, kernels=False)
    p.add_argument("--samples", type=int, default=4, help="inputs to audit and search on, drawn with seeds SEED, SEED+1, ... (default 4)")
    _tolerance_arguments(p, "(default: the dtype's atol/rtol)")
    p.add_argument("--write-converted", metavar="OUT.onnx", help="write the model converted with the list")
    p.set_defaults(func=_command(_precision))
    conformance_help = "run ONNX's node test suite through the torch evaluator: a table of pass/wrong/unsupported/no kernel/error per op"
    if "conformance" in argv:  # (its options come with its module, which imports numpy: only when it runs)
        from . import conformance

        p = sub.add_parser("conformance", help=conformance_help, description=conformance.DESCRIPTION)
        conformance.add_arguments(p)
        p.set_defaults(func=conformance.run_from_args)
    else:
        sub.add_parser("conformance", help=conformance_help)
    p = sub.add_parser(
        "demo",
        help="run the example suite of the source checkout's examples/ (LayerNormalization -> MatMul -> Add in float32 and float16; "
        "pip does not install it) on every available provider; further arguments go to pytest, e.g. demo -q -x",
    )
    p.add_argument("pytest_args", nargs="*", help="arguments for pytest (options too, without a '--')")
    p.set_defaults(func=_demo)
    args, unknown = parser.parse_known_args(argv)
    if args.command == "demo":
        # everything after `demo` is pytest's, in its order (argparse would split options from values)
        rest = argv[argv.index("demo") + 1 :]
        args.pytest_args = rest[1:] if rest[:1] == ["--"] else rest
    elif unknown:
        # the command's own usage, and the flag meant when one is near (`--dims` -> `--dim`)
        command = sub.choices[args.command]
        command.error(f"unrecognized arguments: {' '.join(unknown)}{_did_you_mean(unknown, command)}")
    return int(args.func(args))


def _did_you_mean(unknown: Sequence[str], command: argparse.ArgumentParser) -> str:
    """"; did you mean --dim?" for the unknown flags close to one of the command's (none: "; its flags: ...")."""
    import difflib

    flags = sorted({s for action in command._actions for s in action.option_strings if s.startswith("--")})
    given = [u.split("=", 1)[0] for u in unknown if u.startswith("-")]
    near = [m[0] for u in given for m in [difflib.get_close_matches(u, flags, n=1, cutoff=0.6)] if m]
    if near:
        return f"; did you mean {' or '.join(dict.fromkeys(near))}?"
    return f"; {command.prog.split()[-1]} takes {', '.join(flags)}" if given else ""


if __name__ == "__main__":
    sys.exit(main())
