"""Torch kernels for onnxruntime's layout contrib ops: the NCHWc ops (com.microsoft.nchwc) of a model saved at ORT_ENABLE_ALL.

onnxruntime's NCHWc transformer (x86 with AVX2 or AVX-512) rewrites convolutions and pools to work on
channels in blocks of 8 or 16: a tensor between ReorderInput and ReorderOutput declares the shape
(N, C padded to a multiple of the block, H, W) and holds its values blocked in memory. These kernels hold
such a tensor as a plain NCHW tensor of the padded channel count: every op the transformer leaves between
the reorders (element-wise ops, Concat on the channels, the NCHWc ops) means the same on either. Only the
weights the transformer reordered are read in their blocked layout.
"""

from __future__ import annotations

import functools

import onnx
import torch
import torch.nn.functional as F

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel
from ..nn.conv import Conv as OnnxConv
from ..nn.pool import AveragePool as OnnxAveragePool
from ..nn.pool import GlobalAveragePool as OnnxGlobalAveragePool
from ..nn.pool import GlobalMaxPool as OnnxGlobalMaxPool
from ..nn.pool import MaxPool as OnnxMaxPool

__all__ = [
    "NCHWC",
    "NchwcAveragePool",
    "NchwcConv",
    "NchwcGlobalAveragePool",
    "NchwcGlobalMaxPool",
    "NchwcMaxPool",
    "NchwcUpsample",
    "ReorderInput",
    "ReorderOutput",
    "nchwc_block_size",
    "reorder_filter",
]

#: the domain of onnxruntime's NCHWc ops
NCHWC = "com.microsoft.nchwc"


@functools.cache
def nchwc_block_size() -> int:
    """The channel block onnxruntime's NCHWc transformer uses on this machine (MLAS's: 16 with AVX-512, 8
    with AVX2), read off a probe model it optimizes: a convolution to 24 channels, padded to the block."""
    import os
    import tempfile

    import numpy as np
    import onnx.helper as oh
    import onnx.numpy_helper as nh

    try:
        import onnxruntime
    except ImportError:  # pragma: no cover (onnxruntime is how such a model came to be)
        raise UnsupportedVariantError(
            "NCHWc ops: their channel block is onnxruntime's choice for the CPU it runs on; install onnxruntime to read it"
        ) from None
    p = onnx.TensorProto.FLOAT
    graph = oh.make_graph(
        [oh.make_node("Conv", ["x", "w0"], ["h"]), oh.make_node("Conv", ["h", "w1"], ["y"])], "probe",
        [oh.make_tensor_value_info("x", p, [1, 4, 4, 4])], [oh.make_tensor_value_info("y", p, [1, 24, 4, 4])],
        [nh.from_array(np.ones((32, 4, 1, 1), np.float32), "w0"), nh.from_array(np.ones((24, 32, 1, 1), np.float32), "w1")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=10)  # (onnxruntime 1.31 reads IR <= 13)
    with tempfile.TemporaryDirectory() as tmp:
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = os.path.join(tmp, "probe.onnx")
        so.log_severity_level = 3  # (its warning that such a model is for this machine only)
        onnxruntime.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath)
    padded = [int(i.dims[0]) for i in optimized.graph.initializer if len(i.dims) == 4 and i.dims[1] == 32]
    if not padded or padded[0] == 24:
        raise UnsupportedVariantError(
            "NCHWc ops: onnxruntime does not use the NCHWc layout on this CPU (no AVX2), so the model was saved "
            "elsewhere and its weights' channel block is unknown here"
        )
    return 16 if padded[0] == 32 else 8


