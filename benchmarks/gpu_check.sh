#!/usr/bin/env bash
# Issue 27's checks on a GPU machine, in one run of well under 10 minutes, every log and figure under $OUT.
#
# On the project's GPU machine (../shared/gpu/README.md): with .gpu/ort1 sent along, first
#     mkdir -p /tmp/o && mv .gpu/ort1/cuda.so.xz /tmp/o/ && nvidia-smi -L
# then, on the same machine, with .gpu/ort2 sent along:
#     source .gpu/ort2/on_device.sh && bash benchmarks/gpu_check.sh
# Elsewhere: any machine with a CUDA torch and onnxruntime-gpu (never next to onnxruntime) installed.
#
# What it runs (each step bounded by `timeout`, so that a hang costs its step only; exit statuses in steps.txt):
#  1. env: versions, the GPU, onnxruntime's providers and its CUDA provider's default options (use_tf32)
#  2. tests/test_cuda.py (and the TF32, device-watch and diff tests) with CUDA present
#  3. the demo, examples/test_layer_norm_matmul_add.py --ort-providers=CUDA: its IEEE test (use_tf32=0) and
#     its TF32 test (use_tf32=1, a TF32 tolerance); then the Checker with onnxruntime's defaults (a failure
#     naming TF32) and with use_tf32=0 (gpu_check.py --part tf32)
#  4. what each switch changes per op (MatMul, Gemm, Conv, ConvTranspose): use_tf32 1/0, then again with
#     NVIDIA_TF32_OVERRIDE=0 (process-wide, so in a process of its own)
#  5. the real exports of tests/real_models.py (both exporters, float32 and float16): the evaluator on CUDA
#     against onnxruntime CUDA with use_tf32=0 and with its default, and against the CPU pair
#  6. blame on real exports on CUDA (Llama decoder layer with the opset-23 fused ops; ConvNeXt)
#  7. compare() timing and memory (bench_diff.py: the Triton pass vs torch path vs assert_close vs one read)
#     and the evaluator vs onnxruntime CUDA on the real-architecture graphs (bench_evaluator.py --only gpu)
#  8. the examples with CUDA present, then the whole suite with CUDA present (what is left of the time)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
START=$SECONDS
: > "$OUT/steps.txt"

step() {  # step NAME SECONDS COMMAND...: run it, log to $OUT/NAME.log, note its exit status and time
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$OUT/steps.txt"
}

step env 60 python - <<'EOF'
import onnx, onnxruntime, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
print("onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
try:
    import triton
    print("triton", triton.__version__)
except Exception as exc:
    print("triton: not importable:", exc)
from pytest_ortdiff import OrtRunner, models
m = models.layer_norm_matmul_add(dtype="float32")
r = OrtRunner(m, provider="CUDA")
print("CUDA provider options (defaults):", r.session.get_provider_options().get("CUDAExecutionProvider"))
from pytest_ortdiff.runtimes.tf32 import precision_settings
print("torch float32 settings:", precision_settings("cuda"))
EOF
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

step pytest-cuda 240 python -m pytest -q -p no:cacheprovider -n 4 -rs --ort-providers=CPU,CUDA \
    tests/test_cuda.py tests/test_tf32.py tests/test_device_watch.py tests/test_ort_runner.py tests/test_diff.py

step demo 120 python -m pytest -q -p no:cacheprovider -rs examples/test_layer_norm_matmul_add.py \
    --ort-providers=CUDA --ort-dtypes=float32,float16 --ortdiff-reports
step tf32 90 python benchmarks/gpu_check.py --part tf32
step switches 60 python benchmarks/gpu_check.py --part switches
step switches-override 60 env NVIDIA_TF32_OVERRIDE=0 python benchmarks/gpu_check.py --part switches
step exports 180 python benchmarks/gpu_check.py --part exports
step blame 120 python benchmarks/gpu_check.py --part blame
step bench-diff 90 python benchmarks/bench_diff.py --quick
step bench-evaluator 90 python benchmarks/bench_evaluator.py --quick --only gpu

left=$((570 - (SECONDS - START)))
if [ "$left" -gt 60 ]; then
    step examples $((left / 3)) python -m pytest -q -p no:cacheprovider -n 4 -rs examples --ort-providers=CPU,CUDA \
        --ort-dtypes=float32,float16 --hypothesis-profile=ortdiff-ci
    left=$((570 - (SECONDS - START)))
    step suite "$left" python -m pytest -q -p no:cacheprovider -n 8 --dist loadgroup
fi
echo "total $((SECONDS - START))s" | tee -a "$OUT/steps.txt"
