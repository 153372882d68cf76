"""The checks of issue 27 that only a GPU can make, in one run, each part writing its figures under $OUT.

    python benchmarks/gpu_check.py --part exports|tf32|blame|switches     (gpu_check.sh runs them all)

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


PARTS = {"exports": part_exports, "tf32": part_tf32, "switches": part_switches, "blame": part_blame}


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
