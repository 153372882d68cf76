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


def _merge(args: argparse.Namespace) -> int:
    from .report import render_table

    rows: list[dict[str, Any]] = []
    skips: list[dict[str, Any]] = []
    for name in args.files:
        path = Path(name)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            print(f"error: {path} does not exist", file=sys.stderr)
            return 2
        except json.JSONDecodeError as exc:
            print(f"error: {path} is not a JSON report written by --ortdiff-json ({exc})", file=sys.stderr)
            return 2
        if not isinstance(data, dict) or "results" not in data:
            print(f"error: {path} has no 'results': is it a file written by --ortdiff-json?", file=sys.stderr)
            return 2
        job = args.label_from_file and path.stem
        rows.extend({**row, "test": f"{row['test']} ({job})" if job else row["test"]} for row in data["results"])
        skips.extend(data.get("skips", []))
    rows.sort(key=lambda r: (r["test"], r.get("provider", ""), r.get("dtype", "")))
    print(render_table(rows, markdown=args.markdown))
    failed = sum(1 for r in rows if r.get("outcome") != "passed")
    print(f"\n{len(rows)} check(s) from {len(args.files)} file(s): {len(rows) - failed} passed, {failed} failed")
    for s in skips:
        print(f"skipped: {s.get('test', '?')}: {s.get('reason', '')}")
    if args.output:
        Path(args.output).write_text(json.dumps({"results": rows, "skips": skips}, indent=1))
    return 1 if failed and args.strict else 0


def _compare(args: argparse.Namespace) -> int:
    import pytest

    from .fixtures import OrtDiff, OrtDiffFailure
    from .models import random_feeds
    from .providers import parse_provider, unavailable_reason
    from .runtimes.ort import load_model
    from .strategies import symbolic_dims

    try:
        model = load_model(args.model)
    except (OSError, ValueError) as exc:
        print(f"error: cannot load {args.model!r}: {exc}", file=sys.stderr)
        return 2
    dims = {}
    for item in args.dim or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit():
            print(f"error: --dim {item!r}: expected NAME=VALUE with a positive integer, e.g. --dim batch=2", file=sys.stderr)
            return 2
        dims[name] = int(value)
    missing = [d for d in symbolic_dims(model) if d not in dims]
    if missing:
        print(
            f"error: the model's inputs have symbolic dims {missing}: give each a value, e.g. "
            + " ".join(f"--dim {d}=2" for d in missing),
            file=sys.stderr,
        )
        return 2
    dtype = _model_dtype(model)
    try:
        provider = parse_provider(args.provider)
    except ValueError as exc:
        print(f"error: --provider: {exc}", file=sys.stderr)
        return 2
    why = unavailable_reason(provider)
    if why:
        print(f"error: --provider {args.provider}: {why}", file=sys.stderr)
        return 2
    checker = OrtDiff(provider, dtype)
    feeds = random_feeds(model, dims, seed=args.seed, device=checker.device)
    print(f"{args.model}: torch evaluator vs onnxruntime {checker.provider} {dtype}, dims {dims}, seed {args.seed}")
    try:
        report = checker.check(model, feeds)
    except OrtDiffFailure as exc:
        print(exc)
        return 1
    except pytest.skip.Exception as exc:  # a (provider, dtype, op) onnxruntime does not implement
        print(f"error: {exc.msg}", file=sys.stderr)
        return 2
    print(f"passed ({checker.tolerance.describe()})")
    print(report.render())
    return 0


def _model_dtype(model: Any) -> str:
    from .dtypes import DType

    for vi in model.graph.input:
        dt = DType(vi.type.tensor_type.elem_type)
        if dt.is_floating_point:
            return dt.short
    return "float32"


def _demo(args: argparse.Namespace) -> int:
    import pytest

    example = Path(__file__).resolve().parent.parent / "examples" / "test_layer_norm_matmul_add.py"
    if not example.exists():
        print(f"error: the demo runs {example}, which is in the source checkout only", file=sys.stderr)
        return 2
    return int(pytest.main([str(example), "--ort-providers=available", "--ort-dtypes=float32,float16", "--ortdiff-reports", *args.pytest_args]))


def main(argv: Sequence[str] | None = None) -> int:
    from . import conformance  # light: numpy only, until a command runs it

    parser = argparse.ArgumentParser(prog="python -m pytest_ortdiff", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("merge", help="merge --ortdiff-json files of CI jobs into one table")
    p.add_argument("files", nargs="+")
    p.add_argument("--markdown", action="store_true", help="a markdown table (for a CI job summary)")
    p.add_argument("--output", help="also write the merged JSON here")
    p.add_argument("--label-from-file", action="store_true", help="append each file's stem (the job name) to its test ids")
    p.add_argument("--strict", action="store_true", help="exit 1 when any check failed")
    p.set_defaults(func=_merge)
    p = sub.add_parser("compare", help="torch evaluator vs onnxruntime on a model file, with random feeds")
    p.add_argument("model")
    p.add_argument("--provider", default="CPU")
    p.add_argument("--dim", action="append", help="a symbolic dim, NAME=VALUE (repeat)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_compare)
    p = sub.add_parser(
        "conformance",
        help="run ONNX's node test suite through the torch evaluator: a table of pass/wrong/unsupported/no kernel/error per op",
        description=conformance.DESCRIPTION,
    )
    conformance.add_arguments(p)
    p.set_defaults(func=conformance.run_from_args)
    p = sub.add_parser("demo", help="run the seeds/000 example suite on every available provider")
    p.add_argument("pytest_args", nargs="*")
    p.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
