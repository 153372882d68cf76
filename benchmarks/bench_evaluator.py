"""How much does TorchEvaluator cost over the kernels it runs, next to onnxruntime, onnx.reference
and the same torch ops called by hand?

1. Per-node overhead: a chain of 300 tiny nodes (float32 [4, 16]; Add with the graph input X and Mul
   by a constant initializer, alternating), run by

   - `TorchEvaluator(model).run(None, feeds)`       this project
   - onnxruntime `InferenceSession.run` (CPU)         graph optimizations disabled (all 300 nodes run)
                                                      and at their default level
   - `onnx.reference.ReferenceEvaluator.run`          the ONNX reference, numpy kernels
   - eager torch                                      a Python loop over the same 300 torch.add/torch.mul

   in µs per node (the whole run / 300) and per extra node ((t(300) - t(1)) / 299: what a node adds,
   without the run's fixed cost), and the ratio ours / eager torch.

2. The seed-000 graph (LayerNormalization -> MatMul -> Add, float32 [2, 1024, 1152]), where the time
   is in the kernels: TorchEvaluator next to `OrtRunner`, a raw `InferenceSession` (numpy feeds) and
   the eager torch twin `LayerNormMatMulAdd`, and the ratios ours / each (on medians, and on the
   fastest runs, which other processes disturbed least); then node by node, our kernel next to the
   bare torch call it makes and onnxruntime running that node alone.

3. Real-architecture graphs: the BERT-, GPT-2- and Llama-like modules of `real_graphs.py`, each exported
   by both torch exporters (dynamo and TorchScript, dynamic batch and sequence; 100-1,000 nodes, much of
   it shape arithmetic), run by TorchEvaluator and by onnxruntime with graph optimizations disabled
   (every node runs, as ours do), interleaved; ours / onnxruntime per graph and their median.

Every onnxruntime session runs on the CPU provider with its default options but one: its pool threads
do not spin after a run (`session.intra_op.allow_spinning=0`), since spinning threads slow down the torch
run that follows them (by up to half on 2 cores), and runners take turns. Torch's thread count is left
at its default and printed.

Targets (from the issue): at most 2 µs per node for TorchEvaluator on the chain (eager torch itself
costs about 1 µs per op), at most 1.2x onnxruntime's time on the seed-000 graph, and a median of at most
2x onnxruntime (no graph optimizations) over the real-architecture graphs.

4. With a CUDA device (and onnxruntime's CUDA provider): the same exports, ours on CUDA
   against onnxruntime CUDA with use_tf32=0, and how far apart their outputs are.

    python benchmarks/bench_evaluator.py [--quick] [--repeat N] [--only chain|seed|real|gpu ...] [--threads N] [--clock wall|cpu]

Ratios, not seconds, are what to compare between machines; no test asserts on them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime
import torch
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff import OrtRunner, TorchEvaluator, models

CHAIN = 300
CHAIN_SHAPE = (4, 16)
SEED_DIMS = {"a": 2, "b": 1024, "c": 1152}


def chain_model(n: int) -> onnx.ModelProto:
    """Y = (((X + X) * half) + X) * half ...: n nodes, Add(prev, X) and Mul(prev, half) alternating,
    so values stay bounded however long the chain."""
    nodes = []
    prev = "X"
    for i in range(n):
        out = "Y" if i == n - 1 else f"t{i}"
        if i % 2 == 0:
            nodes.append(oh.make_node("Add", [prev, "X"], [out], name=f"add{i}"))
        else:
            nodes.append(oh.make_node("Mul", [prev, "half"], [out], name=f"mul{i}"))
        prev = out
    # a chain of one node has no Mul: no initializer then (onnxruntime warns about an unused one)
    half = [onnx.numpy_helper.from_array(np.full(CHAIN_SHAPE, 0.5, dtype=np.float32), "half")] if n > 1 else []
    f32 = onnx.TensorProto.FLOAT
    return oh.make_model(
        oh.make_graph(
            nodes,
            f"chain{n}",
            [oh.make_tensor_value_info("X", f32, list(CHAIN_SHAPE))],
            [oh.make_tensor_value_info("Y", f32, list(CHAIN_SHAPE))],
            half,
        ),
        ir_version=9,
        opset_imports=[oh.make_opsetid("", 18)],
    )


def sample(runners: dict[str, Callable[[], object]], repeat: int, number: dict[str, int] | None = None) -> dict[str, list[float]]:
    """`repeat` timings of one call of each runner, each averaging `number[name]` calls (default 1),
    after a warm-up. Runners take turns within each sample, so a noisy neighbour or a clock change
    hits them all alike, in a shuffled order, so none always pays for what the same other one leaves
    behind (caches, threads winding down)."""
    number = number or {}
    for fn in runners.values():  # warm-up: allocations, onnxruntime's first-run setup, caches
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners.items())
    shuffle = random.Random(0).shuffle
    for _ in range(repeat):
        shuffle(order)
        for name, fn in order:
            n = number.get(name, 1)
            t0 = CLOCK()
            for _ in range(n):
                fn()
            times[name].append((CLOCK() - t0) / n)
    return times


def timed(runners: dict[str, Callable[[], object]], repeat: int, number: dict[str, int] | None = None) -> dict[str, float]:
    """The median of `sample`'s timings of each runner."""
    return {name: statistics.median(ts) for name, ts in sample(runners, repeat, number).items()}


