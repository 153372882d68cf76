"""Torch kernels for onnxruntime's quantization contrib ops: MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm, the QLinear* family.

Integer outputs are exact (round half to even, saturating, as onnxruntime); float outputs compute what the
op means: the dequantized operands in float32 (float64 in the oracle), rounded once to the output's dtype.
"""

from __future__ import annotations

import onnx
import torch

from ..base import Departure, Kernel, KernelContext, UnsupportedVariantError, kernel
from ..quantization import FLOAT8_TYPES, INT4, UINT4, storage

__all__ = [
    "GatherBlockQuantized",
    "MatMulNBits",
    "MatMulNBitsAsOnnxruntime",
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
