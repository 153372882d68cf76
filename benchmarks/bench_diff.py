"""How much of a check does `compare()` cost, and how does it fare against torch.testing.assert_close?

Prints, for the seeds/000 check (LayerNorm -> MatMul -> Add, `models.layer_norm_matmul_add` at a=2,
b=1024, c=1152, `models.random_feeds`) in float32 and float16 on CPU, the median of several runs of

- the torch evaluator run, the onnxruntime run, and `compare(torch_out, ort_out)`: together one check;
- `torch.testing.assert_close(ort_out, torch_out)` on the same two tensors (its AssertionError caught);

then compare's share of the check (goal: <= 10 %) and compare / assert_close (goal: <= 0.1x). The
parts run in turns, so that a busy machine slows them alike; the table shows the best of the runs
(as timeit does: the others measure the machine's other work), a line below the ratios of medians. The last column is the torch path (the
one CUDA tensors take) run on these CPU tensors, for reference only: on CPU its bucketize is a scalar
binary search per element, which is why CPU tensors take the numpy path.
`--large` adds a synthetic (32, 1024, 1152) float16 pair (37.7M elements) against assert_close and a
bare read of both tensors (`e.sum(); g.sum()`, a floor no diff can beat). With a CUDA device it also
prints the GPU figures (`gpu_figures`): the fused Triton pass and the torch path against assert_close and a
bare read, each path's peak extra memory, and whether the numbers are the CPU path's.

`--memory` measures instead the peak extra memory of each path of `compare` on CPU (the torch path is
the one CUDA tensors take): in a fresh process per case, the kernel's peak-RSS mark is reset once the
inputs exist, and its rise during one compare is reported, in bytes per element and as a multiple of
the two inputs' size (goal for the torch path: <= ~2x). Linux only (/proc/self/clear_refs).

    python benchmarks/bench_diff.py [--quick] [--repeat N] [--large] [--memory] [--gpu-only]

Ratios, not milliseconds, are what to compare between machines; no test asserts on them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pytest_ortdiff import OrtRunner, TorchEvaluator, compare, models
from pytest_ortdiff.numerics.diff import _compare

DIMS = {"a": 2, "b": 1024, "c": 1152}


def timed(fn: Callable[[], object], repeat: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()  # warm-up (sessions, allocations, CUDA kernels)
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def expect_failure(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(AssertionError):
            fn()

    return run


def interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best and median time of each function (keys name, name + " median"), run in turns so that
    each sees the same machine load."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    out = {name: min(ts) for name, ts in times.items()}
    out.update({f"{name} median": statistics.median(ts) for name, ts in times.items()})
    return out


def seed_check(dtype: str, repeat: int) -> dict[str, Any]:
    """One seeds/000 check on CPU, timed part by part."""
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    evaluator, runner = TorchEvaluator(model), OrtRunner(model)
    (expected,) = evaluator.run(None, feeds)
    (got,) = runner.run(None, feeds)
    row: dict[str, Any] = {"case": f"seeds/000 {dtype} {list(expected.shape)}"}
    row.update(
        interleaved(
            {
                "torch": lambda: evaluator.run(None, feeds),
                "ort": lambda: runner.run(None, feeds),
                "compare": lambda: compare(expected, got),
                "assert_close": expect_failure(lambda: torch.testing.assert_close(got, expected)),
            },
            repeat,
        )
    )
    row["torch path"] = timed(lambda: _compare(expected, got, path="torch"), max(1, repeat // 2))
    r = compare(expected, got)
    row["report"] = f"max abs {r.max_abs:.3g}, max ulp {r.max_ulp:g}, >0: {r.counts[0.0] / r.n:.1%}, >1e-2: {r.counts[1e-2]:,}"
    return row


def make_pair(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """expected ~ N(0, 3) in `dtype`; got = expected with relative noise of ~1 ULP (most elements 0-3
    ULP off after rounding) plus a few (1e-4) elements off by ~0.15: two runtimes' outputs."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3
    eps = torch.finfo(dtype).eps
    noisy = x * (1 + torch.randn(shape, generator=gen) * eps)
    far = torch.rand(shape, generator=gen) < 1e-4
    noisy = torch.where(far, x + torch.randn(shape, generator=gen) * 0.15, noisy)
    return x.to(dtype).to(device), noisy.to(dtype).to(device)


