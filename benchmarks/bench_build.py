"""What does building a TorchEvaluator cost, in runs of the graph it builds, and its float64 twin?

Stacked-layer graphs: `bench_blame.stacked` (the Llama-like module of `real_graphs.py`, TorchScript
export, batch 2, float32, CPU, torch on one thread) with 1, 8 and 25 decoder layers at hidden 64 /
sequence 16 (toy tensors: a run is a few µs per node, so what a build costs per node weighs most) and 8
layers at hidden 256 / sequence 128 (a run of ~50 ms: large initializers). Per graph, in runs' worth
(run = the fastest of 15 `ev.run(None, feeds)`):

- `build`: `TorchEvaluator(model)` (the checker's verdict is cached per model, as after a first build)
- `twin`: `ev.with_compute_dtype(torch.float64)`, the float64 oracle from an evaluator already built
- `fresh f64`: `TorchEvaluator(model, compute_dtype=torch.float64, check_model=False)`, what the twin saves

Each the fastest of `--repeat` builds (the machine is shared: the fastest is the least disturbed); the
twin's outputs are checked bit-identical to the fresh float64 evaluator's before anything is timed.

    python benchmarks/bench_build.py [--repeat N] [--threads N]

Ratios, not seconds, are what to compare between machines; no test asserts on them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_blame

from pytest_ortdiff import TorchEvaluator

GRAPHS = [(1, 64, 16), (8, 64, 16), (25, 64, 16), (8, 256, 128)]  # (layers, hidden, sequence)


def fastest(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="builds timed per figure (default 7; the fastest counts)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as bench_blame)")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); CPU float32; times in evaluator runs' worth")
    print(f"{'layers':>6} {'hidden':>6} {'seq':>4} {'nodes':>6} {'run ms':>8} {'build ms':>9} {'build':>6} {'twin ms':>8} {'twin':>5} {'fresh f64 ms':>13} {'fresh f64':>9}")
    for layers, hidden, seq in GRAPHS:
        model, feeds = bench_blame.stacked(layers, hidden, seq)
        ev = TorchEvaluator(model)  # also caches the checker's verdict, as any build after the first finds it
        ev.run(None, feeds)
        run = fastest(lambda: ev.run(None, feeds), 15)  # noqa: B023
        fresh = TorchEvaluator(model, compute_dtype=torch.float64, check_model=False)
        twin = ev.with_compute_dtype(torch.float64)
        for a, b in zip(twin.run(None, feeds), fresh.run(None, feeds), strict=True):
            if not (a.dtype == b.dtype and torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))):
                raise AssertionError(f"the float64 twin's output differs from a fresh float64 evaluator's ({layers} layers)")
        build = fastest(lambda: TorchEvaluator(model), opts.repeat)  # noqa: B023
        twin_t = fastest(lambda: ev.with_compute_dtype(torch.float64), opts.repeat)  # noqa: B023
        fresh_t = fastest(lambda: TorchEvaluator(model, compute_dtype=torch.float64, check_model=False), opts.repeat)  # noqa: B023
        n = len(model.graph.node)
        print(
            f"{layers:>6} {hidden:>6} {seq:>4} {n:>6} {run * 1e3:>8.2f} {build * 1e3:>9.1f} {build / run:>6.1f} "
            f"{twin_t * 1e3:>8.1f} {twin_t / run:>5.1f} {fresh_t * 1e3:>13.1f} {fresh_t / run:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
