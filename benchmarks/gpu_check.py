"""The checks of issue 27 that only a GPU can make, in one run, each part writing its figures under $OUT.

    python benchmarks/gpu_check.py --part exports|tf32|blame|switches|kernels|analyses     (gpu_check.sh runs them all)

- exports: every module of tests/real_models.py, both exporters, float32 and float16: the torch evaluator on
  CUDA against onnxruntime CUDA with use_tf32=0 and with its default (use_tf32=1), and onnxruntime CPU, each
  as max |diff| over the output's scale (the output's RMS); the CPU pair (evaluator CPU vs onnxruntime CPU)
  is the yardstick the CUDA pairs are held to. -> $OUT/exports.tsv
- tf32: the demo graph (seeds/000, a=32) checked on CUDA float32 by the Checker with onnxruntime's defaults
  (expect a failure whose report names TF32 with the fix) and with use_tf32=0 (expect a pass); the
  evaluator's torch switches seen inside a run. -> $OUT/tf32.txt
- switches: what each switch really changes, per op: MatMul, Gemm, Conv (and ConvTranspose) in float32 on
  onnxruntime CUDA with use_tf32=1 and 0, against the float64 result, in ULPs at the output's scale; run it
  again with NVIDIA_TF32_OVERRIDE=0 in the environment (process-wide) to see what that changes.
  -> $OUT/switches[-override].tsv
- kernels: ONNX's node test suite through the torch evaluator on CUDA, and the contrib cases against onnxruntime
  CUDA: every case whose status on CUDA is not the CPU's, with why. -> $OUT/kernels.txt
- analyses: parity, align, the precision audit and keep_float32, the torch.compile backend and check_reproducible,
  each once on CUDA, an error written with its traceback. -> $OUT/analyses.txt
- blame: blame on a real export (the Llama decoder layer written with the opset-23 fused ops, and the
  ConvNeXt block) on CUDA float32 and float16, default options: its table (rows for MatMul/Gemm/Conv
  should say TF32). -> $OUT/blame.txt
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
OUT = Path(os.environ.get("OUT", ROOT / "gpu-out"))


def scale_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over a's RMS (its finite values), in float64; inf where the shapes or NaNs differ."""
    if a.shape != b.shape:
        return float("inf")
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    finite = a64.isfinite()
    rms = float(a64[finite].pow(2).mean().sqrt()) if finite.any() else 1.0
    both = finite & b64.isfinite()
    if not torch.equal(finite, b64.isfinite()):
        return float("inf")
    return float((a64[both] - b64[both]).abs().max()) / (rms or 1.0) if both.any() else 0.0


