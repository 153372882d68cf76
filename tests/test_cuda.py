"""The CUDA paths: the torch evaluator on the GPU, the diff computed on the GPU (same numbers as on CPU),
onnxruntime's CUDA provider with outputs left on the GPU, and a pytest run with --ort-providers=CUDA.
Every test skips, with the reason, where torch has no CUDA device or onnxruntime no CUDA provider."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

from pytest_ortdiff import OrtRunner, Tolerance, TorchEvaluator, compare, models
from pytest_ortdiff.numerics import diff
from pytest_ortdiff.numerics.diff import DiffReport
from pytest_ortdiff.runtimes.providers import unavailable_reason

DIMS = {"a": 2, "b": 8, "c": 16}
INPUTS = ("X", "scale", "bias", "weights", "bias2")

_TORCH_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not _TORCH_CUDA, reason="needs a CUDA device: torch.cuda.is_available() is False here")
_ORT_CUDA_REASON = unavailable_reason("CUDA")
needs_ort_cuda = pytest.mark.skipif(
    _ORT_CUDA_REASON is not None,
    reason=f"needs onnxruntime's CUDA provider (pytest-ortdiff[gpu]): {_ORT_CUDA_REASON}",
)


def lnmma_numpy(feeds: dict[str, torch.Tensor]) -> np.ndarray:
    x, scale, bias, w, b2 = (feeds[k].double().cpu().numpy() for k in INPUTS)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + 1e-5) * scale + bias) @ w + b2


# -- the torch evaluator on the GPU ------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("float16", 1e-2), ("bfloat16", 5e-2)])
def test_evaluator_on_cuda_is_close_to_cpu(dtype: str, tol: float) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    (gpu,) = TorchEvaluator(model, device="cuda").run(None, feeds)  # CPU feeds are moved to the device
    (cpu,) = TorchEvaluator(model).run(None, feeds)
    assert gpu.device.type == "cuda"
    assert gpu.dtype == getattr(torch, dtype)
    assert tuple(gpu.shape) == (2, 8, 16)
    np.testing.assert_allclose(gpu.double().cpu().numpy(), cpu.double().numpy(), atol=tol, rtol=tol)


@needs_cuda
def test_evaluator_on_cuda_with_cuda_feeds_and_intermediates() -> None:
    model = models.layer_norm_matmul_add(dtype="float16")
    feeds = models.random_feeds(model, dims=DIMS, seed=1, device="cuda")
    assert {v.device.type for v in feeds.values()} == {"cuda"}
    values = TorchEvaluator(model, device="cuda").run(None, feeds, intermediates=True)
    assert {values[k].device.type for k in ("norm", "mm", "Z")} == {"cuda"}
    np.testing.assert_allclose(values["Z"].double().cpu().numpy(), lnmma_numpy(feeds), atol=1e-2, rtol=1e-2)


@needs_cuda
def test_float64_oracle_on_cuda() -> None:
    model = models.layer_norm_matmul_add(dtype="float16")
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    (z,) = TorchEvaluator(model, device="cuda", compute_dtype=torch.float64).run(None, feeds)
    assert z.device.type == "cuda"
    assert z.dtype == torch.float64
    np.testing.assert_allclose(z.cpu().numpy(), lnmma_numpy(feeds), atol=1e-9, rtol=1e-9)


@needs_cuda
@needs_ort_cuda
def test_ort_override_on_cuda_runs_the_cuda_provider() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims=DIMS, seed=0, device="cuda")
    values = TorchEvaluator(model, device="cuda", kernels={("", "MatMul"): "ort"}).run(None, feeds, intermediates=True)
    assert values["mm"].device.type == "cuda"
    np.testing.assert_allclose(
        values["mm"].double().cpu().numpy(),
        values["norm"].double().cpu().numpy() @ feeds["weights"].double().cpu().numpy(),
        atol=1e-4,
        rtol=1e-4,
    )


# -- the diff on the GPU --------------------------------------------------------------------------------


def _pair(dtype: torch.dtype, n: int = 100_003) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(n, generator=gen) * 10
    g = e + torch.randn(n, generator=gen) * torch.rand(n, generator=gen) ** 4
    e, g = e.to(dtype), g.to(dtype)
    e[5], g[5] = float("nan"), float("nan")  # equal
    e[6] = float("nan")  # mismatch
    e[7], g[7] = float("inf"), float("-inf")  # mismatch
    e[8], g[8] = float("inf"), float("inf")  # equal
    e[9], g[9] = 0.0, -0.0  # equal
    e[10], g[10] = 1e-40 if dtype != torch.float16 else 1e-7, 0.0  # a subnormal
    if dtype in (torch.float32, torch.bfloat16):
        e[11], g[11] = 3e38, -3e38  # finite, but the difference overflows float32
    return e, g


def _fields(r: DiffReport) -> dict:
    out = r.to_dict()
    out.pop("mean_abs")  # (summation order)
    return out


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_compare_on_cuda_gives_the_cpu_numbers(dtype: torch.dtype) -> None:
    e, g = _pair(dtype)
    thresholds = [0.0, 1e-3, 1e-2, 0.1, 1.0, math.inf]
    on_cpu = compare(e, g, thresholds=thresholds, tolerance=(1e-2, 1e-2))
    # the default (the fused Triton pass where Triton is importable), the torch path whole and in chunks
    for path, chunk in ((None, None), ("torch", None), ("torch", 4099)):
        on_gpu = diff._compare(e.cuda(), g.cuda(), thresholds=thresholds, tolerance=(1e-2, 1e-2), path=path, chunk=chunk)
        assert _fields(on_gpu) == _fields(on_cpu), (path, chunk)
        assert on_gpu.mean_abs == pytest.approx(on_cpu.mean_abs, rel=1e-6)
    finite = torch.isfinite(e) & torch.isfinite(g) & (e.abs() < 1e38) & (g.abs() < 1e38)
    e2, g2 = e[finite], g[finite]  # (no special pair: the fused pass keeps it to the end)
    finite_cpu = compare(e2, g2, thresholds=thresholds, tolerance=(1e-2, 1e-2))
    finite_gpu = diff._compare(e2.cuda(), g2.cuda(), thresholds=thresholds, tolerance=(1e-2, 1e-2))
    assert _fields(finite_gpu) == _fields(finite_cpu)
    assert finite_gpu.mean_abs == pytest.approx(finite_cpu.mean_abs, rel=1e-6)
    assert finite_cpu.max_abs > 0 and finite_cpu.counts[1e-3] > 0
    assert (on_cpu.nan_mismatch, on_cpu.inf_mismatch) == (1, 1)
    assert on_cpu.counts[math.inf] == 0
    assert on_cpu.n == e.numel()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_compare_on_cuda_needs_at_most_twice_the_inputs(dtype: torch.dtype) -> None:
    """Issue 12 item 17: the extra GPU memory of one compare stays within ~2x the two inputs."""
    e, g = (t.cuda() for t in _pair(dtype, n=1 << 22))
    compare(e[:1000], g[:1000], tolerance=(1e-2, 1e-2))  # CUDA context, kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    compare(e, g, tolerance=(1e-2, 1e-2))
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra <= 2.2 * (2 * e.numel() * e.element_size()), f"{extra / 2**20:.1f} MiB extra"


@needs_cuda
def test_compare_cuda_against_cpu_tensor() -> None:
    e = torch.linspace(-1, 1, 1000)
    g = e + 1e-3
    r = compare(e.cuda(), g)  # got is moved to expected's device
    assert r.counts[1e-4] == 1000
    assert r.counts[1e-2] == 0


@needs_cuda
def test_the_fused_pass_is_the_default_on_cuda_where_triton_is_importable() -> None:
    from pytest_ortdiff.numerics import diff_triton

    e = torch.linspace(-1, 1, 10_000, device="cuda")
    compare(e, e + 1e-3)  # (compiled and launched here: a Triton that cannot would give the pass up, saying why)
    assert diff_triton.failure() is None, f"the fused pass was given up: {diff_triton.failure()}"
    expected_path = "triton" if diff_triton.available() else "torch"
    assert diff._own_path(e) == expected_path
    assert diff._own_path(e.double()) == "torch"


@needs_cuda
def test_the_evaluator_computes_ieee_float32_on_cuda_whatever_torch_allows() -> None:
    """torch's TF32 switches on (as a user may have them, and cuDNN's are by default): the evaluator's
    float32 MatMul and Conv stay within IEEE float32's error of the float64 result (TF32 is ~1000x off)."""
    from pytest_ortdiff.runtimes import tf32

    saved = tf32._save("cuda")
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        TP = onnx.TensorProto
        model = oh.make_model(
            oh.make_graph(
                [oh.make_node("MatMul", ["a", "b"], ["m"]), oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])],
                "g",
                [oh.make_tensor_value_info(n, TP.FLOAT, s) for n, s in (("a", [64, 512]), ("b", [512, 64]), ("x", [1, 32, 16, 16]), ("w", [32, 32, 3, 3]))],
                [oh.make_tensor_value_info("m", TP.FLOAT, [64, 64]), oh.make_tensor_value_info("c", TP.FLOAT, [1, 32, 16, 16])],
            ),
            opset_imports=[oh.make_opsetid("", 18)],
            ir_version=9,
        )
        gen = torch.Generator().manual_seed(0)
        feeds = {"a": torch.randn(64, 512, generator=gen), "b": torch.randn(512, 64, generator=gen), "x": torch.randn(1, 32, 16, 16, generator=gen), "w": torch.randn(32, 32, 3, 3, generator=gen)}
        m, c = TorchEvaluator(model, device="cuda").run(None, feeds)
        m64 = feeds["a"].double() @ feeds["b"].double()
        c64 = torch.nn.functional.conv2d(feeds["x"].double(), feeds["w"].double(), padding=1)
        for got, exact in ((m, m64), (c, c64)):
            rel = float((got.double().cpu() - exact).abs().max() / exact.abs().max())
            assert rel < 2e-5, f"{rel:.2e}: TF32 (~1e-3) rather than IEEE float32"
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # restored
    finally:
        tf32._restore(saved)


