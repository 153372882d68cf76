#!/usr/bin/env bash
# Issue 27's checks on a GPU machine, in one command that ends well inside its 10 minutes, with what a session
# needs under $OUT: steps.txt (each step's exit status and time, also printed with the end of its log) and
# gpu_check.tgz (every log and figure). Both are written again after each step: the device tool brings back at
# most 8 files, and a command stopped at its limit still brings back what the last finished step left.
#
# On the project's GPU machine (../shared/gpu/README.md): with .gpu/ort1 sent along, first
#     mkdir -p /tmp/o && mv .gpu/ort1/cuda.so.xz /tmp/o/ && nvidia-smi -L
# then, on the same machine, with .gpu/ort2 sent along:
#     source .gpu/ort2/on_device.sh && bash benchmarks/gpu_check.sh
# Elsewhere: any machine with a CUDA torch and onnxruntime-gpu (never next to onnxruntime) installed.
# $GPU_CHECK_SECONDS (default 540) bounds the whole run: a step's limit is cut to what is left, a step that would
# get under 20 s is skipped (steps.txt says so), and the last ones take what remains. $PYTHON: the interpreter
# (default python3: the GPU image's torch is python3's, and it may have no `python`).
#
# What it runs, most telling first (each step under `timeout`, so that a hang costs its step only):
#  1. env: versions, the GPU, onnxruntime's providers and its CUDA provider's default options (use_tf32), Triton
#  2. the CUDA tests: tests/test_cuda.py, the fused diff compiled (tests/test_diff_triton.py), and the TF32,
#     device-watch, runner and diff tests, with CUDA present
#  3. kernels: ONNX's node suite through the evaluator on CUDA, the contrib cases against onnxruntime CUDA; every
#     case whose status differs from the CPU's (gpu_check.py --part kernels)
#  4. the demo, examples/test_layer_norm_matmul_add.py --ort-providers=CUDA: its IEEE test (use_tf32=0) and
#     its TF32 test (use_tf32=1, a TF32 tolerance); then the Checker with onnxruntime's defaults (a failure
#     naming TF32) and with use_tf32=0 (gpu_check.py --part tf32)
#  5. what each switch changes per op (MatMul, Gemm, Conv, ConvTranspose): use_tf32 1/0, then again with
#     NVIDIA_TF32_OVERRIDE=0 (process-wide, so in a process of its own)
#  6. the real exports of tests/real_models.py (both exporters, float32 and float16): the evaluator on CUDA
#     against onnxruntime CUDA with use_tf32=0 and with its default, and against the CPU pair
#  7. blame on real exports on CUDA (Llama decoder layer with the opset-23 fused ops; ConvNeXt); the analyses
#     (parity, align, precision, the compile backend, check_reproducible) once each on CUDA
#  8. compare() timing and memory (bench_diff.py: the Triton pass vs torch path vs assert_close vs one read)
#     and the evaluator vs onnxruntime CUDA on the real-architecture graphs (bench_evaluator.py --only gpu)
#  9. the examples with CUDA present, then the whole suite with CUDA present (what is left of the time)
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${OUT:-$PWD/gpu-out}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
LOGS=$(mktemp -d /tmp/gpu_check.XXXXXX)
export OUT=$LOGS PYTHONUNBUFFERED=1  # (the parts write their figures next to the logs: all of it is packed)
BUDGET=${GPU_CHECK_SECONDS:-540}
START=$SECONDS
: > "$LOGS/steps.txt"

pack() {  # the steps and every log so far to $DEST (a new archive replaces the old one whole)
    cp "$LOGS/steps.txt" "$DEST/steps.txt"
    tar czf "$DEST/gpu_check.tgz.new" -C "$LOGS" . && mv "$DEST/gpu_check.tgz.new" "$DEST/gpu_check.tgz"
}

left() { echo $((BUDGET - (SECONDS - START))); }

step() {  # step NAME SECONDS COMMAND...: run it within what is left, log to NAME.log, note its status and time
    local name=$1 limit=$2
    shift 2
    local room=$(($(left) - 10))
    [ "$limit" -gt "$room" ] && limit=$room
    if [ "$limit" -lt 20 ]; then
        echo "$name skipped: $(left)s left of ${BUDGET}s" | tee -a "$LOGS/steps.txt"
        pack
        return
    fi
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    local why=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why=" (stopped at its ${limit}s limit)"; fi
    echo "$name rc=$rc $((SECONDS - t0))s$why" | tee -a "$LOGS/steps.txt"
    tail -n 4 "$LOGS/$name.log" | cut -c1-240 | sed 's/^/    /'
    pack
}

step env 60 "$PY" - <<'EOF'
import onnx, onnxruntime, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
print("onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
try:
    import triton
    print("triton", triton.__version__)
except Exception as exc:
    print("triton: not importable:", exc)
from pytest_ortdiff import OrtRunner, compare, models
from pytest_ortdiff.numerics import diff_triton
e = torch.linspace(-1, 1, 1 << 20, device="cuda")
print("compare on CUDA:", compare(e, e + 1e-3).summary())
print("fused pass:", "usable" if diff_triton.usable() else f"NOT usable: {diff_triton.failure() or 'Triton not importable'}")
m = models.layer_norm_matmul_add(dtype="float32")
r = OrtRunner(m, provider="CUDA")
print("CUDA provider options (defaults):", r.session.get_provider_options().get("CUDAExecutionProvider"))
from pytest_ortdiff.runtimes.tf32 import precision_settings
print("torch float32 settings:", precision_settings("cuda"))
EOF
nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1

step pytest-cuda 180 "$PY" -m pytest -q -p no:cacheprovider -n 4 -rs --ort-providers=CPU,CUDA \
    tests/test_cuda.py tests/test_diff_triton.py tests/test_tf32.py tests/test_device_watch.py tests/test_ort_runner.py tests/test_diff.py
step kernels 150 "$PY" benchmarks/gpu_check.py --part kernels
step demo 90 "$PY" -m pytest -q -p no:cacheprovider -rs examples/test_layer_norm_matmul_add.py \
    --ort-providers=CUDA --ort-dtypes=float32,float16 --ortdiff-reports
step tf32 60 "$PY" benchmarks/gpu_check.py --part tf32
step switches 45 "$PY" benchmarks/gpu_check.py --part switches
step switches-override 45 env NVIDIA_TF32_OVERRIDE=0 "$PY" benchmarks/gpu_check.py --part switches
step exports 120 "$PY" benchmarks/gpu_check.py --part exports
step blame 90 "$PY" benchmarks/gpu_check.py --part blame
step analyses 90 "$PY" benchmarks/gpu_check.py --part analyses
step bench-diff 90 "$PY" benchmarks/bench_diff.py --quick --gpu-only
step bench-evaluator 90 "$PY" benchmarks/bench_evaluator.py --quick --only gpu
step examples $(($(left) / 3)) "$PY" -m pytest -q -p no:cacheprovider -n 4 -rs examples --ort-providers=CPU,CUDA \
    --ort-dtypes=float32,float16 --hypothesis-profile=ortdiff-ci
step suite "$(left)" "$PY" -m pytest -q -p no:cacheprovider -n 8 --dist loadgroup
echo "total $((SECONDS - START))s of ${BUDGET}s" | tee -a "$LOGS/steps.txt"
pack