THREADS: int | None = None  # --threads: torch's and onnxruntime's intra-op threads alike (None: defaults)
# --clock cpu: the process's CPU time instead of the wall clock. On a shared machine a run's wall time also
# counts the time other processes (and the hypervisor) took the core from it; its CPU time is the work it
# did. With --threads 1 both runtimes work in the calling thread, so CPU time compares them fairly (with
# more threads it also counts pool threads spinning while they wait).
CLOCK: Callable[[], float] = time.perf_counter


def ort_options(optimize: bool = True) -> onnxruntime.SessionOptions:
    """onnxruntime's defaults but for spinning: its idle pool threads otherwise spin on after a run and,
    on a machine with few cores, slow the torch run that follows by up to half (measured on 2 cores)."""
    so = onnxruntime.SessionOptions()
    if THREADS is not None:
        so.intra_op_num_threads = THREADS
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not optimize:
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def ort_session(model: onnx.ModelProto, optimize: bool = True) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(model.SerializeToString(), sess_options=ort_options(optimize), providers=["CPUExecutionProvider"])


def node_session(node: onnx.NodeProto, inputs: list[torch.Tensor], opsets: dict[str, int]) -> onnxruntime.InferenceSession:
    """onnxruntime running `node` alone, on inputs of these shapes and dtypes."""
    graph = oh.make_graph(
        [node],
        node.op_type,
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.numpy().dtype), list(v.shape)) for n, v in zip(node.input, inputs, strict=True)],
        [oh.make_empty_tensor_value_info(o) for o in node.output],
    )
    return ort_session(oh.make_model(graph, ir_version=9, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets.items()]))


def chain_runners(n: int) -> dict[str, Callable[[], object]]:
    model = chain_model(n)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(CHAIN_SHAPE, dtype=np.float32))
    x_np = x.numpy()
    half = torch.full(CHAIN_SHAPE, 0.5)
    ours = TorchEvaluator(model)
    ort_plain, ort_opt = ort_session(model, optimize=False), ort_session(model, optimize=True)
    ref = ReferenceEvaluator(model)
    ops = [(torch.add, x) if i % 2 == 0 else (torch.mul, half) for i in range(n)]

    def eager() -> torch.Tensor:
        y = x
        for op, other in ops:
            y = op(y, other)
        return y

    runners: dict[str, Callable[[], object]] = {
        "TorchEvaluator": lambda: ours.run(None, {"X": x}),
        "ort, no graph opt": lambda: ort_plain.run(None, {"X": x_np}),
        "ort, default opt": lambda: ort_opt.run(None, {"X": x_np}),
        "onnx.reference": lambda: ref.run(None, {"X": x_np}),
        "eager torch": eager,
    }
    # same numbers from all of them, or the timings compare different work
    want = eager().numpy()
    for name, fn in runners.items():
        out = fn()
        got = out.numpy() if isinstance(out, torch.Tensor) else np.asarray(out[0])
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), name
    return runners