@needs_cuda
def test_integer_products_run_on_cuda() -> None:
    """cuBLAS has no integer GEMM (torch: "addmm_cuda" not implemented for 'Long'): the integer MatMul, Gemm and
    Einsum kernels multiply on the host and hand the product back on the inputs' device."""
    TP = onnx.TensorProto
    model = oh.make_model(
        oh.make_graph(
            [
                oh.make_node("MatMul", ["a", "b"], ["m"]),
                oh.make_node("Gemm", ["a", "b", "c"], ["g"], alpha=2.0, transB=0),
                oh.make_node("Einsum", ["a", "b"], ["e"], equation="ij,jk->ik"),
                oh.make_node("MatMul", ["i", "j"], ["mi"]),
            ],
            "g",
            [oh.make_tensor_value_info(n, t, s) for n, t, s in (("a", TP.INT64, [3, 4]), ("b", TP.INT64, [4, 5]), ("c", TP.INT64, [5]), ("i", TP.INT32, [2, 3, 4]), ("j", TP.INT32, [4, 2]))],
            [oh.make_tensor_value_info(n, t, s) for n, t, s in (("m", TP.INT64, [3, 5]), ("g", TP.INT64, [3, 5]), ("e", TP.INT64, [3, 5]), ("mi", TP.INT32, [2, 3, 2]))],
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )
    gen = torch.Generator().manual_seed(0)
    feeds = {"a": torch.randint(-9, 9, (3, 4), generator=gen), "b": torch.randint(-9, 9, (4, 5), generator=gen), "c": torch.randint(-9, 9, (5,), generator=gen),
             "i": torch.randint(-9, 9, (2, 3, 4), generator=gen, dtype=torch.int32), "j": torch.randint(-9, 9, (4, 2), generator=gen, dtype=torch.int32)}
    on_gpu = TorchEvaluator(model, device="cuda").run(None, feeds)
    on_cpu = TorchEvaluator(model).run(None, feeds)
    for g, c in zip(on_gpu, on_cpu, strict=True):
        assert g.device.type == "cuda" and g.dtype == c.dtype
        assert torch.equal(g.cpu(), c)
    assert torch.equal(on_cpu[0], feeds["a"] @ feeds["b"])


# -- onnxruntime's CUDA provider ---------------------------------------------------------------------------


@needs_cuda
@needs_ort_cuda
def test_ort_cuda_waits_for_torchs_writes_to_its_inputs() -> None:
    """onnxruntime's CUDA stream waits for no other stream, and torch's kernels are queued: an input torch is
    still writing when onnxruntime starts would be read half-written. The runner synchronizes first."""
    TP = onnx.TensorProto
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("Add", ["x", "one"], ["y"])],
            "g",
            [oh.make_tensor_value_info("x", TP.FLOAT, ["n"])],
            [oh.make_tensor_value_info("y", TP.FLOAT, ["n"])],
            [oh.make_tensor("one", TP.FLOAT, [], [1.0])],
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )
    runner = OrtRunner(model, provider="CUDA")
    runner.run(None, {"x": torch.zeros(8, device="cuda")})  # (the session and its stream exist before the timing)
    for _ in range(3):
        x = torch.zeros(1 << 22, device="cuda")
        torch.cuda._sleep(20_000_000)  # ~10 ms of the GPU on torch's stream: the write below waits behind it
        x.fill_(2.0)
        (y,) = runner.run(None, {"x": x})
        assert torch.equal(y, torch.full_like(x, 3.0))


