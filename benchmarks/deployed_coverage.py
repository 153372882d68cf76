"""Which deployed models run, and how close: the corpus of tests/deployed_models.py (tiny transformers models through
onnxruntime's tool chain) through our torch evaluator and its peers, each against onnxruntime on CPU.

One row per model form; each column says what a runtime did with that file and, when it ran, the largest
absolute difference from onnxruntime's outputs:

- `ours`: `TorchEvaluator(path)` with `missing="error"` (every node on a torch kernel);
- `missing=ort`: `TorchEvaluator(path, missing="ort")`, and how many nodes ran on onnxruntime for lack of a kernel;
- `onnx.reference`: `onnx.reference.ReferenceEvaluator`;
- `od numpy` / `od torch`: onnx-diagnostic's `ExtendedReferenceEvaluator` and `TorchOnnxEvaluator`
  (when onnx-diagnostic is installed; `-` otherwise).

A cell reads `ok 3.1e-07`, `missing: com.microsoft::Attention, ...`, `refused: <checker's reason>`, or the error's first
line. The corpus is built on first use and cached (default: the test suite's cache, `.pytest_cache/d/ortdiff-deployed`).

    python benchmarks/deployed_coverage.py [--forms default|full|NAME ...] [--cache DIR] [--no-peers] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import deployed_models as dm  # noqa: E402


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:90] if text else ''}"


def _max_abs(expected: list[np.ndarray], got: list[Any]) -> float:
    worst = 0.0
    for e, g in zip(expected, got, strict=True):
        g = g.detach().cpu().float().numpy() if hasattr(g, "detach") else np.asarray(g)
        e = np.asarray(e)
        if e.dtype.kind == "f" or g.dtype.kind == "f":
            worst = max(worst, float(np.max(np.abs(e.astype(np.float64) - g.astype(np.float64)), initial=0.0)))
        elif not np.array_equal(e, g):
            return float("inf")
    return worst


def _cell(run: Callable[[], list[Any]], expected: list[np.ndarray] | None, extra: Callable[[], str] | None = None) -> str:
    from pytest_ortdiff.runtimes.evaluator import MissingKernelError

    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            got = run()
    except MissingKernelError as exc:
        ops = getattr(exc, "ops", None) or [str(exc).split(";")[0].removeprefix("no torch kernel for ")]
        return "missing: " + ", ".join(str(o).replace("com.microsoft::", "ms:") for o in ops)
    except Exception as exc:
        if "check_model=False" in str(exc):  # the checker gate's refusal, before any kernel runs
            return "refused: " + str(exc).strip().splitlines()[0][:90]
        return _first_line(exc)
    if expected is None:
        return "ran (onnxruntime did not)"
    diff = _max_abs(expected, got)
    return f"ok {diff:.1e}" + (f" {extra()}" if extra is not None else "")


def row(name: str, cache: Path, peers: bool) -> tuple[str, ...]:
    import onnxruntime as ort

    from pytest_ortdiff.numerics.tensors import to_numpy
    from pytest_ortdiff.runtimes.evaluator import TorchEvaluator

    path = dm.build(name, cache)
    model = onnx.load(str(path))
    feeds = dm.feeds(path)
    np_feeds = {k: to_numpy(v) for k, v in feeds.items()}
    ops = Counter(f"{n.domain}:{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in model.graph.node)
    contrib = sorted({o.split(":")[-1] for o in ops if o.startswith("com.microsoft")})
    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected: list[np.ndarray] | None = session.run(None, np_feeds)
        ort_cell = "ok"
    except Exception as exc:
        expected, ort_cell = None, _first_line(exc)
    ev_holder: dict[str, Any] = {}

    def ours(missing: str) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            ev = TorchEvaluator(str(path), missing=missing) if missing != "error" else TorchEvaluator(str(path))
            ev_holder[missing] = ev
            return list(ev.run(None, feeds))

        return run

    def on_ort() -> str:
        by_ort = set(getattr(ev_holder.get("ort"), "ops_run_by_ort", ()) or ())
        n = sum(1 for node in model.graph.node if (node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}") in by_ort)
        return f"({n} of {len(model.graph.node)} nodes on ort)"

    cells = [name, str(len(model.graph.node)), ",".join(contrib)[:60] or "-", ort_cell,
             _cell(ours("error"), expected), _cell(ours("ort"), expected, on_ort)]
    if peers:
        from onnx.reference import ReferenceEvaluator

        cells.append(_cell(lambda: ReferenceEvaluator(model).run(None, np_feeds), expected))
        try:
            from onnx_diagnostic.reference import ExtendedReferenceEvaluator, TorchOnnxEvaluator
        except ImportError:
            cells += ["-", "-"]
        else:
            cells.append(_cell(lambda: ExtendedReferenceEvaluator(model).run(None, np_feeds), expected))
            cells.append(_cell(lambda: TorchOnnxEvaluator(model).run(None, feeds), expected))
    return tuple(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forms", nargs="*", default=["default"], help="'default' (the test suite's subset), 'full', or form names")
    parser.add_argument("--cache", type=Path, default=ROOT / ".pytest_cache" / "d" / "ortdiff-deployed")
    parser.add_argument("--no-peers", action="store_true", help="leave out onnx.reference and onnx-diagnostic")
    parser.add_argument("--markdown", action="store_true", help="a markdown table (default: aligned text)")
    opts = parser.parse_args()
    names: list[str] = []
    for f in opts.forms:
        names += list(dm.DEFAULT if f == "default" else dm.FULL if f == "full" else [f])
    head = ("form", "nodes", "contrib ops", "onnxruntime", "ours (missing=error)", "missing=ort", "onnx.reference", "od numpy", "od torch")
    if opts.no_peers:
        head = head[:6]
    rows: list[tuple[str, ...]] = []
    t0 = time.perf_counter()
    for name in names:
        form = dm.FORMS[name]
        why = dm.why_unavailable(form)
        if why:
            rows.append((name, "", "", why, *[""] * (len(head) - 4)))
            continue
        try:
            rows.append(row(name, opts.cache, not opts.no_peers))
        except Exception as exc:
            rows.append((name, "", "", f"not built: {_first_line(exc)}", *[""] * (len(head) - 4)))
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if opts.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    else:
        rows = [tuple(c if len(c) <= 64 else c[:62] + ".." for c in r) for r in rows]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    cols = {h: i for i, h in enumerate(head)}
    for h in head[4:]:
        if all(r[cols[h]] in ("", "-") for r in rows):
            print(f"{h}: not installed here, not measured", file=sys.stderr)
            continue
        ran = [float(r[cols[h]].split()[1]) for r in rows if r[cols[h]].startswith("ok")]
        close = sum(1 for d in ran if d <= 1e-4)
        print(f"{h}: {len(ran)} of {len(rows)} run, {close} within 1e-4 of onnxruntime", file=sys.stderr)


if __name__ == "__main__":
    main()
