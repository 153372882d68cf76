"""Torch kernels for onnxruntime's quantization contrib ops: MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, the QLinear* family.

Integer outputs are exact (round half to even, saturating, as onnxruntime); float outputs compute what the
op means: the dequantized operands in float32 (float64 in the oracle), rounded once to the output's dtype.
"""

from __future__ import annotations

import math

import onnx
import torch

from ..base import Departure, Kernel, KernelContext, UnsupportedVariantError, kernel
from ..quantization import FLOAT8_TYPES, INT4, UINT4, dynamic_quantize_uint8, quantize, storage
from ..quantization import DequantizeLinear as DequantizeLinearOnnx
from ..quantization import QuantizeLinear as QuantizeLinearOnnx

__all__ = [
    "DequantizeLinearMS",
    "DynamicQuantizeMatMul",
    "GatherBlockQuantized",
    "MatMulIntegerToFloat",
    "MatMulNBits",
    "MatMulNBitsAsOnnxruntime",
    "QGemm",
    "QLinearAdd",
    "QLinearAveragePool",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
    "QLinearLeakyRelu",
    "QLinearMul",
    "QLinearReduceMean",
    "QLinearSigmoid",
    "QLinearSoftmax",
    "QLinearWhere",
    "QuantizeLinearMS",
    "unpack_bits",
]

