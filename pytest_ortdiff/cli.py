"""`python -m pytest_ortdiff ...`: merge CI jobs' JSON reports into one table, compare a model file's
torch-evaluator and onnxruntime outputs, run ONNX's node test suite through the evaluator, run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


#: a test's outcome in an --ortdiff-json file (plugin.OUTCOMES); failed and error fail `merge --strict`
_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def _problem(data: dict[str, Any]) -> str | None:
    """What makes a loaded --ortdiff-json file unusable, naming the row; None when it is fine. Files
    written before test outcomes were recorded have no 'tests' and are fine."""
    results = data["results"]
    if not isinstance(results, list):
        return "'results' is not a list"
    for i, row in enumerate(results):
        if not isinstance(row, dict):
            return f"results[{i}] is not an object"
        if not isinstance(row.get("test"), str):
            return f"results[{i}] has no 'test' (a string)"
    for key in ("tests", "skips"):
        items = data.get(key, [])
        if not isinstance(items, list):
            return f"{key!r} is not a list"
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                return f"{key}[{i}] is not an object"
            if key == "tests":
                if not isinstance(item.get("test"), str):
                    return f"tests[{i}] has no 'test' (a string)"
                if item.get("outcome") not in _OUTCOMES:
                    return f"tests[{i}] has outcome {item.get('outcome')!r}; valid: {', '.join(_OUTCOMES)}"
    return None


def _uncovered(tests: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows for the failed tests of one job that no failed check row explains: failed before their
    check, without any check, or after their checks passed."""
    out = []
    for t in tests:
        if t["outcome"] not in ("failed", "error"):
            continue
        own = [r for r in rows if r["test"] == t["test"] or r["test"].startswith(t["test"] + " [")]
        if any(r.get("outcome") not in ("passed", "xfailed") for r in own):
            continue
        worst = "its checks passed; the test failed" if own else "no check ran"
        out.append({"test": t["test"], "provider": t.get("provider"), "dtype": t.get("dtype"), "worst": worst, "outcome": t["outcome"]})
    return out


def _labelled(item: dict[str, Any], job: str) -> dict[str, Any]:
    return {**item, "test": f"{item['test']} ({job})"} if job else item


