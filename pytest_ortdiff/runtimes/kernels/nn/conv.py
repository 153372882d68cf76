"""Convolution kernels (ONNX's nn family): Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv,
Col2Im, CausalConvWithState; the padding arithmetic (explicit pads, auto_pad) the pooling kernels share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "CausalConvWithState",
    "Col2Im",
    "Conv",
    "ConvInteger",
    "ConvTranspose",
    "DeformConv",
    "QLinearConv",
]

Pads = list[tuple[int, int]]

_CONV: dict[int, Callable[..., torch.Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T: dict[int, Callable[..., torch.Tensor]] = {
    1: F.conv_transpose1d,
    2: F.conv_transpose2d,
    3: F.conv_transpose3d,
}
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def compute_type(x: torch.Tensor) -> torch.dtype:
    """The dtype to run torch's conv/pool kernels in: float32 for 16-bit floats on CPU, where torch's
    kernels are slow or missing and onnxruntime itself accumulates in float32."""
    if x.dtype in (torch.float16, torch.bfloat16) and x.device.type == "cpu":
        return torch.float32
    return x.dtype


def auto_pad_attr(k: Kernel) -> str:
    auto_pad = str(k.attr("auto_pad", "NOTSET"))
    if auto_pad not in _AUTO_PADS:
        raise UnsupportedVariantError(f"{k.op_type} auto_pad={auto_pad!r}: expected one of {_AUTO_PADS}")
    return auto_pad


def spatial_pads(
    auto_pad: str,
    pads: Sequence[int] | None,
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
) -> Pads:
    """(begin, end) padding per spatial axis, from ONNX's `pads` ([x1_begin, x2_begin, ..., x1_end, ...])
    or from `auto_pad` (SAME_*: the output is ceil(in / stride), the odd pixel at the end for SAME_UPPER)."""
    n = len(in_shape)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out: Pads = []
        for i in range(n):
            total = max(0, (-(-in_shape[i] // strides[i]) - 1) * strides[i]
                        + (kernel_shape[i] - 1) * dilations[i] + 1 - in_shape[i])
            small = total // 2
            out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        return out
    if auto_pad == "VALID" or not pads:
        return [(0, 0)] * n
    if len(pads) != 2 * n:
        raise ValueError(f"pads={list(pads)} has {len(pads)} values; a {n}-D input needs {2 * n}")
    return [(int(pads[i]), int(pads[i + n])) for i in range(n)]


def torch_pad(pads: Pads) -> list[int]:
    """ONNX's per-axis (begin, end) as F.pad's flat list, last axis first."""
    return [p for pair in reversed(pads) for p in pair]


def _ints(k: Kernel, name: str, n: int, default: int) -> list[int]:
    value = k.attr(name)
    if value is None:
        return [default] * n
    value = [int(v) for v in value]
    if len(value) != n:
        raise ValueError(f"{k.op_type} {name}={value} has {len(value)} values for {n} spatial axes")
    return value


def _check_kernel_shape(k: Kernel, w_spatial: Sequence[int]) -> list[int]:
    ks = k.attr("kernel_shape")
    if ks is not None and [int(v) for v in ks] != list(w_spatial):
        raise ValueError(
            f"{k.op_type} kernel_shape={list(ks)} disagrees with the weight's spatial shape {list(w_spatial)}"
        )
    return list(w_spatial)


def _conv(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    strides: Sequence[int],
    pads: Pads,
    dilations: Sequence[int],
    groups: int,
    op: str,
) -> torch.Tensor:
    """torch's convN-d after ONNX padding: symmetric pads go to torch, asymmetric (or negative) ones
    through F.pad first, which zero-pads exactly as the spec does."""
    n = x.dim() - 2
    fn = _CONV.get(n)
    if fn is None:
        raise UnsupportedVariantError(f"{op} on a {n}-D spatial input: torch convolves 1-D to 3-D only")
    if all(a == e and a >= 0 for a, e in pads):
        return fn(x, w, b, list(strides), [a for a, _ in pads], list(dilations), groups)
    return fn(F.pad(x, torch_pad(pads)), w, b, list(strides), 0, list(dilations), groups)


class _ConvAttrs(Kernel):
    """Attribute parsing shared by the Conv family: strides, dilations, pads/auto_pad, group."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.auto_pad = auto_pad_attr(self)
        self.group = int(self.attr("group", 1))

    def geometry(self, x: torch.Tensor, w: torch.Tensor) -> tuple[list[int], Pads, list[int]]:
        n = x.dim() - 2
        ks = _check_kernel_shape(self, w.shape[2:])
        strides = _ints(self, "strides", n, 1)
        dilations = _ints(self, "dilations", n, 1)
        pads = spatial_pads(self.auto_pad, self.attr("pads"), x.shape[2:], ks, strides, dilations)
        return strides, pads, dilations