@needs_cuda
@needs_ort_cuda
def test_bool_feeds_and_outputs_on_cuda() -> None:
    """onnxruntime 1.31 (the newest onnxruntime-gpu) refuses bool through DLPack and exports bool as uint8."""
    TP = onnx.TensorProto
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("Not", ["m"], ["y"]), oh.make_node("Cast", ["x"], ["b"], to=TP.BOOL)],
            "g",
            [oh.make_tensor_value_info("m", TP.BOOL, [4]), oh.make_tensor_value_info("x", TP.FLOAT, [4])],
            [oh.make_tensor_value_info("y", TP.BOOL, [4]), oh.make_tensor_value_info("b", TP.BOOL, [4])],
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )
    m = torch.tensor([True, False, True, False], device="cuda")
    x = torch.tensor([0.0, 1.5, -2.0, 0.0], device="cuda")
    y, b = OrtRunner(model, provider="CUDA").run(None, {"m": m, "x": x})
    assert (y.dtype, b.dtype, y.device.type) == (torch.bool, torch.bool, "cuda")
    assert y.tolist() == [False, True, False, True] and b.tolist() == [False, True, True, False]


@needs_cuda
@needs_ort_cuda
def test_use_tf32_is_in_the_sessions_options() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    default = OrtRunner(model, provider="CUDA").session.get_provider_options()["CUDAExecutionProvider"]
    off = OrtRunner(model, provider="CUDA", provider_options={"use_tf32": 0}).session.get_provider_options()["CUDAExecutionProvider"]
    assert default.get("use_tf32") == "1"
    assert off.get("use_tf32") == "0"