def _merge(args: argparse.Namespace) -> int:
    from collections import Counter

    from .report import render_table

    rows: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    tests: list[dict[str, Any]] = []
    uncovered: list[dict[str, Any]] = []
    for name in args.files:
        path = Path(name)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            print(f"error: {path} does not exist", file=sys.stderr)
            return 2
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            print(f"error: {path} is not a JSON report written by --ortdiff-json ({exc})", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if not isinstance(data, dict) or "results" not in data:
            print(f"error: {path} has no 'results': is it a file written by --ortdiff-json?", file=sys.stderr)
            return 2
        problem = _problem(data)
        if problem:
            print(f"error: {path}: {problem}: is it a file written by --ortdiff-json?", file=sys.stderr)
            return 2
        job = path.stem if args.label_from_file else ""
        file_tests = data.get("tests", [])
        uncovered.extend(_labelled(r, job) for r in _uncovered(file_tests, data["results"]))
        rows.extend(_labelled(row, job) for row in data["results"])
        tests.extend(_labelled(t, job) for t in file_tests)
        skips.extend(data.get("skips", []))
    rows.sort(key=lambda r: (r["test"], r.get("provider") or "", r.get("dtype") or ""))
    table = sorted(rows + uncovered, key=lambda r: (r["test"], r.get("provider") or "", r.get("dtype") or ""))
    print(render_table(table, markdown=args.markdown))
    # (rows of files written before "xfailed" existed have only passed/failed)
    failed = sum(1 for r in rows if r.get("outcome") not in ("passed", "xfailed"))
    expected = sum(1 for r in rows if r.get("outcome") == "xfailed")
    tail = f", {expected} expected to fail (xfailed)" if expected else ""
    print(f"\n{len(rows)} check(s) from {len(args.files)} file(s): {len(rows) - failed - expected} passed, {failed} failed{tail}")
    counts = Counter(t["outcome"] for t in tests)
    if tests:
        extra = "".join(f", {counts[o]} {o}" for o in ("xfailed", "xpassed") if counts[o])
        print(f"{len(tests)} test(s): {counts['passed']} passed, {counts['failed']} failed, {counts['error']} error(s), {counts['skipped']} skipped{extra}")
    for t in tests:
        if t["outcome"] in ("failed", "error"):
            message = t.get("message")
            print(f"{'failed' if t['outcome'] == 'failed' else 'errored'}: {t['test']}" + (f": {message}" if message else ""))
    for s in skips:
        print(f"skipped: {s.get('test', '?')}: {s.get('reason', '')}")
    if args.output:
        try:
            Path(args.output).write_text(json.dumps({"results": rows, "skips": skips, "tests": tests}, indent=1))
        except OSError as exc:
            print(f"error: --output {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 1 if (failed or counts["failed"] or counts["error"]) and args.strict else 0


def _compare(args: argparse.Namespace) -> int:
    try:
        return _compare_or_raise(args)
    except _CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


class _CompareError(Exception):
    """A bad model or argument: one line on stderr, exit status 2."""


def _compare_or_raise(args: argparse.Namespace) -> int:
    import pytest

    from .fixtures import OrtDiff, OrtDiffFailure
    from .models import random_feeds
    from .providers import parse_provider, unavailable_reason
    from .runtimes.evaluator import MissingKernelError

    model = _load_checked(args.model)
    dims = _parse_dims(args.dim or (), model)
    kernels = _parse_kernels(args.ort_kernel or (), model)
    dtype = _model_dtype(model)
    try:
        provider = parse_provider(args.provider)
    except ValueError as exc:
        raise _CompareError(f"--provider: {exc}") from None
    why = unavailable_reason(provider)
    if why:
        raise _CompareError(f"--provider {args.provider}: {why}")
    checker = OrtDiff(provider, dtype)
    feeds = random_feeds(model, dims, seed=args.seed, device=checker.device)
    with_ort = f"; with onnxruntime: {', '.join(args.ort_kernel)}" if kernels else ""
    print(f"{args.model}: torch evaluator vs onnxruntime {checker.provider} {dtype}, dims {dims}, seed {args.seed}{with_ort}")
    try:
        # kernels= only when asked, so that plain compares need nothing new from OrtDiff.check
        report = checker.check(model, feeds, **({"kernels": kernels} if kernels else {}))
    except OrtDiffFailure as exc:
        print(exc)
        return 1
    except pytest.skip.Exception as exc:  # a (provider, dtype, op) onnxruntime does not implement
        raise _CompareError(exc.msg) from None
    except MissingKernelError as exc:
        raise _CompareError(_missing_kernel_message(exc)) from None
    except Exception as exc:
        if not type(exc).__module__.startswith("onnxruntime"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _CompareError(f"onnxruntime cannot run {args.model}: {first}") from None
    print(f"passed ({checker.tolerance.describe()})")
    print(report.render())
    return 0


def _load_checked(name: str) -> Any:
    """The model file, loaded and passed through onnx.checker (whose message beats onnxruntime's)."""
    import onnx
    from google.protobuf.message import DecodeError

    from .runtimes.ort import load_model

    try:
        model = load_model(name)
    except DecodeError as exc:
        raise _CompareError(f"cannot load {name!r}: not an ONNX model ({exc})") from None
    except (OSError, ValueError) as exc:
        raise _CompareError(f"cannot load {name!r}: {exc}") from None
    try:
        try:
            onnx.checker.check_model(model)
        except ValueError:  # a model above 2 GB: the checker wants its path, which holds it and its data
            onnx.checker.check_model(name)
    except onnx.checker.ValidationError as exc:
        head, _, context = str(exc).partition("==> Context:")
        problem = " ".join(head.split()) + (f" ({' '.join(context.split())})" if context.strip() else "")
        raise _CompareError(f"{name} fails onnx.checker: {problem}") from None
    return model


def _parse_dims(items: Sequence[str], model: Any) -> dict[str, int]:
    from .strategies import symbolic_dims

    known = symbolic_dims(model)
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            raise _CompareError(f"--dim {item!r}: expected NAME=VALUE with a positive integer, e.g. --dim batch=2")
        if int(value) < 1:
            raise _CompareError(f"--dim {item}: expected a positive integer, e.g. --dim {name}=2")
        if name not in known:
            where = f"its symbolic dims: {', '.join(known)}" if known else "its inputs have none"
            raise _CompareError(f"--dim {item}: the model has no symbolic dim {name!r}; {where}")
        dims[name] = int(value)
    missing = [d for d in known if d not in dims]
    if missing:
        raise _CompareError(
            f"the model's inputs have symbolic dims {missing}: give each a value, e.g. " + " ".join(f"--dim {d}=2" for d in missing)
        )
    return dims


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
    --ort-kernel com.microsoft::QuickGelu" (the evaluator's own message lists every known op)."""
    head = str(exc).split(";")[0]
    missing = [m.split(" (")[0].strip() for m in head.removeprefix("no torch kernel for ").split(", ")]
    return f"{head}; run it with onnxruntime instead: " + " ".join(f"--ort-kernel {op}" for op in missing)


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
    p = sub.add_parser("merge", help="merge --ortdiff-json files of CI jobs into one table")
    p.add_argument("files", nargs="+")
    p.add_argument("--markdown", action="store_true", help="a markdown table (for a CI job summary)")
    p.add_argument("--output", help="also write the merged JSON here")
    p.add_argument("--label-from-file", action="store_true", help="append each file's stem (the job name) to its test ids")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check failed, or any test failed or errored (with or without a check)")
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
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_compare)
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
