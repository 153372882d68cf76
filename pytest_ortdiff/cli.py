"""`python -m pytest_ortdiff ...`: merge CI jobs' JSON reports into one matrix or table, compare a model file's
torch-evaluator and onnxruntime outputs, run ONNX's node test suite through the evaluator, run the demo."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .formatting import printable as _printable
from .results import BaselineRow, CheckRow, ResultsFile, ResultsFileError, SkipRow, TestOutcome

if TYPE_CHECKING:
    from .model_io import InputSpec

__all__ = ["main"]


def _merge(args: argparse.Namespace) -> int:
    from collections import Counter

    from .matrix import job_labels, pivot

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
            from .report import render_table

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
        from .htmlreport import write_html

        try:
            write_html(Path(args.html), files, labels)
        except OSError as exc:
            print(f"error: --html {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 1 if (failed or counts["failed"] or counts["error"] or conflicts) and args.strict else 0


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
    from .formatting import markdown_text

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
    from .formatting import markdown_text
    from .matrix import MARKDOWN_LIMIT
    from .report import render_table

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


def _compare(args: argparse.Namespace) -> int:
    try:
        return _compare_or_raise(args)
    except _CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


class _CompareError(Exception):
    """A bad model or argument: one line on stderr, exit status 2."""


def _compare_or_raise(args: argparse.Namespace) -> int:
    from .check import Checker, OrtRunError, ToleranceBroken, UnsupportedByProvider
    from .model_io import input_specs
    from .providers import parse_provider, unavailable_reason
    from .runtimes.evaluator import MissingKernelError

    if not 0 <= args.seed < 2**63:
        raise _CompareError(f"--seed {args.seed}: expected an integer from 0 to 2**63-1")
    checked = _load_checked(args.model)
    model = checked.proto
    specs = input_specs(model)
    given = _load_feeds(args.feeds, specs) if args.feeds else {}
    dims = _parse_dims(args.dim or (), model, specs, given, args.feeds)
    _check_drawable(specs, given, dims)
    ranges = _parse_ranges(args.input_range or (), specs, given, args.feeds)
    kernels = _parse_kernels(args.ort_kernel or (), model)
    dtype = _model_dtype(model)
    try:
        provider = parse_provider(args.provider)
    except ValueError as exc:
        raise _CompareError(f"--provider: {exc}") from None
    why = unavailable_reason(provider)
    if why:
        raise _CompareError(f"--provider {args.provider}: {why}")
    checker = Checker(provider, dtype)
    try:
        feeds = _draw_feeds(model, specs, given, dims, ranges, seed=args.seed, device=checker.device)
    except (ValueError, TypeError, RuntimeError, OverflowError, MemoryError) as exc:  # what _check_drawable did not foresee
        raise _CompareError(f"cannot draw feeds for {args.model}: {exc}; give the inputs' values with --feeds FILE.npz") from None
    notes = ""
    if given:
        notes += f"; feeds from {args.feeds}: {', '.join(given)}"
    if ranges:
        notes += "; input ranges: " + ", ".join(f"{n}=[{_num(lo)}, {_num(hi)})" for n, (lo, hi) in ranges.items())
    if kernels:
        notes += f"; with onnxruntime: {', '.join(args.ort_kernel)}"
    if args.missing == "ort":
        notes += "; ops without a torch kernel on onnxruntime"
    print(f"{args.model}: torch evaluator vs onnxruntime {checker.provider} {dtype}, dims {dims}, seed {args.seed}{notes}")
    try:
        result = checker.check(checked, feeds, kernels=kernels or None, missing=args.missing)  # (checked once, run from its file above 2 GB)
    except ToleranceBroken as exc:
        print(exc)
        return 1
    except UnsupportedByProvider as exc:  # a (provider, dtype, op) onnxruntime does not implement
        raise _CompareError(exc.reason) from None
    except MissingKernelError as exc:
        raise _CompareError(_missing_kernel_message(exc)) from None
    except OrtRunError as exc:
        raise _CompareError(f"onnxruntime cannot run {args.model}: {exc.detail}{_drawn_hint(model, specs, given, ranges)}") from None
    print(f"passed ({checker.tolerance.describe()})")
    line = result.ran_on_ort_line()
    if line:
        print(line)
    print(result.report.render())
    return 0


def _load_checked(name: str) -> Any:
    """The model file, loaded and passed through onnx.checker (whose message beats onnxruntime's): the
    CheckedModel (a model above 2 GB is checked, and run by onnxruntime, from the file)."""
    from .model_io import InvalidModelError, ModelLoadError, check_model, load_model

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
    (dtype, rank, fixed dims), and the symbolic dims they share consistent."""
    import zipfile

    import numpy as np
    import torch

    from .model_io import check_feed, feed_dims

    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise _CompareError(f"--feeds {path}: the file does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise _CompareError(f"--feeds {path}: not a .npz file of named arrays ({exc}); write one with numpy.savez(path, input_name=array, ...)") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise _CompareError(f"--feeds {path}: a single array, not a .npz file of named arrays; write one with numpy.savez(path, input_name=array, ...)")
    with loaded:
        try:
            arrays = {name: loaded[name] for name in loaded.files}
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise _CompareError(f"--feeds {path}: cannot read its arrays ({exc})") from None
    inputs = ", ".join(f"{n}: {s.describe()}" for n, s in specs.items())
    if not arrays:
        raise _CompareError(f"--feeds {path}: the file holds no arrays; the model's inputs: {inputs}")
    unknown = [n for n in arrays if n not in specs]
    if unknown:
        unnamed = all(re.fullmatch(r"arr_\d+", n) for n in unknown)
        how = "; save them by name: numpy.savez(path, input_name=array, ...)" if unnamed else ""
        raise _CompareError(f"--feeds {path}: {', '.join(map(repr, unknown))} {'is not an input' if len(unknown) == 1 else 'are not inputs'} of the model; its inputs: {inputs}{how}")
    try:
        for name, arr in arrays.items():
            check_feed(specs[name], arr)
        feed_dims(specs, arrays)
    except (TypeError, ValueError) as exc:
        raise _CompareError(f"--feeds {path}: {exc}") from None
    return {name: torch.from_numpy(np.ascontiguousarray(arr)) for name, arr in arrays.items()}


def _parse_dims(items: Sequence[str], model: Any, specs: Mapping[str, InputSpec], given: Mapping[str, Any], feeds_file: str | None) -> dict[str, int]:
    """--dim NAME=VALUE for every symbolic dim the feeds from --feeds do not fix already."""
    from .model_io import feed_dims
    from .strategies import PinnedDims, pinned_dims, symbolic_dims

    known = symbolic_dims(model)
    fixed = feed_dims(specs, given)
    dims: dict[str, int] = dict(fixed)
    # the dims the model itself fixes (a weight's size exported as a symbolic dim), or makes equal to another
    pins = pinned_dims(model) if any(d not in fixed for d in known) else PinnedDims()
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise _CompareError(f"--dim {item!r}: expected NAME=VALUE with a positive integer, e.g. --dim batch=2")
        if not 1 <= int(value) <= _MAX_DIM:
            raise _CompareError(f"--dim {item}: expected a positive integer up to {_MAX_DIM:,}, e.g. --dim {name}=2")
        if name not in known:
            where = f"its symbolic dims: {', '.join(known)}" if known else "its inputs have none"
            raise _CompareError(f"--dim {item}: the model has no symbolic dim {name!r}; {where}")
        if name in fixed and fixed[name] != int(value):
            raise _CompareError(f"--dim {item}: the feeds in {feeds_file} have {name}={fixed[name]}; drop --dim {name} or change the file")
        if name in pins.fixed and pins.fixed[name] != int(value):
            raise _CompareError(f"--dim {item}: {pins.why(name)}, and onnxruntime fails on any other value; drop --dim {name} (it is taken as {pins.fixed[name]})")
        dims[name] = int(value)
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


def _parse_ranges(items: Sequence[str], specs: Mapping[str, InputSpec], given: Mapping[str, Any], feeds_file: str | None) -> dict[str, tuple[float, float]]:
    """--input-range NAME=LO:HI: the values a drawn input takes, LO included and HI excluded (integers:
    0:2 draws 0 and 1, as range(0, 2))."""
    from .dtypes import DType

    ranges: dict[str, tuple[float, float]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        lo_text, sep2, hi_text = text.partition(":")
        example = "e.g. --input-range token_type_ids=0:2 (HI excluded: draws 0 and 1)"
        if not (sep and sep2 and name and lo_text.strip() and hi_text.strip()):
            raise _CompareError(f"--input-range {item!r}: expected NAME=LO:HI, {example}")
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


def _parse_kernels(items: Sequence[str], model: Any) -> dict[tuple[str, str], str]:
    """--ort-kernel OP or DOMAIN::OP -> TorchEvaluator's kernels={(domain, op): "ort"}."""
    ops = sorted({_op_label(n.domain, n.op_type) for n in model.graph.node})
    kernels: dict[tuple[str, str], str] = {}
    for item in items:
        domain, _, op = item.rpartition("::")
        if not op or (item.count("::") and not domain):
            raise _CompareError(
                f"--ort-kernel {item!r}: expected OP or DOMAIN::OP, e.g. --ort-kernel LayerNormalization or --ort-kernel com.microsoft::FusedMatMul"
            )
        domain = "" if domain == "ai.onnx" else domain
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
    from .check import missing_ops

    head = str(exc).split(";")[0]
    ops = missing_ops(exc)
    them = "it" if len(ops) == 1 else "them"
    return f"{head}; run {them} with onnxruntime instead: " + " ".join(f"--ort-kernel {op}" for op in ops) + " (or --missing=ort)"


def _model_dtype(model: Any) -> str:
    """The dtype the model computes in, for the tolerance: its first floating output's, else its first
    floating initializer's, else its first floating input's (an int64 ids input says nothing)."""
    from .dtypes import DType

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


def _precision(args: argparse.Namespace) -> int:
    """`precision MODEL`: the audit table and keep_float32's report (pytest_ortdiff.precision) on drawn or
    given feeds; exit 0 for a verified list, 1 when none meets the budget, 2 for bad arguments."""
    from .model_io import input_specs
    from .precision.keep import keep_float32, parse_budget
    from .providers import parse_provider, torch_device, unavailable_reason

    try:
        if args.samples < 1 or not 0 <= args.seed < 2**63 - args.samples:
            raise _CompareError(f"--samples {args.samples} --seed {args.seed}: expected at least one sample and a seed from 0 to 2**63-1")
        provider = parse_provider(args.provider)
        if unavailable_reason(provider):
            raise _CompareError(f"--provider {args.provider}: {unavailable_reason(provider)}")
        model = _load_checked(args.model).proto
        specs = input_specs(model)
        given = _load_feeds(args.feeds, specs) if args.feeds else {}
        dims = _parse_dims(args.dim or (), model, specs, given, args.feeds)
        _check_drawable(specs, given, dims)
        ranges = _parse_ranges(args.input_range or (), specs, given, args.feeds)
        feeds = [_draw_feeds(model, specs, given, dims, ranges, seed=args.seed + i, device=torch_device(provider)) for i in range(args.samples)]
        tolerance = {"budget": parse_budget(args.budget)} if args.budget else None
        report = keep_float32(model, feeds, dtype=args.dtype, tolerance=tolerance, provider=provider)
        if args.write_converted and report.converted_model is not None:
            report.write_converted(args.write_converted)
    except (_CompareError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    assert report.audit is not None
    print(f"{args.model}: {args.samples} input(s), dims {dims}, seed {args.seed}\n\n{report.audit.render()}\n\n{report.render()}")
    if args.write_converted:
        print(f"\nwrote {args.write_converted}" if report.converted_model is not None else f"\nnot written: {args.write_converted} (no verified list)")
    return 0 if report.verified else 1


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


def main(argv: Sequence[str] | None = None) -> int:
    from . import conformance  # light: numpy only, until a command runs it

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
    p = sub.add_parser("compare", help="torch evaluator vs onnxruntime on a model file, with random feeds")
    p.add_argument("model")
    p.add_argument("--provider", default="CPU")
    p.add_argument("--dim", action="append", help="a symbolic dim, NAME=VALUE (repeat)")
    p.add_argument(
        "--ort-kernel",
        action="append",
        metavar="OP",
        help="run this op (OP, or DOMAIN::OP such as com.microsoft::FusedMatMul) with onnxruntime inside the torch "
        "evaluator as well, as kernels={(domain, op): 'ort'} does: for an op it has no torch kernel for (repeat)",
    )
    p.add_argument(
        "--missing",
        choices=("error", "ort"),
        default="error",
        help="an op the torch evaluator has no kernel for: 'error' (default) names them all; 'ort' runs each on onnxruntime, and the output says which",
    )
    p.add_argument("--feeds", metavar="FILE.npz", help="named inputs from a file written by numpy.savez(path, input_name=array, ...); the inputs it lacks are drawn")
    p.add_argument(
        "--input-range",
        action="append",
        metavar="NAME=LO:HI",
        help="draw input NAME in [LO, HI), HI excluded (integers: token_type_ids=0:2 draws 0 and 1; default: floats [-1, 1), integers [0, 10)) (repeat)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_compare)
    p = sub.add_parser("precision", help="float16/bfloat16 range audit of a float32 model and its smallest verified keep-in-float32 list")
    p.add_argument("model")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--provider", default="CPU")
    p.add_argument("--dim", action="append", help="a symbolic dim, NAME=VALUE (repeat)")
    p.add_argument("--feeds", metavar="FILE.npz", help="named inputs (numpy.savez(path, input_name=array, ...)); the inputs it lacks are drawn")
    p.add_argument("--input-range", action="append", metavar="NAME=LO:HI", help="draw input NAME in [LO, HI) (repeat)")
    p.add_argument("--samples", type=int, default=4, help="inputs to audit and search on (seeds SEED, SEED+1, ...; default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", action="append", metavar="T:F", help="at most the share F of elements off by more than T (repeat; default: the dtype's atol/rtol)")
    p.add_argument("--write-converted", metavar="OUT.onnx", help="write the model converted with the list")
    p.set_defaults(func=_precision)
    p = sub.add_parser(
        "conformance",
        help="run ONNX's node test suite through the torch evaluator: a table of pass/wrong/unsupported/no kernel/error per op",
        description=conformance.DESCRIPTION,
    )
    conformance.add_arguments(p)
    p.set_defaults(func=conformance.run_from_args)
    p = sub.add_parser(
        "demo",
        help="run the seeds/000 example suite of the source checkout's examples/ (pip does not install it) on every "
        "available provider; further arguments go to pytest, e.g. demo -q -x",
    )
    p.add_argument("pytest_args", nargs="*", help="arguments for pytest (options too, without a '--')")
    p.set_defaults(func=_demo)
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if args.command == "demo":
        # everything after `demo` is pytest's, in its order (argparse would split options from values)
        rest = argv[argv.index("demo") + 1 :]
        args.pytest_args = rest[1:] if rest[:1] == ["--"] else rest
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