@kernel("Conv", since=1)
class Conv(_ConvAttrs):
    """Y = conv(X, W) + B, groups, dilations, strides, explicit (asymmetric) or automatic padding.
    Conv-11 and Conv-22 only clarified auto_pad and added types: one kernel serves all versions."""

    def run(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        strides, pads, dilations = self.geometry(x, w)
        ct = compute_type(x)
        y = _conv(
            x.to(ct), w.to(ct), None if b is None else b.to(ct),
            strides, pads, dilations, self.group, "Conv",
        )
        return (y.to(x.dtype),)


@kernel("ConvTranspose", since=1)
class ConvTranspose(_ConvAttrs):
    """The gradient of Conv: torch's conv_transpose without padding, then the spec's pads cropped (or,
    for an output_shape beyond the full result, zeros appended) and output_padding added at the end."""

    def run(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        n = x.dim() - 2
        fn = _CONV_T.get(n)
        if fn is None:
            raise UnsupportedVariantError(f"ConvTranspose on a {n}-D spatial input: torch handles 1-D to 3-D")
        ks = _check_kernel_shape(self, w.shape[2:])
        strides = _ints(self, "strides", n, 1)
        dilations = _ints(self, "dilations", n, 1)
        out_pad = _ints(self, "output_padding", n, 0)
        in_shape = list(x.shape[2:])
        # the full result of the transposed convolution, before any padding is taken off
        full = [(in_shape[i] - 1) * strides[i] + (ks[i] - 1) * dilations[i] + 1 for i in range(n)]
        output_shape = self.attr("output_shape")
        if output_shape is not None:
            output_shape = [int(v) for v in output_shape][-n:]
        elif self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            output_shape = [in_shape[i] * strides[i] for i in range(n)]
        pads: Pads
        if output_shape is not None:
            # The spec: total_padding = full + output_padding - output_shape, the odd one at the end for
            # SAME_UPPER and at the beginning otherwise (as onnx.reference does).
            pads = []
            for i in range(n):
                total = full[i] + out_pad[i] - output_shape[i]
                if total < 0:
                    # an output_shape beyond the full result: zeros (then the bias) at the end, as onnxruntime
                    pads.append((0, total))
                    continue
                small = total // 2
                pads.append((small, total - small) if self.auto_pad == "SAME_UPPER" else (total - small, small))
        elif self.auto_pad == "VALID":
            pads = [(0, 0)] * n
        else:
            pads = spatial_pads("NOTSET", self.attr("pads"), in_shape, ks, strides, dilations)
        ct = compute_type(x)
        y = fn(x.to(ct), w.to(ct), None, list(strides), 0, 0, self.group, list(dilations))
        # crop pads[begin] and keep `out` values: F.pad crops where negative and appends zeros where positive
        crop: Pads = []
        for i in range(n):
            out = full[i] + out_pad[i] - pads[i][0] - pads[i][1]
            if out <= 0:
                raise ValueError(
                    f"ConvTranspose output would have size {out} along spatial axis {i}: check pads/output_shape"
                )
            crop.append((-pads[i][0], out + pads[i][0] - full[i]))
        y = F.pad(y, torch_pad(crop))
        if b is not None:
            y = y + b.to(ct).reshape(1, -1, *([1] * n))
        return (y.to(x.dtype),)


def _integer_conv(
    k: _ConvAttrs,
    x: torch.Tensor,
    x_zp: torch.Tensor | None,
    w: torch.Tensor,
    w_zp: torch.Tensor | None,
) -> torch.Tensor:
    """sum((x - x_zp) * (w - w_zp)) exactly, as a float64 tensor of integers.

    torch has no integer convolution on CPU, so the sum runs in float64: every (x - x_zp) and
    (w - w_zp) of 8-bit types lies in [-255, 255], a product is at most 255² = 65,025 < 2^16 in magnitude,
    and a sum of K = C_in/group * prod(kernel) products is at most K * 2^16: it stays an exactly
    representable integer (float64 has 53 mantissa bits) for K < 2^37 ≈ 1.4e11 terms, and every partial sum
    is an integer of the same bound, so no rounding ever happens. Padding is zero after the zero point is
    subtracted, i.e. X is padded with its zero point, as onnxruntime does.
    """
    if x.dtype not in (torch.int8, torch.uint8) or w.dtype not in (torch.int8, torch.uint8):
        raise UnsupportedVariantError(f"{k.op_type} with X of {x.dtype} and W of {w.dtype}: int8/uint8 only")
    n = x.dim() - 2
    xd = x.to(torch.float64)
    if x_zp is not None:
        if x_zp.numel() != 1:
            raise UnsupportedVariantError(f"{k.op_type} with a per-channel x_zero_point: the spec's is a scalar")
        xd = xd - x_zp.to(torch.float64).reshape(())
    wd = w.to(torch.float64)
    if w_zp is not None:
        wd = wd - (w_zp.to(torch.float64).reshape(-1, *([1] * (n + 1))) if w_zp.numel() > 1
                   else w_zp.to(torch.float64).reshape(()))
    strides, pads, dilations = k.geometry(x, w)
    return _conv(xd, wd, None, strides, pads, dilations, k.group, k.op_type)


@kernel("ConvInteger", since=10)
class ConvInteger(_ConvAttrs):
    """int32 Y = conv(X - x_zero_point, W - w_zero_point), w_zero_point per tensor or per output channel."""

    def run(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        x_zp: torch.Tensor | None = None,
        w_zp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        return (_integer_conv(self, x, x_zp, w, w_zp).to(torch.int32),)


@kernel("QLinearConv", since=10)
class QLinearConv(_ConvAttrs):
    """The integer convolution (exact) plus the int32 bias, requantized as onnxruntime's MLAS does: in
    float32, acc * (x_scale * w_scale / y_scale) clamped to the zero point's range, rounded half to even."""

    def run(
        self,
        x: torch.Tensor,
        x_scale: torch.Tensor,
        x_zp: torch.Tensor,
        w: torch.Tensor,
        w_scale: torch.Tensor,
        w_zp: torch.Tensor,
        y_scale: torch.Tensor,
        y_zp: torch.Tensor,
        b: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        acc = _integer_conv(self, x, x_zp, w, w_zp)
        n = x.dim() - 2
        if b is not None:
            acc = acc + b.to(torch.float64).reshape(1, -1, *([1] * n))
        # onnxruntime converts the int32 accumulator to float32 and multiplies by one float32 scale per
        # output channel, computed as (x_scale * w_scale) / y_scale in float32: the same order here.
        f32 = torch.float32
        scale = (x_scale.to(f32).reshape(()) * w_scale.to(f32).reshape(-1)) / y_scale.to(f32).reshape(())
        value = acc.to(f32) * scale.reshape(1, -1, *([1] * n))
        info = torch.iinfo(y_zp.dtype)
        zp = y_zp.to(f32).reshape(())
        value = torch.clamp(value, info.min - zp, info.max - zp)
        return ((torch.round(value) + zp).to(y_zp.dtype),)


def _bilinear_zero(
    x: torch.Tensor, h: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """x (N, G, Cg, H, W) sampled at (h, w) of shape (N, G, P): bilinear, each corner outside the image
    contributing zero (grid_sample's align_corners=True, padding zeros), as (N, G, Cg, P)."""
    size_h, size_w = x.shape[-2:]
    flat = x.reshape(*x.shape[:3], size_h * size_w)
    h0 = torch.floor(h)
    w0 = torch.floor(w)
    lh = h - h0
    lw = w - w0
    out = torch.zeros(*x.shape[:3], h.shape[-1], dtype=x.dtype, device=x.device)
    for dh, wh in ((0, 1 - lh), (1, lh)):
        for dw, ww in ((0, 1 - lw), (1, lw)):
            hh = h0 + dh
            wi = w0 + dw
            inside = (hh >= 0) & (hh < size_h) & (wi >= 0) & (wi < size_w)
            idx = (hh.clamp(0, size_h - 1) * size_w + wi.clamp(0, size_w - 1)).long()
            val = torch.gather(flat, 3, idx.unsqueeze(2).expand(-1, -1, x.shape[2], -1))
            out = out + val * (wh * ww * inside).unsqueeze(2)
    return out


@kernel("DeformConv", since=19)
class DeformConv(_ConvAttrs):
    """2-D deformable convolution: each kernel tap sampled bilinearly at its offset position (zero outside
    the image), times the optional mask, then a grouped matrix product with W."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.offset_group = int(self.attr("offset_group", 1))

    def run(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        offset: torch.Tensor,
        b: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if x.dim() != 4:
            raise UnsupportedVariantError(f"DeformConv on a {x.dim() - 2}-D spatial input: 2-D only")
        ct = compute_type(x)
        xc, wc, oc = x.to(ct), w.to(ct), offset.to(ct)
        n, c, _, _ = x.shape
        m = w.shape[0]
        kh, kw = _check_kernel_shape(self, w.shape[2:])
        strides = _ints(self, "strides", 2, 1)
        dil = _ints(self, "dilations", 2, 1)
        pads = spatial_pads("NOTSET", self.attr("pads"), x.shape[2:], [kh, kw], strides, dil)
        oh, ow = offset.shape[-2:]
        g, og, kk = self.group, self.offset_group, kh * kw
        if c % og or c != w.shape[1] * g or offset.shape[1] != og * kk * 2:
            raise ValueError(
                f"DeformConv shapes disagree: X {tuple(x.shape)}, W {tuple(w.shape)}, offset "
                f"{tuple(offset.shape)}, group={g}, offset_group={og}"
            )
        dev = x.device
        ki = torch.arange(kh, device=dev, dtype=ct).repeat_interleave(kw) * dil[0]
        kj = torch.arange(kw, device=dev, dtype=ct).repeat(kh) * dil[1]
        base_h = torch.arange(oh, device=dev, dtype=ct) * strides[0] - pads[0][0]
        base_w = torch.arange(ow, device=dev, dtype=ct) * strides[1] - pads[1][0]
        off = oc.reshape(n, og, kk, 2, oh, ow)
        # sampling positions (N, og, kk, oh, ow)
        ph = ki.reshape(1, 1, kk, 1, 1) + base_h.reshape(1, 1, 1, oh, 1) + off[:, :, :, 0]
        pw = kj.reshape(1, 1, kk, 1, 1) + base_w.reshape(1, 1, 1, 1, ow) + off[:, :, :, 1]
        cols = _bilinear_zero(
            xc.reshape(n, og, c // og, *x.shape[2:]), ph.reshape(n, og, -1), pw.reshape(n, og, -1)
        ).reshape(n, og, c // og, kk, oh * ow)
        if mask is not None:
            cols = cols * mask.to(ct).reshape(n, og, 1, kk, oh * ow)
        # (N, C, kk, L) -> (N, g, C/g * kk, L) against W as (g, M/g, C/g * kk)
        cols = cols.reshape(n, g, (c // g) * kk, oh * ow)
        y = torch.matmul(wc.reshape(g, m // g, (c // g) * kk), cols).reshape(n, m, oh, ow)
        if b is not None:
            y = y + b.to(ct).reshape(1, -1, 1, 1)
        return (y.to(x.dtype),)


@kernel("Col2Im", since=18)
class Col2Im(Kernel):
    """The inverse of im2col for N spatial axes: each column's block added back where it came from
    (index_add over the padded image), then the pads cropped."""

    def run(
        self, x: torch.Tensor, image_shape: torch.Tensor, block_shape: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        image = [int(v) for v in image_shape.tolist()]
        block = [int(v) for v in block_shape.tolist()]
        nd = len(image)
        strides = _ints(self, "strides", nd, 1)
        dil = _ints(self, "dilations", nd, 1)
        pads = spatial_pads("NOTSET", self.attr("pads"), image, block, strides, dil)
        padded = [image[i] + pads[i][0] + pads[i][1] for i in range(nd)]
        counts = [(padded[i] - ((block[i] - 1) * dil[i] + 1)) // strides[i] + 1 for i in range(nd)]
        nb, nl = math.prod(block), math.prod(counts)
        n = x.shape[0]
        if x.shape[1] % nb or x.shape[2] != nl:
            raise ValueError(
                f"Col2Im input of shape {tuple(x.shape)} does not match block_shape {block} and "
                f"{counts} sliding positions (expected (N, C*{nb}, {nl}))"
            )
        c = x.shape[1] // nb
        dev = x.device
        # linear index in the padded image of (block offset b, sliding position l): shape (nb, nl)
        idx = torch.zeros(nb, nl, dtype=torch.long, device=dev)
        bgrid = torch.meshgrid(*[torch.arange(s, device=dev) for s in block], indexing="ij")
        lgrid = torch.meshgrid(*[torch.arange(s, device=dev) for s in counts], indexing="ij")
        for i in range(nd):
            coord = bgrid[i].reshape(-1, 1) * dil[i] + lgrid[i].reshape(1, -1) * strides[i]
            idx = idx * padded[i] + coord
        out = torch.zeros(n, c, math.prod(padded), dtype=x.dtype, device=dev)
        out.index_add_(2, idx.reshape(-1), x.reshape(n, c, nb * nl))
        out = out.reshape(n, c, *padded)
        return (F.pad(out, torch_pad([(-a, -e) for a, e in pads])),)


@kernel("CausalConvWithState", since=27)
class CausalConvWithState(Kernel):
    """Depthwise causal conv1d over [past_state (zeros by default), input], optional SiLU; present_state is
    the last k-1 positions of that concatenation (what the next decode step needs)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.activation = str(self.attr("activation", "none"))
        if self.activation not in ("none", "silu", "swish"):
            raise UnsupportedVariantError(
                f"CausalConvWithState activation={self.activation!r}: expected 'none', 'silu' or 'swish'"
            )

    def run(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        b: torch.Tensor | None = None,
        past: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if x.dim() != 3 or w.dim() != 3:
            raise ValueError(
                f"CausalConvWithState needs rank-3 input and weight, got {tuple(x.shape)} and {tuple(w.shape)}"
            )
        nb, c, _ = x.shape
        k = w.shape[2]
        if past is None:
            past = torch.zeros(nb, c, k - 1, dtype=x.dtype, device=x.device)
        padded = torch.cat([past, x], dim=2)
        ct = compute_type(x)
        y = F.conv1d(padded.to(ct), w.to(ct), None if b is None else b.to(ct), groups=c)
        # the reference casts the convolution to the input type before the activation, which it then
        # computes in float32
        y = y.to(x.dtype)
        if self.activation != "none":
            yf = y.to(torch.promote_types(y.dtype, torch.float32))
            y = (yf * torch.sigmoid(yf)).to(x.dtype)
        return (y, padded[:, :, padded.shape[2] - (k - 1):])