def bench_chain(repeat: int) -> None:
    long, short = chain_runners(CHAIN), chain_runners(1)
    print(f"\n1. chain of {CHAIN} Add/Mul nodes, float32{list(CHAIN_SHAPE)}: medians of {repeat} samples")
    head = f"{'runtime':<20} {'µs/run':>9} {'µs/node':>8} {'µs/extra node':>13} {'/eager':>7}"
    print(head)
    print("-" * len(head) + "   (µs/node = run / 300; extra node = (t(300) - t(1)) / 299; /eager: µs/node ratio)")
    # onnx.reference takes ms per run of the long chain: fewer calls per sample
    long_t = timed(long, repeat, {name: 2 if name == "onnx.reference" else 20 for name in long})
    short_t = timed(short, repeat, dict.fromkeys(short, 200))
    eager_per_node = long_t["eager torch"] / CHAIN
    for name, t in long_t.items():
        per_node = t / CHAIN
        extra = (t - short_t[name]) / (CHAIN - 1)
        print(f"{name:<20} {t * 1e6:9.0f} {per_node * 1e6:8.2f} {extra * 1e6:13.2f} {per_node / eager_per_node:7.2f}")
    ours = long_t["TorchEvaluator"] / CHAIN * 1e6
    print(f"TorchEvaluator: {ours:.2f} µs per node (target <= 2): {'met' if ours <= 2 else 'MISSED'}; "
          f"{ours - eager_per_node * 1e6:.2f} µs per node over eager torch; fixed cost of a run {short_t['TorchEvaluator'] * 1e6:.1f} µs")


def bench_seed(repeat: int) -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims=SEED_DIMS, seed=0)
    np_feeds = {k: v.numpy() for k, v in feeds.items()}
    ours = TorchEvaluator(model)
    runner = OrtRunner(model, session_options=ort_options())
    sess = ort_session(model)
    twin = models.LayerNormMatMulAdd()
    args = [feeds[k] for k in ("X", "scale", "bias", "weights", "bias2")]
    runners: dict[str, Callable[[], object]] = {
        "TorchEvaluator": lambda: ours.run(None, feeds),
        "OrtRunner": lambda: runner.run(None, feeds),
        "InferenceSession": lambda: sess.run(None, np_feeds),
        "eager torch twin": lambda: twin(*args),
    }
    shape = [SEED_DIMS[d] for d in "abc"]
    print(f"\n2. seed-000 graph (LayerNormalization -> MatMul -> Add), float32{shape}: {repeat} runs after warm-up")
    runs = sample(runners, repeat)
    med = {name: statistics.median(ts) for name, ts in runs.items()}
    low = {name: min(ts) for name, ts in runs.items()}
    (z_ours,) = ours.run(None, feeds)
    (z_ort,) = sess.run(None, np_feeds)
    head = f"{'runtime':<18} {'median ms':>10} {'min ms':>8} {'ours / (median)':>16} {'ours / (min)':>13}"
    print(head)
    print("-" * len(head) + "   (min: the run least disturbed by other processes)")
    for name in runs:
        print(f"{name:<18} {med[name] * 1e3:10.2f} {low[name] * 1e3:8.2f} {med['TorchEvaluator'] / med[name]:16.2f} {low['TorchEvaluator'] / low[name]:13.2f}")
    for peer in ("InferenceSession", "OrtRunner"):
        ratio = med["TorchEvaluator"] / med[peer]
        print(f"TorchEvaluator / {peer}: {ratio:.2f}x on medians (target <= 1.2): {'met' if ratio <= 1.2 else 'MISSED'}")
    print(f"max |ours - ort| = {np.abs(z_ours.numpy() - z_ort).max():.3g}")

    # Where the time goes, node by node: our kernel, the bare torch call it wraps, and onnxruntime
    # running that node alone (a one-node session), on the same inputs.
    values = ours.run(None, feeds, intermediates=True)
    bare = {
        "LayerNormalization": lambda x, s, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), s, b, 1e-5),
        "MatMul": torch.matmul,
        "Add": torch.add,
    }
    print(f"\nper node, medians of {2 * repeat + 3} (ms)")
    head = f"{'node':<20} {'inputs':<32} {'kernel':>7} {'bare':>7} {'ort':>7} {'kernel/bare':>11} {'kernel/ort':>10}"
    print(head)
    print("-" * len(head) + "   (bare: the torch call the kernel makes; ort: onnxruntime running this node alone)")
    for node, k in zip(ours.nodes, ours._kernels, strict=True):
        ins = [values[x] for x in node.input]
        one = node_session(node, ins, ours.opsets)
        np_ins = {n: v.numpy() for n, v in zip(node.input, ins, strict=True)}
        t = timed(
            {"kernel": lambda k=k, ins=ins: k.run(*ins), "bare": lambda ins=ins, f=bare[node.op_type]: f(*ins), "ort": lambda one=one, np_ins=np_ins: one.run(None, np_ins)},
            2 * repeat + 3,
        )
        shapes = " ".join(str(list(v.shape)).replace(" ", "") for v in ins)
        print(f"{node.op_type:<20} {shapes:<32} {t['kernel'] * 1e3:7.2f} {t['bare'] * 1e3:7.2f} {t['ort'] * 1e3:7.2f} {t['kernel'] / t['bare']:11.2f} {t['kernel'] / t['ort']:10.2f}")


