"""Does `precision.audit` stream? Its peak memory against one evaluator run's, and its time in runs.

The graph: the Llama-like module of `real_graphs.py` with 2 decoder layers (478 nodes), exported by
the TorchScript exporter with dynamic batch and sequence, float32, CPU, fed (batch 8, sequence 256) so
that activations (the 8 x 4 x 256 x 256 attention scores: 8 MiB) dwarf the interpreter's noise.

Memory: each measurement runs in a fresh subprocess, after a warm-up call of the same kind (lazy imports,
kernel caches and allocator arenas paid before), with glibc's mmap threshold pinned to 64 KiB
(MALLOC_MMAP_THRESHOLD_) so that every tensor of more than 64 KiB is its own mapping, returned to the
system when freed: the process's resident set then follows the live tensors. The peak is Linux's VmHWM,
reset just before the call (`echo 5 > /proc/self/clear_refs`), minus the resident set at that moment:
numpy, torch and Python allocations alike (tracemalloc would not see torch's). Measured:

- `run`: one `TorchEvaluator.run(None, feeds)` (the evaluator built before);
- `audit xK`: `audit(model, feeds for K inputs)`, building its own evaluator, inputs made one at a time;
- `keep-all`: one `run(..., intermediates=True)`, every value kept: what an audit that stored the
  intermediates before reducing them would hold, for one input.

Goal (issue 15): the audit's peak stays within 2x one run's. Time: the audit over K inputs in runs' worth
(K runs would be 1x the streamed cost of the graph itself; the rest is the reductions).

    python benchmarks/bench_precision.py [--layers 2] [--batch 8] [--seq 256] [--inputs 8] [--show]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_graphs

from pytest_ortdiff import TorchEvaluator
from pytest_ortdiff.analyses.precision import audit


def exported(layers: int) -> Path:
    """The Llama-like module with `layers` layers, TorchScript-exported with dynamic axes, cached on disk."""
    key = hashlib.sha256(
        Path(real_graphs.__file__).read_bytes() + torch.__version__.encode() + str(layers).encode()
    ).hexdigest()[:16]
    path = Path(
        tempfile.gettempdir(), "pytest_ortdiff_bench_precision", f"llama{layers}-{key}.onnx"
    )
    if path.exists():
        return path
    torch.manual_seed(0)
    module = real_graphs.LlamaLike(layers=layers).eval()
    names = ("input_ids", "attention_mask")
    args = real_graphs.GRAPHS["llama"].inputs(2, 16)
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            buf,  # type: ignore[arg-type]
            dynamo=False,
            opset_version=18,
            input_names=list(names),
            output_names=["output"],
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return path


def _feeds(batch: int, seq: int, seed: int) -> dict[str, torch.Tensor]:
    return real_graphs.feeds("llama", batch, seq, seed)


def _status(key: str) -> int:
    """A /proc/self/status field, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _peak_of(call: object) -> int:
    """Peak resident bytes above the current resident set while `call()` runs."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    base = _status("VmRSS")
    call()  # type: ignore[operator]
    return _status("VmHWM") - base


def child(mode: str, path: str, batch: int, seq: int, inputs: int) -> None:
    torch.set_num_threads(1)
    model = onnx.load(path)
    if mode == "first-run":
        # a fresh evaluator's first run: the values that depend only on shapes are computed live; lazy
        # imports and allocator arenas paid before, by another evaluator
        ev = TorchEvaluator(model)
        TorchEvaluator(model).run(None, _feeds(batch, seq, 0))
        feeds = _feeds(batch, seq, 1)
        peak = _peak_of(lambda: ev.run(None, feeds))
    elif mode in ("run", "keep-all", "observed"):
        ev = TorchEvaluator(model)
        feeds = _feeds(batch, seq, 0)
        keep = mode == "keep-all"
        observe = (lambda node, outputs: None) if mode == "observed" else None
        ev.run(None, feeds, intermediates=keep, observe=observe)
        peak = _peak_of(lambda: ev.run(None, feeds, intermediates=keep, observe=observe))
    else:
        audit(model, _feeds(batch, seq, 0))
        peak = _peak_of(lambda: audit(model, (_feeds(batch, seq, s) for s in range(inputs))))
    print(peak)


def _measure(mode: str, path: Path, opts: argparse.Namespace) -> int:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    cmd = [
        sys.executable,
        __file__,
        "--child",
        mode,
        str(path),
        str(opts.batch),
        str(opts.seq),
        str(opts.inputs),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return int(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--inputs", type=int, default=8, help="feed dicts the audit runs over")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="memory measurements per mode (their median is printed)",
    )
    parser.add_argument("--show", action="store_true", help="print the audit's table")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        mode, path, batch, seq, inputs = opts.child
        child(mode, path, int(batch), int(seq), int(inputs))
        return
    path = exported(opts.layers)
    model = onnx.load(path)
    print(
        f"torch {torch.__version__}, 1 thread; Llama-like, {opts.layers} layers: {len(model.graph.node)} nodes; "
        f"batch {opts.batch}, sequence {opts.seq}; audit over {opts.inputs} inputs"
    )
    mib = 1 << 20
    peaks = {}
    for mode in ("run", "first-run", "observed", "audit", "keep-all"):
        peaks[mode] = statistics.median(_measure(mode, path, opts) for _ in range(opts.repeat))
    run = peaks["run"]
    print(f"peak memory above the resident set (MiB, median of {opts.repeat} fresh processes):")
    print(
        f"  one run (warm)       {run / mib:8.1f}   1.00x   values that depend only on shapes are cached, not recomputed"
    )
    print(
        f"  one run (first)      {peaks['first-run'] / mib:8.1f}   {peaks['first-run'] / run:.2f}x   a fresh evaluator: those values computed live"
    )
    print(
        f"  run(observe=no-op)   {peaks['observed'] / mib:8.1f}   {peaks['observed'] / run:.2f}x   the streamed path the audit runs, without its reductions"
    )
    print(
        f"  audit x{opts.inputs:<13} {peaks['audit'] / mib:8.1f}   {peaks['audit'] / run:.2f}x   (goal <= 2x one run), its own evaluator built inside"
    )
    print(
        f"  keep-all run         {peaks['keep-all'] / mib:8.1f}   {peaks['keep-all'] / run:.2f}x   run(intermediates=True): what not streaming would hold"
    )

    torch.set_num_threads(1)
    ev = TorchEvaluator(model)
    feeds = [_feeds(opts.batch, opts.seq, s) for s in range(opts.inputs)]
    ev.run(None, feeds[0])
    runs = []
    for f in feeds * 2:
        t = time.perf_counter()
        ev.run(None, f)
        runs.append(time.perf_counter() - t)
    run = min(runs)  # the machine is shared: the fastest run is the least disturbed one
    audit(model, feeds[0])
    took = []
    for _ in range(3):
        t = time.perf_counter()
        report = audit(model, feeds)
        took.append(time.perf_counter() - t)
    best = min(took)
    print(
        f"time: one run {run * 1e3:.1f} ms; audit x{opts.inputs} {best:.2f} s = {best / run:.1f} runs' worth, "
        f"{best / run / opts.inputs:.2f} runs per input"
    )
    print(report.summary())
    if opts.show:
        print(report.render())


if __name__ == "__main__":
    main()