def synthetic(shape: tuple[int, ...], dtype: torch.dtype, device: str, repeat: int) -> dict[str, Any]:
    e, g = make_pair(shape, dtype, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    row: dict[str, Any] = {"case": f"{device} {str(dtype).replace('torch.', '')}{list(shape)}"}
    row["compare"] = timed(lambda: compare(e, g), repeat, sync)
    row["assert_close"] = timed(expect_failure(lambda: torch.testing.assert_close(g, e)), repeat, sync)
    row["bare"] = timed(lambda: (e.sum(), g.sum()), repeat, sync)
    return row


def gpu_figures(repeat: int) -> None:
    """compare() on CUDA tensors: the fused Triton pass (where Triton is importable) and the torch path,
    against torch.testing.assert_close and one read of both tensors, with each path's peak extra memory as a
    multiple of the two inputs. Goals (issue 27): 37.7M float16 elements in <= 1 ms, <= 10x a read, <= 2x
    memory; the same numbers as the CPU path (checked here on a sample of the pair)."""
    from pytest_ortdiff.numerics import diff_triton

    sync = torch.cuda.synchronize
    print(f"\nGPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {'importable' if diff_triton.available() else 'absent'}")
    if diff_triton.failure():
        print(f"the fused pass was given up in this process: {diff_triton.failure()}")
    head = f"{'case':<34} {'triton':>9} {'torch path':>10} {'assert_close':>12} {'bare read':>9} {'/bare':>7} {'mem x':>6} {'same as CPU':>11}"
    print(head)
    print("-" * len(head) + "   (ms, median; /bare and mem x: the default path's)")
    for shape, dtype in (((32, 1024, 1152), torch.float16), ((2, 1024, 1152), torch.float32), ((64, 1024, 1024), torch.float32), ((32, 1024, 1152), torch.bfloat16)):
        e, g = make_pair(shape, dtype, "cuda")
        row = {"triton": math.nan}
        if diff_triton.usable():
            try:
                row["triton"] = timed(lambda e=e, g=g: _compare(e, g, path="triton"), repeat, sync)
            except Exception as exc:  # (compile or launch: what compare() itself would give up on, with the torch path)
                diff_triton.give_up(exc)
                print(f"the fused pass failed: {diff_triton.failure()}")
        row["torch"] = timed(lambda e=e, g=g: _compare(e, g, path="torch"), repeat, sync)
        row["close"] = timed(expect_failure(lambda e=e, g=g: torch.testing.assert_close(g, e)), repeat, sync)
        row["bare"] = timed(lambda e=e, g=g: (e.sum(), g.sum()), repeat, sync)
        sync()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        report = compare(e, g, tolerance=(1e-3, 1e-3))
        sync()
        extra = (torch.cuda.max_memory_allocated() - before) / (2 * e.numel() * e.element_size())
        k = min(e.numel(), 4 << 20)  # the CPU path on a 4M-element slice (the whole pair takes seconds there)
        on_gpu = compare(e.reshape(-1)[:k], g.reshape(-1)[:k], tolerance=(1e-3, 1e-3)).to_dict()
        on_cpu = compare(e.reshape(-1)[:k].cpu(), g.reshape(-1)[:k].cpu(), tolerance=(1e-3, 1e-3)).to_dict()
        mean_ok = math.isclose(on_gpu.pop("mean_abs"), on_cpu.pop("mean_abs"), rel_tol=1e-6)
        same = on_gpu == on_cpu and mean_ok
        default = row["torch"] if math.isnan(row["triton"]) else row["triton"]
        case = f"cuda {str(dtype).replace('torch.', '')}{list(shape)}"
        print(
            f"{case:<34} {row['triton'] * 1e3:9.3f} {row['torch'] * 1e3:10.3f} {row['close'] * 1e3:12.3f} {row['bare'] * 1e3:9.3f} "
            f"{default / row['bare']:7.1f} {extra:6.2f} {'yes' if same else 'NO':>11}"
        )
        assert report.n == e.numel()


# -- memory --------------------------------------------------------------------------------------


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status: --memory needs Linux")


def memory_child(dtype: str, path: str, n: int, chunk: int | None = None) -> None:
    """In a fresh process: the rise of peak RSS during one compare of an n-element pair."""
    dt = getattr(torch, dtype)
    e, g = make_pair((n,), dt, "cpu")
    g[n // 3] = float("nan")  # one special value: its chunk takes that path too
    _compare(e[:4096], g[:4096], path=path, tolerance=(1e-3, 1e-3))  # imports and first-call allocations
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # peak RSS := current RSS (Linux >= 4.0)
    before = _peak_kib()
    _compare(e, g, path=path, tolerance=(1e-3, 1e-3), chunk=chunk)
    extra = (_peak_kib() - before) * 1024
    inputs = 2 * n * e.element_size()
    print(json.dumps({"dtype": dtype, "path": path, "n": n, "extra": extra, "inputs": inputs, "chunk": chunk}))


def memory(n: int) -> None:
    # glibc keeps freed blocks below its (self-raising) mmap threshold for reuse: RSS would then count
    # memory that is free. A fixed threshold returns every large block when it is freed.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    print(f"peak extra memory of one compare on CPU, n = {n:,} elements per tensor (fresh process per case)")
    print(f"{'dtype':<10} {'path':<6} {'inputs MiB':>10} {'extra MiB':>10} {'bytes/elem':>10} {'x inputs':>9}")
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        for path in ("torch", "numpy"):
            out = subprocess.run(
                [sys.executable, __file__, "--memory-child", dtype, path, str(n), "0"],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            mib = 1 << 20
            print(
                f"{dtype:<10} {path:<6} {r['inputs'] / mib:>10.1f} {r['extra'] / mib:>10.1f} "
                f"{r['extra'] / n:>10.1f} {r['extra'] / r['inputs']:>9.2f}"
            )


# -- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--large", action="store_true", help="also a 37.7M-element float16 pair")
    ap.add_argument("--memory", action="store_true", help="peak extra memory of each path instead of time")
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU figures (benchmarks/gpu_check.sh: its minutes are the GPU's)")
    ap.add_argument("--elements", type=int, default=8 << 20, help="elements per tensor for --memory")
    # one case of --memory, in its own process; a CHUNK (elements, 0: the path's own) calibrates _TORCH_SCRATCH
    ap.add_argument("--memory-child", nargs=4, metavar=("DTYPE", "PATH", "N", "CHUNK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        dtype, path, n, chunk = args.memory_child
        memory_child(dtype, path, int(n), int(chunk) or None)
        return
    if args.memory:
        memory(args.elements)
        return
    repeat = args.repeat or (3 if args.quick else 7)
    if args.gpu_only:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu-only: torch sees no CUDA device here")
        gpu_figures(repeat)
        return
    print(f"torch {torch.__version__}, numpy {np.__version__}, torch threads {torch.get_num_threads()}, best of {repeat} (synthetic: median)")

    def ms(x: float) -> str:
        return f"{x * 1e3:9.1f}"

    checks = [seed_check(dtype, repeat) for dtype in ("float32", "float16")]
    head = f"{'case':<34} {'torch':>9} {'ort':>9} {'compare':>9} {'share':>6} {'assert_close':>12} {'/close':>7} {'torch path on CPU':>17}"
    print(head)
    print("-" * len(head) + "   (ms; share: compare / (torch + ort + compare))")
    for r in checks:
        share = r["compare"] / (r["torch"] + r["ort"] + r["compare"])
        print(
            f"{r['case']:<34} {ms(r['torch'])} {ms(r['ort'])} {ms(r['compare'])} {share:>6.1%} "
            f"{ms(r['assert_close']):>12} {r['compare'] / r['assert_close']:>7.3f} {ms(r['torch path']):>17}"
        )
    for r in checks:
        parts = sum(r[f"{k} median"] for k in ("torch", "ort", "compare"))
        print(
            f"{r['case']:<34} medians: share {r['compare median'] / parts:.1%}, "
            f"/close {r['compare median'] / r['assert_close median']:.3f}; {r['report']}"
        )

    cases = [((2, 1024, 1152), torch.float32, "cpu")] if args.large else []
    if args.large:
        cases.append(((32, 1024, 1152), torch.float16, "cpu"))
    if torch.cuda.is_available():
        gpu_figures(repeat)
    if cases:
        print()
        head = f"{'case':<34} {'compare':>9} {'assert_close':>12} {'bare read':>9} {'/close':>7} {'/bare':>7}"
        print(head)
        print("-" * len(head) + "   (ms; synthetic pairs)")
        for shape, dtype, device in cases:
            r = synthetic(shape, dtype, device, repeat)
            print(
                f"{r['case']:<34} {ms(r['compare'])} {ms(r['assert_close']):>12} {ms(r['bare'])} "
                f"{r['compare'] / r['assert_close']:>7.3f} {r['compare'] / r['bare']:>7.2f}"
            )


if __name__ == "__main__":
    main()