def reorder_filter(w: torch.Tensor, block: int, nchw_input: bool) -> torch.Tensor:
    """OIHW weights (O a multiple of `block`; I too unless `nchw_input`, or a depthwise filter's 1) in the
    layout onnxruntime's transformer writes: O/Bo, I/Bi, H, W, Bi, Bo blocks, or O/Bo, I, H, W, Bo for a
    filter reading a plain NCHW input or a depthwise one; the shape stays (O, I, H, W)."""
    o, i, kh, kw = w.shape
    if nchw_input or i == 1:
        return w.reshape(o // block, block, i, kh, kw).permute(0, 2, 3, 4, 1).reshape(o, i, kh, kw).contiguous()
    return w.reshape(o // block, block, i // block, block, kh, kw).permute(0, 2, 4, 5, 3, 1).reshape(o, i, kh, kw).contiguous()


def _unreorder_filter(w: torch.Tensor, block: int, nchw_input: bool) -> torch.Tensor:
    """`reorder_filter`'s inverse: the OIHW weights."""
    o, i, kh, kw = w.shape
    if nchw_input or i == 1:
        return w.reshape(o // block, i, kh, kw, block).permute(0, 4, 1, 2, 3).reshape(o, i, kh, kw)
    return w.reshape(o // block, i // block, kh, kw, block, block).permute(0, 5, 1, 4, 2, 3).reshape(o, i, kh, kw)


def _channels_padded(c: int, block: int) -> int:
    return -(-c // block) * block


def _check_blocked(op: str, x: torch.Tensor, block: int) -> None:
    if x.dim() != 4 or x.shape[1] % block:
        raise ValueError(
            f"NCHWc {op} takes a 4-D tensor whose channels are a multiple of the block ({block} on this "
            f"machine); got {tuple(x.shape)}: was the model saved by onnxruntime on a CPU with another block "
            "(8 with AVX2, 16 with AVX-512)? Optimize it here again, or save it at ORT_ENABLE_EXTENDED"
        )


@kernel("ReorderInput", since=1, domain=NCHWC)
class ReorderInput(Kernel):
    """NCHW (or NHWC with channels_last) to the blocked layout: channels padded with zeros to the block."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.channels_last = bool(self.attr("channels_last", 0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() != 4:
            raise ValueError(f"ReorderInput takes a 4-D tensor; got {tuple(x.shape)}")
        if self.channels_last:
            x = x.movedim(-1, 1)
        c = x.shape[1]
        pad = _channels_padded(c, nchwc_block_size()) - c
        return (F.pad(x, (0, 0, 0, 0, 0, pad)) if pad else x.contiguous(),)


@kernel("ReorderOutput", since=1, domain=NCHWC)
class ReorderOutput(Kernel):
    """The blocked layout back to NCHW (or NHWC with channels_last), its first `channels` channels."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.channels_last = bool(self.attr("channels_last", 0))
        self.channels = int(self.attr("channels", 0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        block = nchwc_block_size()
        _check_blocked("ReorderOutput", x, block)
        if not 0 <= x.shape[1] - self.channels < block:
            raise ValueError(f"ReorderOutput channels={self.channels} for a blocked tensor of {x.shape[1]} channels (block {block})")
        y = x[:, : self.channels]
        return ((y.movedim(1, -1) if self.channels_last else y).contiguous(),)


_ACTIVATIONS = ("", "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid")


@kernel("Conv", since=1, domain=NCHWC)
class NchwcConv(Kernel):
    """Conv (ONNX's attributes) with onnxruntime's fusions: Y = activation(conv(X, W) + B + Sum), the
    activation one of Relu, Sigmoid, Tanh, LeakyRelu (activation_params: alpha), Clip (min, max) and
    HardSigmoid (alpha, beta). X is blocked, or a plain NCHW tensor of fewer channels than the block (the
    first layer); W is in the transformer's blocked layout (see `reorder_filter`)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.conv = OnnxConv(node, ctx)  # (ONNX's Conv reads the attributes they share)
        self.activation = str(self.attr("activation", ""))
        if self.activation not in _ACTIVATIONS:
            raise UnsupportedVariantError(f"NCHWc Conv activation={self.activation!r}: onnxruntime fuses {', '.join(a for a in _ACTIVATIONS if a)}")
        self.params = [float(v) for v in self.attr("activation_params", [])]

    def run(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, total: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        block = nchwc_block_size()
        nchw_input = x.dim() == 4 and x.shape[1] < block
        if not nchw_input:
            _check_blocked("Conv", x, block)
        if w.dim() != 4 or w.shape[0] % block or (not nchw_input and w.shape[1] != 1 and w.shape[1] % block):
            raise ValueError(f"NCHWc Conv weights {tuple(w.shape)} are not in blocks of {block} (the block of this machine's onnxruntime)")
        (y,) = self.conv.run(x, _unreorder_filter(w, block, nchw_input), b)
        if total is not None:
            y = y + total.to(y.dtype)
        return (self._activate(y),)

    def _activate(self, y: torch.Tensor) -> torch.Tensor:
        act, p = self.activation, self.params
        if act == "Relu":
            return torch.relu(y)
        if act == "Sigmoid":
            return torch.sigmoid(y)
        if act == "Tanh":
            return torch.tanh(y)
        if act == "LeakyRelu":
            return F.leaky_relu(y, p[0] if p else 0.01)
        if act == "Clip":
            return y.clamp(p[0], p[1]) if len(p) == 2 else y
        if act == "HardSigmoid":
            alpha, beta = (p + [0.2, 0.5][len(p):])[:2]
            return (y * alpha + beta).clamp(0.0, 1.0)
        return y


class _BlockedPool(Kernel):
    """An NCHWc pool: ONNX's pool of the same attributes on the blocked tensor (channels never mix)."""

    onnx_pool: type[Kernel]

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.pool = self.onnx_pool(node, ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _check_blocked(self.op_type, x, nchwc_block_size())
        return (self.pool.run(x)[0],)


@kernel("MaxPool", since=1, domain=NCHWC)
class NchwcMaxPool(_BlockedPool):
    """ONNX's MaxPool (kernel_shape, strides, pads or auto_pad, dilations, ceil_mode) per channel."""

    onnx_pool = OnnxMaxPool


@kernel("AveragePool", since=1, domain=NCHWC)
class NchwcAveragePool(_BlockedPool):
    """ONNX's AveragePool (with count_include_pad) per channel."""

    onnx_pool = OnnxAveragePool


@kernel("GlobalMaxPool", since=1, domain=NCHWC)
class NchwcGlobalMaxPool(_BlockedPool):
    """The maximum over H and W per channel."""

    onnx_pool = OnnxGlobalMaxPool


@kernel("GlobalAveragePool", since=1, domain=NCHWC)
class NchwcGlobalAveragePool(_BlockedPool):
    """The mean over H and W per channel."""

    onnx_pool = OnnxGlobalAveragePool


@kernel("Upsample", since=1, domain=NCHWC)
class NchwcUpsample(Kernel):
    """Upsampling by integer `scales` (N and C at 1): nearest (each value repeated), or linear (bilinear over
    H and W) with the source position o / scale (asymmetric), (o + 0.5) / scale - 0.5 clamped at 0
    (half_pixel) or o * (in - 1) / (out - 1) (align_corners), the neighbour clamped to the last row/column."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.scales = [int(s) for s in self.attr("scales", [])]
        self.mode = str(self.attr("mode", "nearest"))
        self.transform = str(self.attr("coordinate_transformation_mode", "asymmetric"))
        if len(self.scales) != 4 or self.scales[:2] != [1, 1] or min(self.scales) < 1:
            raise ValueError(f"NCHWc Upsample scales={self.scales}: four integers, 1 for N and C")
        if self.mode not in ("nearest", "linear"):
            raise UnsupportedVariantError(f"NCHWc Upsample mode={self.mode!r}: nearest or linear")
        if self.transform not in ("asymmetric", "half_pixel", "align_corners"):
            raise UnsupportedVariantError(f"NCHWc Upsample coordinate_transformation_mode={self.transform!r}: asymmetric, half_pixel or align_corners")

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        _check_blocked("Upsample", x, nchwc_block_size())
        sh, sw = self.scales[2:]
        if self.mode == "nearest":
            return (x.repeat_interleave(sh, dim=2).repeat_interleave(sw, dim=3),)
        h0, h1, dh = self._source(x.shape[2], sh, x)
        w0, w1, dw = self._source(x.shape[3], sw, x)
        top = x[:, :, h0]
        bottom = x[:, :, h1]
        dh = dh.reshape(-1, 1)
        rows = top + (bottom - top) * dh  # (N, C, OH, W)
        left, right = rows[..., w0], rows[..., w1]
        return (left + (right - left) * dw,)

    def _source(self, length: int, scale: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per output index along an axis: the two source indices and the weight of the second."""
        out = length * scale
        o = torch.arange(out, dtype=torch.float32, device=x.device)
        if scale == 1:
            pos = o
        elif self.transform == "align_corners":
            pos = o * float(length - 1) / float(max(out - 1, 1))
        elif self.transform == "half_pixel":
            pos = ((o + 0.5) / float(scale) - 0.5).clamp(min=0.0)
        else:
            pos = o / float(scale)
        first = pos.floor().to(torch.int64).clamp(max=length - 1)
        second = (first + 1).clamp(max=length - 1)
        return first, second, (pos - first.to(torch.float32)).to(x.dtype)