def part_exports() -> None:
    import real_models

    from pytest_ortdiff import OrtRunner, TorchEvaluator

    lines = ["model\texporter\tdtype\tev_cpu~ort_cpu\tev_cuda~ort_cpu\tev_cuda~ort_cuda_tf32_0\tev_cuda~ort_cuda_default\tev_cuda~ev_cpu"]
    for name, spec in real_models.MODELS.items():
        for exporter in spec.exporters:
            for dtype in (torch.float32, torch.float16):
                label = f"{name}\t{exporter}\t{str(dtype).replace('torch.', '')}"
                try:
                    model = real_models.export(name, exporter, dtype)
                    names = [i.name for i in model.graph.input]
                    feeds = dict(zip(names, spec.inputs(dtype), strict=False))
                    (ev_cpu,) = TorchEvaluator(model).run(None, feeds)[:1]
                    (ev_cuda,) = TorchEvaluator(model, device="cuda").run(None, feeds)[:1]
                    (ort_cpu,) = OrtRunner(model).run(None, feeds)[:1]
                    (ort_ieee,) = OrtRunner(model, provider="CUDA", provider_options={"use_tf32": 0}).run(None, feeds)[:1]
                    (ort_default,) = OrtRunner(model, provider="CUDA").run(None, feeds)[:1]
                    gaps = [scale_gap(ev_cpu, ort_cpu), scale_gap(ev_cuda, ort_cpu), scale_gap(ev_cuda, ort_ieee), scale_gap(ev_cuda, ort_default), scale_gap(ev_cuda, ev_cpu)]
                    lines.append(label + "".join(f"\t{x:.3g}" for x in gaps))
                except Exception as exc:
                    lines.append(f"{label}\tERROR {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
                print(lines[-1], flush=True)
    (OUT / "exports.tsv").write_text("\n".join(lines) + "\n")


def part_tf32() -> None:
    from pytest_ortdiff import Checker, TorchEvaluator, models
    from pytest_ortdiff.engine.check import ToleranceBroken
    from pytest_ortdiff.runtimes.tf32 import precision_settings

    out: list[str] = [f"torch settings before: {precision_settings('cuda')}"]
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 32, "b": 1024, "c": 1152}, seed=0, device="cuda")
    seen: list[dict[str, object]] = []

    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(precision_settings("cuda"))
        return a @ b

    TorchEvaluator(model, device="cuda", kernels={("", "MatMul"): matmul}).run(None, feeds)
    out.append(f"torch settings inside a run: {seen[0]}")
    out.append(f"torch settings after: {precision_settings('cuda')}")
    budget = {"max_ulp": 64, "budget": {1e-3: 0.0}}
    for options in ({}, {"use_tf32": 0}):
        checker = Checker("CUDA", "float32", tolerance=budget, provider_options=options)
        try:
            result = checker.check(model, feeds)
            out.append(f"\n== provider_options={options}: passed; {result.report.summary()}")
        except ToleranceBroken as exc:
            out.append(f"\n== provider_options={options}: FAILED\n{exc}")
    (OUT / "tf32.txt").write_text("\n".join(out) + "\n")
    print("\n".join(out))