MS = "com.microsoft"


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 bytes holding 8 // bits values each, the first in the low bits, as one uint8 value per element
    along the last axis (a byte's values in order): onnxruntime's packing of MatMulNBits' B and zero points
    and of GatherBlockQuantized's uint8 data."""
    if bits == 8:
        return packed
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    values = (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * (8 // bits))


def _compute_dtype(ctx: KernelContext, *xs: torch.Tensor | None) -> torch.dtype:
    """float64 in the oracle (or for float64 operands), float32 otherwise: 16-bit operands are widened and
    the result rounded once, as onnxruntime's CPU kernels do."""
    if ctx.compute_dtype is not None or any(x is not None and x.dtype == torch.float64 for x in xs):
        return torch.float64
    return torch.float32


# -- MatMulNBits ---------------------------------------------------------------------------------------


@kernel("MatMulNBits", since=1, domain=MS)
class MatMulNBits(Kernel):
    """Y = A @ dequantize(B)^T + bias: B's (N, K) weight quantized to `bits` (2, 4 or 8) in blocks of
    `block_size` along K, each block with its scale and zero point ((q - zero_point) * scale; packed uint8
    zero points, zero points of A's type, or the default 2^(bits-1)); `g_idx` (act-order) names each row
    of K's block. A B with a zero dimension (weight_prepacked=0) is an omitted projection: Y is zeros plus
    the bias.

    `accuracy_level` sets the least precision the provider may compute A in. At 4, onnxruntime's CPU kernel
    quantizes A to int8 per block of K (scale max|a| / 127, round half to even) and multiplies integers
    (MLAS CompInt8, taken where B is a constant without g_idx or float zero points): it departs from the
    op's meaning on purpose. This kernel computes the meaning, the dequantized float product;
    `MatMulNBitsAsOnnxruntime` computes onnxruntime's int8 arithmetic, so that the cost of that choice is
    measured (`departure()`, which blame reads)."""

    #: quantize A to int8 per block where onnxruntime does (accuracy_level=4)
    int8_activations = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.k = int(self.attr("K"))
        self.n = int(self.attr("N"))
        self.bits = int(self.attr("bits", 4))
        self.block_size = int(self.attr("block_size"))
        self.accuracy_level = int(self.attr("accuracy_level", 0))
        prepacked = int(self.attr("weight_prepacked", 0))
        if prepacked:
            layout = {1: "the CUDA SM80 fpA_intB layout", 2: "the CUDA SM90 fpA_intB layout"}.get(prepacked, "an EP-specific layout")
            raise UnsupportedVariantError(
                f"MatMulNBits weight_prepacked={prepacked}: B is prepacked in {layout}, which the evaluator "
                "cannot read; export the model with weight_prepacked=0, or run the node on onnxruntime "
                "(kernels={('com.microsoft', 'MatMulNBits'): 'ort'})"
            )
        if self.bits not in (2, 4, 8):
            raise UnsupportedVariantError(f"MatMulNBits bits={self.bits}: onnxruntime's kernels take 2, 4 or 8")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"MatMulNBits block_size={self.block_size}: must be a power of two, at least 16")
        self.k_blocks = -(-self.k // self.block_size)
        self.has_g_idx = len(node.input) > 4 and bool(node.input[4])

    def departure(self) -> Departure | None:
        if self.accuracy_level != 4 or self.has_g_idx:
            return None
        return Departure(
            f"MatMulNBits accuracy_level=4: onnxruntime quantizes A to int8 per block of K "
            f"({self.block_size} values, scale max|a|/127) and multiplies integers (MLAS CompInt8) where B "
            "is a constant; the op's meaning is the float product with the dequantized B",
            MatMulNBitsAsOnnxruntime(self.node, self.ctx),
        )

    def weight(
        self, b: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None, g_idx: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The quantized weight q (N, K) as int64, its zero point and scale per element, (N, K) each; the
        zero point and scale in `dtype`."""
        n, k, kb, bits = self.n, self.k, self.k_blocks, self.bits
        blob = self.block_size * bits // 8
        if b.numel() != n * kb * blob:
            raise ValueError(f"MatMulNBits B has {tuple(b.shape)}: expected (N, k_blocks, blob_size) = ({n}, {kb}, {blob}) for K={k}, block_size={self.block_size}, bits={bits}")
        q = unpack_bits(b.reshape(n, kb * blob), bits)[:, :k].to(torch.int64)
        if scales.numel() != n * kb:
            raise ValueError(f"MatMulNBits scales have {tuple(scales.shape)}: expected (N, k_blocks) = ({n}, {kb})")
        s = scales.reshape(n, kb).to(dtype)
        if zero_points is None:
            zp = torch.full((n, kb), float(1 << (bits - 1)), dtype=dtype, device=b.device)
        elif zero_points.dtype == torch.uint8:
            per_row = -(-kb * bits // 8)
            if zero_points.numel() != n * per_row:
                raise ValueError(f"MatMulNBits packed zero points have {tuple(zero_points.shape)}: expected (N, ceil(k_blocks * bits / 8)) = ({n}, {per_row})")
            zp = unpack_bits(zero_points.reshape(n, per_row), bits)[:, :kb].to(dtype)
        else:
            if zero_points.numel() != n * kb:
                raise ValueError(f"MatMulNBits zero points of A's type have {tuple(zero_points.shape)}: expected (N, k_blocks) = ({n}, {kb})")
            zp = zero_points.reshape(n, kb).to(dtype)
        if g_idx is not None:
            if g_idx.numel() != k:
                raise ValueError(f"MatMulNBits g_idx has {g_idx.numel()} elements: expected K = {k}")
            block = g_idx.reshape(k).to(torch.int64)
            if block.numel() and (int(block.min()) < 0 or int(block.max()) >= kb):
                raise ValueError(f"MatMulNBits g_idx holds blocks outside [0, {kb})")
        else:
            block = torch.arange(k, device=b.device) // self.block_size
        return q, zp[:, block], s[:, block]

    def run(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        scales: torch.Tensor,
        zero_points: torch.Tensor | None = None,
        g_idx: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if a.shape[-1] != self.k if a.dim() else True:
            raise ValueError(f"MatMulNBits A has {tuple(a.shape)}: its last dimension must be K = {self.k}")
        out_shape = (*a.shape[:-1], self.n)
        dtype = _compute_dtype(self.ctx, a, scales)
        if b.numel() == 0:  # an omitted projection (the spec's empty-weight convention)
            y = torch.zeros(out_shape, dtype=dtype, device=a.device)
            if bias is not None:
                y = y + bias.to(dtype)
            return (y.to(a.dtype),)
        q, zp, s = self.weight(b, scales, zero_points, g_idx, dtype)
        af = a.to(dtype)
        if self.int8_activations and self._takes_int8(zero_points, g_idx):
            y = self._int8_product(af, q, zp, s, dtype)
        else:
            # (q - zp) * s is the dequantized weight; A in float32 (float64 in the oracle), one product
            y = torch.matmul(af, ((q.to(dtype) - zp) * s).t())
        if bias is not None:
            y = y + bias.to(dtype)
        return (y.to(a.dtype),)

    def _takes_int8(self, zero_points: torch.Tensor | None, g_idx: torch.Tensor | None) -> bool:
        """Whether onnxruntime's CPU kernel quantizes A here: accuracy_level 4, B prepacked (no g_idx, no
        float zero points)."""
        return self.accuracy_level == 4 and g_idx is None and (zero_points is None or not zero_points.is_floating_point())

    def _int8_product(self, a: torch.Tensor, q: torch.Tensor, zp: torch.Tensor, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A @ W^T as MLAS CompInt8 computes it: each block of K of a row of A quantized to int8 with scale
        max|a| / 127 (a * (127 / max|a|) rounded half to even), each block's integer dot product with
        (q - zp) scaled by the two scales and summed in float32."""
        bs, k, kb = self.block_size, self.k, self.k_blocks
        a32 = a.to(torch.float32)
        pad = kb * bs - k
        blocks = torch.nn.functional.pad(a32, (0, pad)).reshape(*a.shape[:-1], kb, bs)
        amax = blocks.abs().amax(dim=-1, keepdim=True)
        a_scale = amax / 127.0
        inverse = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
        qa = torch.round(blocks * inverse).clamp_(-127, 127)
        # per block the integer dot product (exact in float64: |sum| < 2**31), scaled in float32
        qb = torch.nn.functional.pad(q.to(torch.float64) - zp.to(torch.float64), (0, pad)).reshape(self.n, kb, bs)
        dots = torch.einsum("...bi,nbi->...bn", qa.to(torch.float64), qb).to(torch.float32)
        b_scale = torch.nn.functional.pad(s.to(torch.float32), (0, pad)).reshape(self.n, kb, bs)[:, :, 0]
        scaled = dots * (a_scale * b_scale.t())  # (..., kb, N)
        return scaled.sum(dim=-2).to(dtype)


class MatMulNBitsAsOnnxruntime(MatMulNBits):
    """MatMulNBits with accuracy_level=4 computed as onnxruntime's CPU kernel does (A quantized to int8 per
    block of K), not as the op means: `kernels={("com.microsoft", "MatMulNBits"): MatMulNBitsAsOnnxruntime}`
    shows what that choice costs. Not registered: the registry's kernel computes the meaning."""

    int8_activations = True

    def departure(self) -> Departure | None:
        return None


# -- GatherBlockQuantized ------------------------------------------------------------------------------


_FLOAT8 = frozenset(FLOAT8_TYPES.values())


@kernel("GatherBlockQuantized", since=1, domain=MS)
class GatherBlockQuantized(Kernel):
    """Gather of a block-quantized `data` along `gather_axis`, dequantized: (q - zero_point) * scale, the
    scales (and zero points) blocked by `block_size` along `quantize_axis`. `data` is int4/uint4 (zero
    point default 0), uint8 holding `bits` (2, 4 or 8) values per byte along the last axis, low bits first
    (zero points packed the same way, default 2^(bits-1)), or float8 (no zero point; `block_size` 0: one
    block per row; scales may broadcast a dimension of 1). An index outside [-s, s) gives zeros, not an
    error. float4e2m1 data is refused: torch has no one-value-per-element float4 dtype."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.gather_axis = int(self.attr("gather_axis", 0))
        self.quantize_axis = int(self.attr("quantize_axis", 1))
        self.block_size = int(self.attr("block_size", 128))
        self.bits = int(self.attr("bits", 4))

    def run(
        self, data: torch.Tensor, indices: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        rank = data.dim()
        g, qa = self.gather_axis % rank if rank else 0, self.quantize_axis % rank if rank else 0
        if not -rank <= self.gather_axis < rank or not -rank <= self.quantize_axis < rank:
            raise ValueError(f"GatherBlockQuantized gather_axis={self.gather_axis}, quantize_axis={self.quantize_axis}: out of range for data of rank {rank}")
        fp8 = data.dtype in _FLOAT8
        block = self.block_size
        per_byte = 1
        if fp8:
            if zero_points is not None:
                raise ValueError("GatherBlockQuantized: float8 data takes no zero points (its quantization is symmetric)")
            if block == 0:
                block = max(data.shape[qa], 1)
            values = data
        elif data.dtype == torch.uint8:
            if self.bits not in (2, 4, 8):
                raise UnsupportedVariantError(f"GatherBlockQuantized bits={self.bits} with uint8 data: 2, 4 or 8")
            if g != 0 or qa != rank - 1:
                raise ValueError(f"GatherBlockQuantized with uint8 data gathers along axis 0 and quantizes along the last (gather_axis={g}, quantize_axis={qa})")
            per_byte = 8 // self.bits
            values = data
        elif data.dtype in (INT4, UINT4):
            if self.bits != 4:
                raise ValueError(f"GatherBlockQuantized bits={self.bits} with {data.dtype} data: int4/uint4 data has 4 bits")
            values = storage(data)
        else:
            raise UnsupportedVariantError(f"GatherBlockQuantized data of {data.dtype}: int4, uint4, uint8 or float8")
        if not fp8 and (block < 16 or block & (block - 1)):
            raise ValueError(f"GatherBlockQuantized block_size={self.block_size}: a power of two, at least 16")
        logical = list(data.shape)
        logical[-1] *= per_byte
        if scales.dim() != rank:
            raise ValueError(f"GatherBlockQuantized scales of rank {scales.dim()}: data has rank {rank}")
        for axis in range(rank):
            want = -(-logical[axis] // block) if axis == qa else logical[axis]
            if scales.shape[axis] != want and not (fp8 and axis != qa and scales.shape[axis] == 1):
                raise ValueError(f"GatherBlockQuantized scales {tuple(scales.shape)} do not match data {tuple(logical)} blocked by {block} along axis {qa}")
        dim = data.shape[g]
        idx = indices.to(torch.int64)
        valid = (idx >= -dim) & (idx < dim)
        flat = torch.where(idx < 0, idx + dim, idx).clamp(0, max(dim - 1, 0)).reshape(-1)
        dtype = _compute_dtype(self.ctx, scales)
        picked = torch.index_select(values, g, flat)
        if per_byte > 1:
            picked = unpack_bits(picked, self.bits)
        q = picked.to(dtype)
        s = scales
        zp = zero_points
        if zp is not None:
            zp = storage(zp)
            if per_byte > 1:
                zp = unpack_bits(zp, self.bits)[..., : scales.shape[-1]]
        elif not fp8:
            zp = torch.full((), float(1 << (self.bits - 1)) if data.dtype == torch.uint8 else 0.0, dtype=dtype, device=data.device)
        if g == qa:  # the gathered rows' own blocks
            s = torch.index_select(s, g, flat // block)
            zp = torch.index_select(zp, g, flat // block) if zp is not None and zp.dim() else zp
        else:
            s = torch.index_select(s, g, flat) if s.shape[g] != 1 else s
            zp = torch.index_select(zp, g, flat) if zp is not None and zp.dim() else zp
            s = _blocks(s, qa, block, q.shape[qa])
            zp = _blocks(zp, qa, block, q.shape[qa]) if zp is not None and zp.dim() else zp
        y = q if zp is None else q - zp.to(dtype)
        y = y * s.to(dtype)
        y = torch.where(valid.reshape(-1).reshape([-1 if a == g else 1 for a in range(rank)]), y, torch.zeros((), dtype=dtype, device=y.device))
        out_shape = [*logical[:g], *indices.shape, *logical[g + 1 :]]
        return (y.reshape(out_shape).to(scales.dtype),)


def _blocks(p: torch.Tensor, axis: int, block: int, length: int) -> torch.Tensor:
    """A blocked parameter repeated `block` times along `axis`, cut to `length` (a dimension of 1 broadcasts)."""
    if p.shape[axis] == 1 and length > 1 and block >= length:
        return p
    return p.repeat_interleave(block, dim=axis).narrow(axis, 0, length)


# -- integer matrix products with float outputs -----------------------------------------------------------
#
# onnxruntime's quantized kernels compute in float32 whatever the model's other tensors are, and round to
# integers from there: these kernels do the same in the float64 oracle too (its scales, promoted from
# float32, are cast back exactly), so that an integer output is the same integer in both.


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32)


def _centered(x: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """x - zero_point exactly, in float64 (8-bit operands: every partial sum of their products is an exact
    integer there, and float64 matmul runs on every device)."""
    xd = storage(x).to(torch.float64)
    return xd if zero_point is None else xd - storage(zero_point).to(torch.float64)


def _per_column(p: torch.Tensor | None, n: int, what: str) -> torch.Tensor | None:
    """A scalar or per-column (N) parameter of B, as a row that broadcasts over the output's rows."""
    if p is None or p.numel() == 1:
        return None if p is None else p.reshape(())
    if p.numel() != n:
        raise ValueError(f"{what} has {p.numel()} elements: a scalar or one per column of B ({n})")
    return p.reshape(n)


def _integer_product_to_float(
    a: torch.Tensor, a_scale: torch.Tensor, a_zero_point: torch.Tensor | None,
    b: torch.Tensor, b_scale: torch.Tensor, b_zero_point: torch.Tensor | None,
    bias: torch.Tensor | None, what: str,
) -> torch.Tensor:
    """float32 (A - a_zp) @ (B - b_zp) * (a_scale * b_scale) + bias: the integer product exact, scaled and
    biased in float32 as onnxruntime does; B's scale and zero point per tensor or per column."""
    n = b.shape[-1]
    bzp = _per_column(b_zero_point, n, f"{what} b_zero_point")
    acc = torch.matmul(_centered(a, a_zero_point), _centered(b, bzp))
    bs = _per_column(_f32(b_scale), n, f"{what} b_scale")
    assert bs is not None
    y = acc.to(torch.float32) * (_f32(a_scale).reshape(()) * bs)
    if bias is not None:
        y = y + _f32(bias)
    return y


@kernel("DynamicQuantizeMatMul", since=1, domain=MS)
class DynamicQuantizeMatMul(Kernel):
    """A quantized to uint8 as DynamicQuantizeLinear does (scale (max(0, max A) - min(0, min A)) / 255 over
    the whole of A, zero point rounded half to even), times the quantized B, scaled by a_scale * b_scale
    (B's per tensor or per column) in float32, plus the bias."""

    def run(
        self, a: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
        b_zero_point: torch.Tensor | None = None, bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        qa, a_scale, a_zp = dynamic_quantize_uint8(_f32(a))
        y = _integer_product_to_float(qa, a_scale, a_zp, b, b_scale, b_zero_point, bias, "DynamicQuantizeMatMul")
        return (y.to(a.dtype),)


@kernel("MatMulIntegerToFloat", since=1, domain=MS)
class MatMulIntegerToFloat(Kernel):
    """(A - a_zero_point) @ (B - b_zero_point) * (a_scale * b_scale) + bias in the scales' float type: the
    integer product exact, scaled in float32. B's scale and zero point per tensor or per column; A's
    per tensor (per column of A, the spec's other layout, scales inside the sum: computed as the
    dequantized product)."""

    def run(
        self, a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
        a_zero_point: torch.Tensor | None = None, b_zero_point: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if a_scale.numel() == 1 and (a_zero_point is None or a_zero_point.numel() == 1):
            y = _integer_product_to_float(a, a_scale, a_zero_point, b, b_scale, b_zero_point, bias, "MatMulIntegerToFloat")
        else:  # per-column A parameters: A dequantized first (its scale varies along the sum)
            k = a.shape[-1]
            for p, name in ((a_scale, "a_scale"), (a_zero_point, "a_zero_point")):
                if p is not None and p.numel() not in (1, k):
                    raise ValueError(f"MatMulIntegerToFloat {name} has {p.numel()} elements: a scalar or one per column of A ({k})")
            da = _centered(a, None if a_zero_point is None else a_zero_point.reshape(-1)) * a_scale.to(torch.float64).reshape(-1)
            n = b.shape[-1]
            bzp = _per_column(b_zero_point, n, "MatMulIntegerToFloat b_zero_point")
            bs = _per_column(b_scale.to(torch.float64), n, "MatMulIntegerToFloat b_scale")
            assert bs is not None
            y = torch.matmul(da, _centered(b, bzp) * bs)
            if bias is not None:
                y = y + bias.to(torch.float64)
        return (y.to(b_scale.dtype),)


@kernel("QGemm", since=1, domain=MS)
class QGemm(Kernel):
    """Y = alpha * (A' - a_zp) @ (B' - b_zp) * a_scale * b_scale + C * a_scale * b_scale (A', B' transposed
    per transA/transB; C int32 at scale a_scale * b_scale), in float32, or requantized with y_scale and
    y_zero_point (round half to even, saturating): the integer product exact, the output scale
    alpha * a_scale * b_scale / y_scale computed in float32 as onnxruntime does. B's scale and zero point
    per tensor or per column."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.trans_a = int(self.attr("transA", 0))
        self.trans_b = int(self.attr("transB", 0))
        self.alpha = float(self.attr("alpha", 1.0))

    def run(
        self, a: torch.Tensor, a_scale: torch.Tensor, a_zero_point: torch.Tensor,
        b: torch.Tensor, b_scale: torch.Tensor, b_zero_point: torch.Tensor,
        c: torch.Tensor | None = None, y_scale: torch.Tensor | None = None, y_zero_point: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"QGemm multiplies matrices: A {tuple(a.shape)}, B {tuple(b.shape)}")
        a2 = a.t() if self.trans_a else a
        b2 = b.t() if self.trans_b else b
        n = b2.shape[1]
        acc = torch.matmul(_centered(a2, a_zero_point.reshape(())), _centered(b2, _per_column(b_zero_point, n, "QGemm b_zero_point")))
        if c is not None:
            acc = acc + c.to(torch.float64)
        bs = _per_column(_f32(b_scale), n, "QGemm b_scale")
        assert bs is not None
        scale = torch.tensor(self.alpha, dtype=torch.float32, device=a.device) * _f32(a_scale).reshape(()) * bs
        if y_scale is None:
            return ((acc.to(torch.float32) * scale).to(b_scale.dtype),)
        if y_zero_point is None:
            raise ValueError("QGemm: y_scale without y_zero_point; give both (a quantized output) or neither (float32)")
        scale = scale / _f32(y_scale).reshape(())
        return (_requantize(acc.to(torch.float32) * scale, y_zero_point),)


def _requantize(value: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """round_half_even(value) + zero_point, saturated to the zero point's type (MLAS's requantization:
    the float32 value already scaled)."""
    lo, hi = _RANGE[zero_point.dtype]
    q = torch.round(value).to(torch.int64) + storage(zero_point).to(torch.int64).reshape(())
    return q.clamp_(lo, hi).to(zero_point.dtype)


_RANGE = {torch.uint8: (0, 255), torch.int8: (-128, 127)}


# -- the QLinear family: int8/uint8 in, int8/uint8 out -----------------------------------------------------


def _dequantized(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """scale * (x - zero_point) in float32, one rounding (onnxruntime's lookup tables and pools)."""
    xi = storage(x).to(torch.int32)
    if zero_point is not None:
        xi = xi - storage(zero_point).to(torch.int32).reshape(())
    return xi.to(torch.float32) * _f32(scale).reshape(())


def _quantized(y: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """MLAS's QuantizeLinear: round_half_even(y / scale) + zero_point, saturated, in float32."""
    return quantize(_f32(y), _f32(scale).reshape(()), None if zero_point is None else zero_point.reshape(()), dtype=dtype, precision=torch.float32)


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a * b + c rounded once (an FMA), through float64: a float32 product is exact there."""
    return (a.to(torch.float64) * b.to(torch.float64) + c.to(torch.float64)).to(torch.float32)


def _check_scalar(what: str, **params: torch.Tensor | None) -> None:
    for name, p in params.items():
        if p is not None and p.numel() != 1:
            raise UnsupportedVariantError(f"{what} {name} of shape {tuple(p.shape)}: the spec's is a scalar (per tensor)")


class _QLinearElementwise(Kernel):
    """X, X_scale, X_zero_point?, Y_scale, Y_zero_point? -> quantize(f(dequantize(X))), per tensor: f in
    float32, the result of X's type."""

    def f(self, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def run(
        self, x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor | None = None,
        y_scale: torch.Tensor | None = None, y_zero_point: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if y_scale is None:
            raise ValueError(f"{self.op_type} needs Y_scale (input 3)")
        _check_scalar(self.op_type, X_scale=x_scale, X_zero_point=x_zero_point, Y_scale=y_scale, Y_zero_point=y_zero_point)
        return (_quantized(self.f(_dequantized(x, x_scale, x_zero_point)), y_scale, y_zero_point, x.dtype),)


@kernel("QLinearSigmoid", since=1, domain=MS)
class QLinearSigmoid(_QLinearElementwise):
    """quantize(sigmoid(dequantize(X))), per tensor."""

    def f(self, v: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(v)


@kernel("QLinearLeakyRelu", since=1, domain=MS)
class QLinearLeakyRelu(_QLinearElementwise):
    """quantize(v if v >= 0 else alpha * v), v = dequantize(X), alpha default 0.01, per tensor."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.alpha = float(self.attr("alpha", 0.01))

    def f(self, v: torch.Tensor) -> torch.Tensor:
        return torch.where(v >= 0, v, v * torch.tensor(self.alpha, dtype=torch.float32, device=v.device))


def _zero_point32(zero_point: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A scalar zero point as float32 (0 when omitted)."""
    if zero_point is None:
        return torch.zeros((), dtype=torch.float32, device=like.device)
    return storage(zero_point).to(torch.float32).reshape(())


class _QLinearBinary(Kernel):
    """A, A_scale, A_zero_point?, B, B_scale, B_zero_point?, C_scale, C_zero_point? -> C of A's type,
    broadcasting, every scale and zero point per tensor: `value` gives the float32 value C rounds from."""

    def value(self, a: torch.Tensor, b: torch.Tensor, scales: tuple[torch.Tensor, ...], zero_points: tuple[torch.Tensor, ...]) -> torch.Tensor:
        raise NotImplementedError

    def run(
        self, a: torch.Tensor, a_scale: torch.Tensor, a_zero_point: torch.Tensor | None,
        b: torch.Tensor, b_scale: torch.Tensor, b_zero_point: torch.Tensor | None,
        c_scale: torch.Tensor, c_zero_point: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        _check_scalar(self.op_type, A_scale=a_scale, A_zero_point=a_zero_point, B_scale=b_scale, B_zero_point=b_zero_point, C_scale=c_scale, C_zero_point=c_zero_point)
        scales = tuple(_f32(s).reshape(()) for s in (a_scale, b_scale, c_scale))
        zero_points = tuple(_zero_point32(z, a) for z in (a_zero_point, b_zero_point, c_zero_point))
        value = self.value(storage(a).to(torch.float32), storage(b).to(torch.float32), scales, zero_points)
        return (_saturated(torch.round(value), a.dtype),)


@kernel("QLinearAdd", since=1, domain=MS)
class QLinearAdd(_QLinearBinary):
    """C = saturate(round((A_scale (A - A_zp) + B_scale (B - B_zp)) / C_scale) + C_zp), broadcasting: in
    float32 as MLAS orders it, A_scale / C_scale and B_scale / C_scale first, C's zero point folded in
    before the rounding."""

    def value(self, a: torch.Tensor, b: torch.Tensor, scales: tuple[torch.Tensor, ...], zero_points: tuple[torch.Tensor, ...]) -> torch.Tensor:
        (sa, sb, sc), (zp_a, zp_b, zp_c) = scales, zero_points
        r_a, r_b = sa / sc, sb / sc
        fixed = zp_c - (r_a * zp_a + r_b * zp_b)
        return _fma32(a, r_a, _fma32(b, r_b, fixed))


@kernel("QLinearMul", since=1, domain=MS)
class QLinearMul(_QLinearBinary):
    """C = saturate(round((A - A_zp) (B - B_zp) * (A_scale * B_scale / C_scale) + C_zp)), broadcasting: the
    integer product exact, scaled in float32 as MLAS does."""

    def value(self, a: torch.Tensor, b: torch.Tensor, scales: tuple[torch.Tensor, ...], zero_points: tuple[torch.Tensor, ...]) -> torch.Tensor:
        (sa, sb, sc), (zp_a, zp_b, zp_c) = scales, zero_points
        return ((a - zp_a) * (b - zp_b)) * (sa * sb / sc) + zp_c  # (the product of two 8-bit differences is exact in float32)


def _required(k: Kernel, name: str, what: str) -> int:
    value = k.attr(name)
    if value is None:
        raise ValueError(f"{k.op_type} needs the `{name}` attribute ({what})")
    return int(value)


def _saturated(rounded: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    lo, hi = _RANGE[dtype]
    return rounded.clamp(lo, hi).to(dtype)


@kernel("QLinearSoftmax", since=1, domain=MS)
class QLinearSoftmax(_QLinearElementwise):
    """quantize(Softmax(dequantize(X))) along `axis` (Softmax-13's single axis when `opset` >= 13, default
    -1; before, the input coerced to 2-D at `axis`, default 1), in float32.

    onnxruntime's CPU kernel departs from this: it multiplies by floor(1 / y_scale) rather than dividing by
    y_scale (equal when 1 / y_scale is an integer, as 1/256 is), and wraps an int8 result above 127 (a
    probability of 1 with zero point -128) instead of saturating."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.opset = _required(self, "opset", "the Softmax version it follows")
        self.axis = int(self.attr("axis", -1 if self.opset >= 13 else 1))

    def f(self, v: torch.Tensor) -> torch.Tensor:
        axis = self.axis % v.dim() if v.dim() else 0
        if self.opset >= 13:
            return torch.softmax(v, dim=axis)
        return torch.softmax(v.reshape(*v.shape[:axis], -1), dim=-1).reshape(v.shape)


@kernel("QLinearConcat", since=1, domain=MS)
class QLinearConcat(Kernel):
    """Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input: each input requantized to Y's scale
    and zero point (round half to even, saturating, float32), concatenated along `axis`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = _required(self, "axis", "the axis to concatenate on")

    def run(self, y_scale: torch.Tensor, y_zero_point: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not inputs or len(inputs) % 3:
            raise ValueError(f"QLinearConcat takes (tensor, scale, zero point) triples after Y's scale and zero point; got {len(inputs)} inputs there")
        parts = []
        for x, scale, zp in zip(inputs[0::3], inputs[1::3], inputs[2::3], strict=True):
            _check_scalar("QLinearConcat", X_scale=scale, X_zero_point=zp)
            parts.append(_quantized(_dequantized(x, scale, zp), y_scale, y_zero_point, y_zero_point.dtype))
        return (torch.cat(parts, dim=self.axis),)


@kernel("QLinearWhere", since=1, domain=MS)
class QLinearWhere(Kernel):
    """where(condition, X, Y), X and Y requantized to Z's scale and zero point (round half to even,
    saturating, float32), broadcasting."""

    def run(
        self, condition: torch.Tensor, x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor,
        y: torch.Tensor, y_scale: torch.Tensor, y_zero_point: torch.Tensor, z_scale: torch.Tensor, z_zero_point: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        _check_scalar("QLinearWhere", x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale, y_zero_point=y_zero_point, z_scale=z_scale, z_zero_point=z_zero_point)
        qx = _quantized(_dequantized(x, x_scale, x_zero_point), z_scale, z_zero_point, z_zero_point.dtype)
        qy = _quantized(_dequantized(y, y_scale, y_zero_point), z_scale, z_zero_point, z_zero_point.dtype)
        return (torch.where(condition.to(torch.bool), qx, qy),)


def _nchw(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    return x.movedim(-1, 1) if channels_last else x


def _pool_quantized(y: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """onnxruntime's quantized pools: round_half_even(y / scale + zero_point), saturated, in float32."""
    zp = torch.zeros((), dtype=torch.float32, device=y.device) if zero_point is None else storage(zero_point).to(torch.float32).reshape(())
    return _saturated(torch.round(y / _f32(scale).reshape(()) + zp), dtype)


@kernel("QLinearAveragePool", since=1, domain=MS)
class QLinearAveragePool(Kernel):
    """quantize(AveragePool(dequantize(X))): AveragePool's attributes (kernel_shape, strides, pads or
    auto_pad, ceil_mode, count_include_pad), NCHW or (channels_last) NHWC, in float32."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        from ..nn.pool import AveragePool

        self.channels_last = bool(self.attr("channels_last", 0))
        # the pool of ONNX's AveragePool, on the dequantized input (its attributes are the same)
        self.pool = AveragePool(node, ctx)

    def run(
        self, x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor | None,
        y_scale: torch.Tensor, y_zero_point: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        _check_scalar("QLinearAveragePool", x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale, y_zero_point=y_zero_point)
        (avg,) = self.pool.run(_nchw(_dequantized(x, x_scale, x_zero_point), self.channels_last))
        y = _pool_quantized(avg, y_scale, y_zero_point, x.dtype)
        return (y.movedim(1, -1) if self.channels_last else y,)


@kernel("QLinearGlobalAveragePool", since=1, domain=MS)
class QLinearGlobalAveragePool(Kernel):
    """The mean over the spatial axes of each channel (NCHW, or NHWC with channels_last), requantized: the
    integer sum exact, minus the zero point's, times x_scale / (y_scale * size) in float32, rounded half to
    even, plus y's zero point, saturated (MLAS's arithmetic)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.channels_last = bool(self.attr("channels_last", 0))

    def run(
        self, x: torch.Tensor, x_scale: torch.Tensor, x_zero_point: torch.Tensor,
        y_scale: torch.Tensor, y_zero_point: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        _check_scalar("QLinearGlobalAveragePool", x_scale=x_scale, x_zero_point=x_zero_point, y_scale=y_scale, y_zero_point=y_zero_point)
        xc = _nchw(storage(x), self.channels_last)
        spatial = tuple(range(2, xc.dim()))
        size = math.prod(xc.shape[2:])
        acc = xc.to(torch.float64).sum(dim=spatial, keepdim=True) - float(storage(x_zero_point).item()) * size
        scale = _f32(x_scale).reshape(()) / (_f32(y_scale).reshape(()) * torch.tensor(float(size), dtype=torch.float32, device=x.device))
        y = _requantize(acc.to(torch.float32) * scale, y_zero_point)
        return (y.movedim(1, -1) if self.channels_last else y,)


@kernel("QLinearReduceMean", since=1, domain=MS)
class QLinearReduceMean(_QLinearElementwise):
    """quantize(ReduceMean(dequantize(data), axes, keepdims)) in float32 (no axes: every axis)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axes = [int(a) for a in self.attr("axes", [])]
        self.keepdims = bool(self.attr("keepdims", 1))

    def f(self, v: torch.Tensor) -> torch.Tensor:
        if not v.dim():
            return v
        return v.mean(dim=self.axes or list(range(v.dim())), keepdim=self.keepdims)


# -- com.microsoft QuantizeLinear / DequantizeLinear ------------------------------------------------------


@kernel("QuantizeLinear", since=1, domain=MS)
class QuantizeLinearMS(QuantizeLinearOnnx):
    """ONNX's QuantizeLinear (per tensor or per `axis`; uint8/int8/uint16/int16/uint4/int4 by the zero
    point's type) in onnxruntime's domain: x / scale in float32 for float16 inputs too, as its kernel does."""

    def run(self, x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return super().run(x.to(torch.float32) if x.dtype == torch.float16 else x, scale, zero_point)


@kernel("DequantizeLinear", since=1, domain=MS)
class DequantizeLinearMS(DequantizeLinearOnnx):
    """ONNX's DequantizeLinear (per tensor or per `axis`) in onnxruntime's domain: (x - zero_point) * scale."""