REAL_SHAPE = (2, 32)  # (batch, sequence) fed to the real graphs; they were traced at real_graphs.EXPORT_SHAPE


def bench_real(repeat: int) -> None:
    """Ours / onnxruntime (no graph optimizations: every node runs, as ours do) on the BERT-, GPT-2- and
    Llama-like exports of real_graphs.py, both exporters, fed at REAL_SHAPE."""
    import real_graphs  # next to this file (python puts the script's folder on sys.path)

    print(f"\n3. real-architecture graphs (real_graphs.py; batch, sequence = {REAL_SHAPE}): medians of {repeat} interleaved samples")
    head = f"{'graph':<18} {'nodes':>6} {'ours ms':>9} {'ort ms':>9} {'ours/ort':>9} {'min ratio':>10}"
    print(head)
    print("-" * len(head) + "   (ort: graph optimizations disabled; min ratio: fastest runs, least disturbed)")
    ratios = []
    for name in real_graphs.GRAPHS:
        for exporter in ("dynamo", "torchscript"):
            model = real_graphs.export(name, exporter)
            feeds = real_graphs.feeds(name, *REAL_SHAPE)
            np_feeds = {k: v.numpy() for k, v in feeds.items()}
            ours = TorchEvaluator(model)
            sess = ort_session(model, optimize=False)
            (z_ours,) = ours.run(None, feeds)
            (z_ort,) = sess.run(None, np_feeds)
            assert np.allclose(z_ours.numpy(), z_ort, rtol=1e-3, atol=1e-4), f"{name}/{exporter}: ours and onnxruntime disagree"
            t0 = time.perf_counter()
            ours.run(None, feeds)
            number = max(1, int(0.02 / (time.perf_counter() - t0)))  # samples of about 20 ms
            pair: dict[str, Callable[[], object]] = {"ours": partial(ours.run, None, feeds), "ort": partial(sess.run, None, np_feeds)}
            runs = sample(pair, repeat, dict.fromkeys(pair, number))
            med = {k: statistics.median(v) for k, v in runs.items()}
            ratio = med["ours"] / med["ort"]
            ratios.append(ratio)
            low = min(runs["ours"]) / min(runs["ort"])
            label = f"{name}/{exporter}"
            print(f"{label:<18} {len(model.graph.node):6d} {med['ours'] * 1e3:9.3f} {med['ort'] * 1e3:9.3f} {ratio:9.2f} {low:10.2f}", flush=True)
    median = statistics.median(ratios)
    print(f"median ours / onnxruntime(no optimizations): {median:.2f}x (target <= 2): {'met' if median <= 2 else 'MISSED'}")