def part_switches() -> None:
    """Per op, onnxruntime CUDA float32 with use_tf32 1 and 0 against float64, in ULPs of float32 at the
    output's scale (IEEE float32 accumulation: a few ULPs; TF32: ~2**13 ULPs per rounded input)."""
    import onnx
    import onnx.helper as oh

    from pytest_ortdiff import OrtRunner

    tp = onnx.TensorProto
    gen = torch.Generator().manual_seed(0)
    cases = {
        "MatMul": ([oh.make_node("MatMul", ["a", "b"], ["y"])], {"a": (64, 512), "b": (512, 256)}),
        "Gemm": ([oh.make_node("Gemm", ["a", "b"], ["y"])], {"a": (64, 512), "b": (512, 256)}),
        "Conv": ([oh.make_node("Conv", ["a", "b"], ["y"], pads=[1, 1, 1, 1])], {"a": (1, 64, 32, 32), "b": (64, 64, 3, 3)}),
        "ConvTranspose": ([oh.make_node("ConvTranspose", ["a", "b"], ["y"])], {"a": (1, 64, 16, 16), "b": (64, 32, 3, 3)}),
    }
    override = os.environ.get("NVIDIA_TF32_OVERRIDE")
    lines = [f"op\tuse_tf32\tulps_at_scale (NVIDIA_TF32_OVERRIDE={override})"]
    for op, (nodes, shapes) in cases.items():
        inputs = [oh.make_tensor_value_info(k, tp.FLOAT, list(v)) for k, v in shapes.items()]
        model = oh.make_model(oh.make_graph(nodes, op, inputs, [oh.make_tensor_value_info("y", tp.FLOAT, None)]), opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
        feeds = {k: torch.randn(v, generator=gen) for k, v in shapes.items()}
        wide = {k: v.double() for k, v in feeds.items()}
        if op in ("MatMul", "Gemm"):
            exact = wide["a"] @ wide["b"]
        elif op == "Conv":
            exact = torch.nn.functional.conv2d(wide["a"], wide["b"], padding=1)
        else:
            exact = torch.nn.functional.conv_transpose2d(wide["a"], wide["b"])
        rms = float(exact.pow(2).mean().sqrt())
        ulp = 2.0 ** (torch.tensor(rms).log2().floor().item() - 23)
        for flag in (1, 0):
            (y,) = OrtRunner(model, provider="CUDA", provider_options={"use_tf32": flag}, cache=False).run(None, feeds)
            err = float((y.double().cpu() - exact).abs().max()) / ulp
            lines.append(f"{op}\t{flag}\t{err:.1f}")
            print(lines[-1], flush=True)
    name = "switches-override.tsv" if override == "0" else "switches.tsv"
    (OUT / name).write_text("\n".join(lines) + "\n")


def part_blame() -> None:
    import real_models

    from pytest_ortdiff import blame, models

    out: list[str] = []
    cases = []
    for dtype in ("float32", "float16"):
        m = models.llama_decoder_layer(dtype=dtype, fused=True, opset=23)
        cases.append((f"llama_decoder_layer fused_opset23 {dtype}", m, models.random_feeds(m, dims={"batch": 2, "seq": 16, "past": 8}, seed=0, device="cuda")))
    spec = real_models.MODELS["convnext"]
    m = real_models.export("convnext", "dynamo", torch.float32)
    cases.append(("convnext dynamo float32", m, dict(zip([i.name for i in m.graph.input], spec.inputs(torch.float32), strict=False))))
    for label, model, feeds in cases:
        t0 = time.perf_counter()
        try:
            table = blame(model, feeds, provider="CUDA")
            out.append(f"== {label}: {time.perf_counter() - t0:.1f} s\n{table.render()}")
        except Exception:
            out.append(f"== {label}: ERROR\n{traceback.format_exc()}")
        print(out[-1], flush=True)
    (OUT / "blame.txt").write_text("\n\n".join(out) + "\n")


def _to_cpu(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def part_kernels() -> None:
    """Every case of ONNX's node test suite through the torch evaluator on CUDA (its outputs brought back to the
    host for the suite's comparison), against the same cases on CPU; then every contrib case against onnxruntime's
    CUDA provider (use_tf32=0), against its status on CPU. What the device watch cannot see on CPU shows here: a
    torch op without a CUDA kernel for a dtype, a tensor a kernel made on the CPU at build time, a host-only API.
    Lists every case whose status on CUDA is not its status on CPU, with why. -> $OUT/kernels.txt"""
    from pytest_ortdiff import conformance
    from pytest_ortdiff.conformance import contrib_cases
    from pytest_ortdiff.runtimes import evaluator
    from pytest_ortdiff.runtimes.providers import provider_options_in_force

    lines: list[str] = []

    def flush(line: str = "") -> None:
        lines.append(line)
        print(line, flush=True)
        (OUT / "kernels.txt").write_text("\n".join(lines) + "\n")

    plain = evaluator.TorchEvaluator

    class OnCuda(plain):  # type: ignore[misc,valid-type]
        def __init__(self, model: object, **kwargs: object) -> None:
            kwargs.setdefault("device", "cuda")
            super().__init__(model, **kwargs)

        def run(self, *args: object, **kwargs: object) -> object:
            return _to_cpu(super().run(*args, **kwargs))

    cases = conformance.load_cases()
    t0 = time.perf_counter()
    on_cpu = {r.name: r for r in conformance.run_cases(cases)}
    t1 = time.perf_counter()
    evaluator.TorchEvaluator = OnCuda  # (run_case looks it up at each call)
    try:
        on_cuda = {r.name: r for r in conformance.run_cases(cases)}
    finally:
        evaluator.TorchEvaluator = plain
    t2 = time.perf_counter()
    differ = [n for n in on_cpu if on_cuda[n].status != on_cpu[n].status]
    flush(f"ONNX node suite: {len(on_cpu)} cases; CPU {t1 - t0:.1f} s, CUDA {t2 - t1:.1f} s; {len(differ)} with another status on CUDA")
    for status in conformance.STATUSES:
        flush(f"  {status:<12} CPU {sum(r.status == status for r in on_cpu.values()):5d}   CUDA {sum(r.status == status for r in on_cuda.values()):5d}")
    for n in differ:
        flush(f"{n} [{on_cuda[n].op}]: CPU {on_cpu[n].status}, CUDA {on_cuda[n].status}: {on_cuda[n].detail[:400]}")

    flush()
    t0 = time.perf_counter()
    contrib = contrib_cases.all_cases()
    with provider_options_in_force({"CUDA": {"use_tf32": "0"}}):
        pairs = [(contrib_cases.run_case(c, "CPU"), contrib_cases.run_case(c, "CUDA")) for c in contrib]
    flush(f"contrib cases: {len(pairs)}, {time.perf_counter() - t0:.1f} s; ours on CUDA against onnxruntime CUDA (use_tf32=0)")
    for status in contrib_cases.STATUSES:
        flush(f"  {status:<15} CPU {sum(a.status == status for a, _ in pairs):5d}   CUDA {sum(b.status == status for _, b in pairs):5d}")
    absent = sorted({b.op for a, b in pairs if b.status == "no onnxruntime" != a.status})
    if absent:  # (onnxruntime's CUDA provider lacks many CPU-only contrib kernels: nothing to compare with there)
        flush(f"no onnxruntime CUDA kernel to compare with (CPU had one): {', '.join(absent)}")
    for a, b in pairs:
        if b.status != a.status and b.status != "no onnxruntime":
            flush(f"{b.name} [{b.op}, {b.dtype}]: CPU {a.status}, CUDA {b.status}: {b.detail[:400]}")


def part_analyses() -> None:
    """The analyses built on the Checker, each once on CUDA on a small model, each guarded (an error is written
    with its traceback and the next one runs): parity (module vs its export), align, the precision audit and
    keep_float32, the torch.compile backend, check_reproducible. -> $OUT/analyses.txt"""
    import onnx

    from pytest_ortdiff import models
    from pytest_ortdiff.analyses import align, dynamo, parity, precision
    from pytest_ortdiff.engine.reproducible import check_reproducible
    from pytest_ortdiff.runtimes.providers import provider_options_in_force

    out: list[str] = []
    model32 = models.layer_norm_matmul_add(dtype="float32")
    feeds32 = models.random_feeds(model32, dims={"a": 2, "b": 16, "c": 32}, seed=0, device="cuda")

    def mlp() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    optimized = onnx.ModelProto()
    optimized.CopyFrom(model32)

    def run(label: str, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        try:
            result = fn()
            text = result.render() if hasattr(result, "render") else str(result)
            out.append(f"== {label}: ok, {time.perf_counter() - t0:.1f} s\n{text}")
        except Exception:
            out.append(f"== {label}: ERROR after {time.perf_counter() - t0:.1f} s\n{traceback.format_exc()}")
        print(out[-1], flush=True)
        (OUT / "analyses.txt").write_text("\n\n".join(out) + "\n")

    with provider_options_in_force({"CUDA": {"use_tf32": "0"}}):
        run("parity.check_export (dynamo, float16, CUDA)", lambda: parity.check_export(mlp(), (x,), exporter="dynamo", provider="CUDA", dtype="float16"))
        run("parity.check_export (torchscript, float32, CUDA)", lambda: parity.check_export(mlp(), (x,), exporter="torchscript", provider="CUDA"))
        run("align.compare_executions (level all vs none, CUDA)", lambda: align.compare_executions(
            model32, optimized, feeds32, provider="CUDA", session_options_b={"graph_optimization_level": "all"}))
        run("align.compare_executions (runtime torch, CUDA)", lambda: align.compare_executions(model32, optimized, feeds32, provider="CUDA", runtime="torch"))
        run("precision.audit (float16, cuda)", lambda: precision.audit(model32, feeds32, dtype="float16", device="cuda"))
        run("precision.keep_float32 (float16, CUDA)", lambda: precision.keep_float32(model32, feeds32, dtype="float16", provider="CUDA", max_runs=8))
        run("dynamo.check_compile (CUDA)", lambda: dynamo.check_compile(mlp(), (x,), provider="CUDA"))
        run("check_reproducible (CUDA, torch deterministic too)", lambda: check_reproducible(model32, feeds32, provider="CUDA", runs=3))


PARTS = {
    "exports": part_exports, "tf32": part_tf32, "switches": part_switches, "blame": part_blame,
    "kernels": part_kernels, "analyses": part_analyses,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=tuple(PARTS), action="append", required=True)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # (a warning per Memcpy node otherwise)
    for part in args.part:
        PARTS[part]()


if __name__ == "__main__":
    main()