@needs_cuda
@needs_ort_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_ort_cuda_outputs_stay_on_the_gpu(dtype: str) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=DIMS, seed=0)
    runner = OrtRunner(model, provider="CUDA", provider_options={"use_tf32": 0})  # (IEEE float32, as on CPU)
    assert runner.device == torch.device("cuda", 0)
    assert runner.session.get_providers()[0] == "CUDAExecutionProvider"
    (from_cpu_feeds,) = runner.run(None, feeds)
    (from_gpu_feeds,) = runner.run(None, {k: v.cuda() for k, v in feeds.items()})
    (from_numpy,) = runner.run(None, {k: v.numpy() for k, v in feeds.items()})
    for out in (from_cpu_feeds, from_gpu_feeds, from_numpy):
        assert out.device.type == "cuda"
        assert out.dtype == getattr(torch, dtype)
        assert tuple(out.shape) == (2, 8, 16)
    assert torch.equal(from_cpu_feeds, from_gpu_feeds)
    assert torch.equal(from_cpu_feeds, from_numpy)
    (cpu,) = OrtRunner(model).run(None, feeds)
    tol = Tolerance().for_dtype(dtype)
    report = compare(cpu, from_gpu_feeds.cpu(), tolerance=tol.allclose)
    assert tol.check(report) == []


@needs_cuda
@needs_ort_cuda
def test_ort_cuda_bfloat16_cast_round_trip() -> None:
    TP = onnx.TensorProto
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("Cast", ["x"], ["y"], to=TP.BFLOAT16)],
            "g",
            [oh.make_tensor_value_info("x", TP.FLOAT, ["n"])],
            [oh.make_tensor_value_info("y", TP.BFLOAT16, ["n"])],
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)).cuda()
    (y,) = OrtRunner(model, provider="CUDA").run(None, {"x": x})
    assert y.device.type == "cuda"
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, x.to(torch.bfloat16))


# -- a pytest run on CUDA ------------------------------------------------------------------------------------

SEED_TEST = """
import pytest
import torch
from pytest_ortdiff import models

@pytest.mark.ortdiff(dtypes=["float16", "bfloat16"])
def test_lnmm(ortdiff):
    assert ortdiff.device == "cuda"
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 16, "c": 32}, seed=0, device=ortdiff.device)
    report = ortdiff.check(model, feeds)
    assert report.n == 1024
    got = ortdiff.run(model, feeds, runtime="ort")
    assert got[0].device.type == "cuda" and got[0].dtype == ortdiff.torch_dtype
"""


@needs_cuda
@needs_ort_cuda
def test_fp16_and_bf16_checks_on_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_seed=SEED_TEST)
    result = pytester.runpytest("-v", "-rs", "--ort-providers=CUDA", "--ort-dtypes=float16,bfloat16")
    result.stdout.fnmatch_lines(["*test_lnmm[[]CUDA-float16[]] PASSED*"])
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 2
    result.stdout.fnmatch_lines(["*= ortdiff summary =*", "test_seed.py::test_lnmm[[]CUDA-float16[]] * CUDA * float16 * passed"])
    if outcomes.get("skipped"):
        # a bfloat16 hole in onnxruntime's CUDA provider is named, not hidden
        result.stdout.fnmatch_lines(["*holes in the provider × dtype matrix*", "1 test(s) skipped: CUDA-bfloat16: onnxruntime CUDAExecutionProvider has no bfloat16 kernel for *(*)"])
    else:
        result.stdout.fnmatch_lines(["test_seed.py::test_lnmm[[]CUDA-bfloat16[]] * CUDA * bfloat16 * passed"])
