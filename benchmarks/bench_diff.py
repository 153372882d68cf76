"""How fast is `compare()` (the full DiffReport: histogram, max abs/rel/ULP with where, NaN/Inf
rules) next to what people use today, on realistic outputs?

For a (2, 1024, 1152) float32 and a (32, 1024, 1152) float16 pair (and the same on CUDA when torch
sees a GPU) it prints the median of several runs of

- `compare(e, g)`                        this project, the full default histogram
- `numpy.testing.assert_allclose(e, g)`  on the numpy arrays (its AssertionError caught)
- `torch.testing.assert_close(g, e)`     (its AssertionError caught)
- `e.sum(); g.sum()`                     the bare read of both tensors: a floor no diff can beat

and the ratios compare / assert_close, compare / assert_allclose, compare / bare read.

`g` is `e` as a second runtime would produce it: most elements 0-3 ULP away, one in ten thousand
off by about 5 % of the values' scale. Targets (from the issue): compare faster than
torch.testing.assert_close on both pairs (ratio < 1), and within 10x of the bare read.

    python benchmarks/bench_diff.py [--quick] [--repeat N]

Ratios, not seconds, are what to compare between machines; no test asserts on them. The first line
says whether CPU compares ran the fused C pass; `PYTEST_ORTDIFF_NO_EXTENSION=1 python
benchmarks/bench_diff.py` measures the numpy path instead.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from pytest_ortdiff import compare
from pytest_ortdiff.diff import fused_pass_available

SHAPES = [((2, 1024, 1152), torch.float32), ((32, 1024, 1152), torch.float16)]


def make_pair(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """expected ~ N(0, 3) in `dtype`; got = expected with relative noise of ~1 ULP (most elements 0-3
    ULP off after rounding) plus a few (1e-4) elements off by ~0.15."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3
    eps = torch.finfo(dtype).eps
    noisy = x * (1 + torch.randn(shape, generator=gen) * eps)
    far = torch.rand(shape, generator=gen) < 1e-4
    noisy = torch.where(far, x + torch.randn(shape, generator=gen) * 0.15, noisy)
    return x.to(dtype).to(device), noisy.to(dtype).to(device)


def timed(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up (allocations, CUDA kernels)
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


def bench(shape: tuple[int, ...], dtype: torch.dtype, device: str, repeat: int) -> dict[str, object]:
    e, g = make_pair(shape, dtype, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    row: dict[str, object] = {"case": f"{device} {str(dtype).replace('torch.', '')}{list(shape)}", "n": e.numel()}
    row["compare"] = timed(lambda: compare(e, g), repeat, sync)
    row["assert_close"] = timed(expect_failure(lambda: torch.testing.assert_close(g, e)), repeat, sync)
    if device == "cpu":
        e_np, g_np = e.numpy(), g.numpy()
        row["assert_allclose"] = timed(expect_failure(lambda: np.testing.assert_allclose(g_np, e_np)), max(1, repeat // 2), sync)
    else:
        row["assert_allclose"] = None  # numpy needs host copies: not a like-for-like peer on a GPU
    row["bare"] = timed(lambda: (e.sum(), g.sum()), repeat, sync)
    r = compare(e, g)
    row["report"] = f"max abs {r.max_abs:.3g}, max ulp {r.max_ulp:g}, >0: {r.counts[0.0] / r.n:.1%}, >1e-2: {r.counts[1e-2]:,}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    ap.add_argument("--repeat", type=int, default=None)
    args = ap.parse_args()
    repeat = args.repeat or (3 if args.quick else 7)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    fused = "on" if fused_pass_available() else "off (extension not built, or PYTEST_ORTDIFF_NO_EXTENSION=1): numpy path"
    print(f"torch {torch.__version__}, numpy {np.__version__}, torch threads {torch.get_num_threads()}, median of {repeat}; fused C pass {fused}")
    rows = [bench(shape, dtype, device, repeat) for device in devices for shape, dtype in SHAPES]

    def ms(x: object) -> str:
        return "-" if x is None else f"{x * 1e3:9.1f}"  # type: ignore[operator]

    def ratio(a: object, b: object) -> str:
        return "-" if a is None or b is None else f"{a / b:8.2f}"  # type: ignore[operator]

    head = f"{'case':<28} {'compare':>9} {'assert_close':>12} {'assert_allclose':>15} {'bare read':>9}   {'/close':>8} {'/allclose':>9} {'/bare':>8}"
    print(head)
    print("-" * len(head) + "   (ms; ratios: compare / peer)")
    for r in rows:
        print(
            f"{r['case']:<28} {ms(r['compare'])} {ms(r['assert_close']):>12} {ms(r['assert_allclose']):>15} {ms(r['bare'])}   "
            f"{ratio(r['compare'], r['assert_close'])} {ratio(r['compare'], r['assert_allclose']):>9} {ratio(r['compare'], r['bare'])}"
        )
    print()
    for r in rows:
        print(f"{r['case']:<28} {r['report']}")


if __name__ == "__main__":
    main()