def bench_gpu(repeat: int) -> None:
    """With a CUDA device and onnxruntime's CUDA provider: ours on CUDA (IEEE float32) / onnxruntime CUDA
    (use_tf32=0, as the tests compare them; graph optimizations at their default) on the real-architecture
    exports, each timed with a device synchronisation, and how far apart the outputs are (max |diff| over
    the output's scale: IEEE float32 on both sides should agree as the CPU ones do, ~1e-6)."""
    import real_graphs
    from bench_diff import (
        timed as synced,  # (the median of timed runs, each ended by a device synchronisation)
    )

    from pytest_ortdiff.runtimes.providers import unavailable_reason

    reason = unavailable_reason("CUDA")
    if reason:
        print(f"\n4. GPU: skipped ({reason})")
        return
    sync = torch.cuda.synchronize
    print(f"\n4. real-architecture graphs on {torch.cuda.get_device_name()}: ours (cuda) / onnxruntime CUDA (use_tf32=0), medians of {repeat}")
    head = f"{'graph':<24} {'nodes':>6} {'ours ms':>9} {'ort ms':>9} {'ours/ort':>9} {'|diff|/scale':>13}"
    print(head)
    print("-" * len(head))
    ratios = []
    for name in real_graphs.GRAPHS:
        for exporter in ("dynamo", "torchscript"):
            for dtype in ("float32",):  # (real_graphs exports float32; tests/real_models.py has float16 twins)
                model = real_graphs.export(name, exporter)
                feeds = {k: v.cuda() for k, v in real_graphs.feeds(name, *REAL_SHAPE).items()}
                ours = TorchEvaluator(model, device="cuda")
                runner = OrtRunner(model, provider="CUDA", provider_options={"use_tf32": 0})
                try:
                    (z_ours,) = ours.run(None, feeds)
                    (z_ort,) = runner.run(None, feeds)
                except Exception as exc:
                    print(f"{name}/{exporter}/{dtype}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
                    continue
                scale = float(z_ours.double().pow(2).mean().sqrt()) or 1.0
                gap = float((z_ours.double() - z_ort.double()).abs().max()) / scale

                t_ours = synced(partial(ours.run, None, feeds), repeat, sync)
                t_ort = synced(partial(runner.run, None, feeds), repeat, sync)
                ratios.append(t_ours / t_ort)
                label = f"{name}/{exporter}/{dtype}"
                print(f"{label:<24} {len(model.graph.node):6d} {t_ours * 1e3:9.3f} {t_ort * 1e3:9.3f} {t_ours / t_ort:9.2f} {gap:13.2e}", flush=True)
    if ratios:
        print(f"median ours (cuda) / onnxruntime CUDA: {statistics.median(ratios):.2f}x")


def load() -> str:
    """The load average, since other processes on the machine skew every timing here."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats instead of 9 (chain: 7 instead of 21)")
    ap.add_argument("--repeat", type=int, default=None, help="repeats of the seed-000 graph (the chain takes 2N+3)")
    ap.add_argument("--only", choices=("chain", "seed", "real", "gpu"), action="append", help="run only these parts (repeatable); gpu: with a CUDA device, by default")
    ap.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall",
        help="what a timing measures: wall time (default) or the process's CPU time, which other processes' load does not inflate (use with --threads 1)",
    )
    ap.add_argument(
        "--threads", type=int, default=None,
        help="intra-op threads of torch and onnxruntime alike; 1 keeps a loaded machine's descheduled pool threads (ms-long stalls of tiny ops) out of both",
    )
    args = ap.parse_args()
    global THREADS, CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.threads is not None:
        THREADS = args.threads
        torch.set_num_threads(args.threads)
    repeat = args.repeat or (3 if args.quick else 9)
    print(
        f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, numpy {np.__version__}; "
        f"torch threads {torch.get_num_threads()} (interop {torch.get_num_interop_threads()}), "
        f"onnxruntime intra-op threads {THREADS or 'default'} (no spinning), cpu count {torch.multiprocessing.cpu_count()}; "
        f"timings in {'CPU time of the process' if args.clock == 'cpu' else 'wall time'}"
    )
    print(f"load average (1, 5, 15 min) at start: {load()}")
    parts = args.only or ["chain", "seed", "real"]
    if "chain" in parts:
        bench_chain(2 * repeat + 3)
    if "seed" in parts:
        bench_seed(repeat)
    if "real" in parts:
        bench_real(2 * repeat + 3)
    if ("gpu" in parts or not args.only) and torch.cuda.is_available():
        bench_gpu(2 * repeat + 3)
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    main()
