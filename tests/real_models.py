"""Small `torch.nn.Module`s mirroring real architectures, their inputs, their ONNX exports by both torch
exporters, and their quantization by onnxruntime.

Structurally faithful (the ops and wiring the real models export to) but a few thousand parameters each, so
that every export, float32 and float16, takes about a second.
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MODELS",
    "ControlFlowCond",
    "ControlFlowLoop",
    "ConvNeXtBlock",
    "GRUModel",
    "LSTMModel",
    "MambaCausalConv",
    "ModelSpec",
    "PoolNormMix",
    "ResNetBasicBlock",
    "UNetBlock",
    "ViTEncoder",
    "WhisperFrontEnd",
    "export",
    "quantize",
]


# -- vision ---------------------------------------------------------------------------------------


class ResNetBasicBlock(nn.Module):
    """torchvision's BasicBlock with a strided 1×1 downsample branch, then a second (identity) block."""

    def __init__(self, cin: int = 4, cout: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class ViTEncoder(nn.Module):
    """ViT: patch embedding (Conv2d, stride = patch), class token, learned positions, one pre-norm encoder
    layer (hand-written multi-head attention as in HF's ViTSelfAttention, GELU MLP), final LayerNorm."""

    def __init__(self, channels: int = 3, patch: int = 4, image: int = 16, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.patch_embed = nn.Conv2d(channels, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.5)
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        y = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return self.norm(x)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt: depthwise 7×7 conv, channels-first LayerNorm (mean/var over dim 1, as ConvNeXt's
    `LayerNorm(data_format="channels_first")`), pointwise MLP as Linear after permute, layer scale, residual."""

    def __init__(self, dim: int = 8, eps: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.ln_weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.ln_bias = nn.Parameter(0.1 * torch.randn(dim))
        self.eps = eps
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        # real checkpoints start at 1e-6 and train up; a visible scale keeps the branch in the output
        self.gamma = nn.Parameter(0.5 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x)
        u = y.mean(1, keepdim=True)
        s = (y - u).pow(2).mean(1, keepdim=True)
        y = (y - u) / torch.sqrt(s + self.eps)
        y = self.ln_weight[:, None, None] * y + self.ln_bias[:, None, None]
        y = y.permute(0, 2, 3, 1)  # (N, C, H, W) -> (N, H, W, C)
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(y)))
        return x + y.permute(0, 3, 1, 2)


class UNetBlock(nn.Module):
    """A UNet level: MaxPool down, conv, then four ways up — ConvTranspose2d and Resize (nearest, bilinear
    with align_corners False and True) — concatenated with the skip connection and fused by a conv."""

    def __init__(self, cin: int = 3, c: int = 4) -> None:
        super().__init__()
        self.inc = nn.Conv2d(cin, c, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.down = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.reduce = nn.Conv2d(2 * c, c, 1)
        self.out = nn.Conv2d(5 * c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = F.relu(self.inc(x))
        d = F.relu(self.down(self.pool(skip)))
        r = self.reduce(d)
        size = skip.shape[-2:]
        ups = [
            self.up(d),
            self.upsample(r),
            F.interpolate(r, size=size, mode="bilinear", align_corners=False),
            F.interpolate(r, size=size, mode="bilinear", align_corners=True),
        ]
        return self.out(torch.cat([skip, *ups], dim=1))


class PoolNormMix(nn.Module):
    """The pooling and normalization layers of CNN backbones: AvgPool2d (count_include_pad=False,
    ceil_mode), GroupNorm, InstanceNorm, and AdaptiveAvgPool2d(1) (GlobalAveragePool) into a classifier."""

    def __init__(self, c: int = 8, classes: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)
        self.gn = nn.GroupNorm(2, c)
        self.inorm = nn.InstanceNorm2d(c, affine=True)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.gn(self.conv(x)))
        y = self.inorm(self.avg(y))
        return self.fc(self.gap(y).flatten(1))


# -- audio and sequence ---------------------------------------------------------------------------


def _sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's `sinusoids()`: sin on the first half of the channels, cos on the second."""
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2, dtype=torch.float32))
    t = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class WhisperFrontEnd(nn.Module):
    """Whisper's audio encoder stem: Conv1d + GELU, Conv1d stride 2 + GELU, transpose, sinusoidal positions."""

    def __init__(self, mels: int = 8, dim: int = 16, frames: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.register_buffer("positional_embedding", _sinusoids(frames // 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        positions = self.positional_embedding
        assert isinstance(positions, torch.Tensor)
        return x + positions


class MambaCausalConv(nn.Module):
    """Mamba's mixer front: in_proj to (x, z), causal depthwise Conv1d (groups = channels, padding k-1,
    sliced back to the sequence length), SiLU, gated by SiLU(z), out_proj."""

    def __init__(self, dim: int = 8, expand: int = 2, kernel: int = 4) -> None:
        super().__init__()
        inner = expand * dim
        self.in_proj = nn.Linear(dim, 2 * inner, bias=False)
        self.conv1d = nn.Conv1d(inner, inner, kernel, groups=inner, padding=kernel - 1)
        self.out_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        seq = hidden.shape[1]
        x, z = self.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)
        x = F.silu(self.conv1d(x)[..., :seq])
        return self.out_proj((x * F.silu(z)).transpose(1, 2))


class LSTMModel(nn.Module):
    """A 2-layer bidirectional batch-first LSTM tagger (Linear head on every step)."""

    def __init__(self, features: int = 8, hidden: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        return self.head(y)


class GRUModel(nn.Module):
    """A single-layer batch-first GRU encoder returning its outputs and final state."""

    def __init__(self, features: int = 8, hidden: int = 12) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h = self.gru(x)
        return y, h


# -- data-dependent control flow ------------------------------------------------------------------


class ControlFlowCond(nn.Module):
    """A branch on the data (`torch.cond` → ONNX If): a linear layer, then one of two different functions,
    chosen by the sign of the input's sum (so that x and -x take both branches)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)

        def positive(h: torch.Tensor) -> torch.Tensor:
            return torch.tanh(h) * 2.0 + h

        def negative(h: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(h) - h * 0.5

        out: torch.Tensor = torch.cond(x.sum() > 0, positive, negative, (h,))
        return out


class ControlFlowLoop(nn.Module):
    """A data-dependent Python loop (trip count from the input's values, a branch inside), meant for
    `torch.jit.script` + the TorchScript exporter (→ ONNX Loop with an If in its body)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(int(steps)):
            h = torch.tanh(self.fc(h))
            if i % 2 == 1:
                h = h * 0.5 + x
        return h


# -- the catalogue --------------------------------------------------------------------------------


def _randn(*shape: int) -> Callable[[torch.dtype], tuple[torch.Tensor, ...]]:
    def make(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(0)
        return (torch.randn(*shape, generator=g).to(dtype),)

    return make


def _loop_inputs(dtype: torch.dtype, steps: int = 5) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, generator=g).to(dtype), torch.tensor(steps, dtype=torch.int64)


def _other_branch(dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    (x,) = _randn(2, 8)(dtype)
    return [(-x,)]


def _other_trip_counts(dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    return [_loop_inputs(dtype, 0), _loop_inputs(dtype, 1)]


@dataclass(frozen=True)
class ModelSpec:
    """One module of the catalogue: how to build it, its inputs, and what each exporter can do with it."""

    build: Callable[[], nn.Module]
    inputs: Callable[[torch.dtype], tuple[torch.Tensor, ...]]  # the export's example inputs
    exporters: tuple[str, ...] = ("dynamo", "torchscript")
    script: bool = False  # torch.jit.script before the TorchScript exporter (keeps Python control flow)
    export_kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)  # per exporter
    #: further inputs for the exported graph that take other paths through it (the other branch, other
    #: trip counts): an export traced on one input must still compute the module's function on these
    more_inputs: Callable[[torch.dtype], list[tuple[torch.Tensor, ...]]] | None = None

    def all_inputs(self, dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
        return [self.inputs(dtype), *(self.more_inputs(dtype) if self.more_inputs else [])]

    def module(self, dtype: torch.dtype = torch.float32) -> nn.Module:
        torch.manual_seed(0)
        m = self.build().eval()
        _perturb_batch_norm(m)
        return m.to(dtype)


def _perturb_batch_norm(m: nn.Module) -> None:
    """Running statistics and affine parameters away from their (0, 1) defaults, as a trained model's are,
    so that a BatchNormalization kernel that ignored them would be caught."""
    g = torch.Generator().manual_seed(1)
    for bn in m.modules():
        if isinstance(bn, nn.BatchNorm2d):
            with torch.no_grad():
                c = bn.num_features
                assert bn.running_mean is not None and bn.running_var is not None
                bn.running_mean.copy_(0.2 * torch.randn(c, generator=g))
                bn.running_var.copy_(0.5 + torch.rand(c, generator=g))
                bn.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
                bn.bias.copy_(0.2 * torch.randn(c, generator=g))


#: name -> spec. Which exporter handles which module, and why a pair is absent:
#: - resnet_folded / resnet_unfolded: one module, exported as users get it by default (both exporters fold
#:   each eval-mode BatchNorm into its Conv: TorchScript's eval peephole with `do_constant_folding=True`,
#:   dynamo's onnxscript optimizer) and with the BatchNormalization nodes kept (TorchScript with
#:   `training=PRESERVE` skips the eval peephole; dynamo with `optimize=False`).
#: - control_cond: `torch.cond` is a higher-order op only torch.export understands; the TorchScript
#:   exporter cannot trace or script it, so it is exported with dynamo only (→ If).
#: - control_loop: a Python loop with a data-dependent trip count survives only `torch.jit.script`; the
#:   dynamo exporter refuses ScriptModules and would bake `int(steps)` into the trace (or fail on it as a
#:   data-dependent guard), so it is exported with TorchScript only (→ Loop).
MODELS: dict[str, ModelSpec] = {
    "resnet_folded": ModelSpec(ResNetBasicBlock, _randn(1, 4, 16, 16)),
    "resnet_unfolded": ModelSpec(
        ResNetBasicBlock,
        _randn(1, 4, 16, 16),
        export_kwargs={"dynamo": {"optimize": False}, "torchscript": {"training": torch.onnx.TrainingMode.PRESERVE}},
    ),
    "vit": ModelSpec(ViTEncoder, _randn(1, 3, 16, 16)),
    "convnext": ModelSpec(ConvNeXtBlock, _randn(1, 8, 14, 14)),
    "unet": ModelSpec(UNetBlock, _randn(1, 3, 16, 16)),
    "pool_norm": ModelSpec(PoolNormMix, _randn(1, 3, 15, 15)),
    "whisper": ModelSpec(WhisperFrontEnd, _randn(1, 8, 32)),
    "mamba": ModelSpec(MambaCausalConv, _randn(1, 12, 8)),
    "lstm": ModelSpec(LSTMModel, _randn(2, 6, 8)),
    "gru": ModelSpec(GRUModel, _randn(2, 6, 8)),
    "control_cond": ModelSpec(ControlFlowCond, _randn(2, 8), exporters=("dynamo",), more_inputs=_other_branch),
    "control_loop": ModelSpec(
        ControlFlowLoop, _loop_inputs, exporters=("torchscript",), script=True, more_inputs=_other_trip_counts
    ),
}


def export(name: str, exporter: str, dtype: torch.dtype = torch.float32) -> onnx.ModelProto:
    """`MODELS[name]` in `dtype`, exported by "dynamo" (`torch.onnx.export(dynamo=True)`, its default opset)
    or "torchscript" (`dynamo=False`, opset 18), as an in-memory model."""
    spec = MODELS[name]
    if exporter not in spec.exporters:
        raise ValueError(f"{name} is not exported with {exporter}; it is with {', '.join(spec.exporters)}")
    module: Any = spec.module(dtype)
    args = spec.inputs(dtype)
    extra = spec.export_kwargs.get(exporter, {})
    with warnings.catch_warnings(), _torchlib_registry_built_once():
        # both exporters warn about their own internals (tracer, deprecations); none is about the model
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            with contextlib.redirect_stdout(io.StringIO()):  # its progress lines, even with verbose=False
                program = torch.onnx.export(module, args, dynamo=True, verbose=False, **extra)
            assert program is not None
            return program.model_proto
        if spec.script:
            module = torch.jit.script(module)
        buf = io.BytesIO()  # the TorchScript exporter writes to file-like objects too
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=18, **extra)  # type: ignore[arg-type]
    return onnx.load_from_string(buf.getvalue())


_REGISTRIES: dict[tuple[Any, ...], Any] = {}


@contextlib.contextmanager
def _torchlib_registry_built_once() -> Iterator[None]:
    """The dynamo exporter rebuilds its registry of torchlib functions on every call (about 1 s of CPU, half
    of a small model's export); it is the same for every export here, so build it once per opset. A torch
    whose exporter is laid out differently just exports at full cost."""
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        yield
        return
    registry_class: Any = getattr(_registration, "ONNXRegistry", None)
    original = getattr(registry_class, "from_torchlib", None)
    if original is None:
        yield
        return

    def built_once(cls: Any, *args: Any, **kwargs: Any) -> Any:
        key = (cls, *args, *sorted(kwargs.items()))
        if key not in _REGISTRIES:
            _REGISTRIES[key] = original(*args, **kwargs)
        return _REGISTRIES[key]

    with mock.patch.object(registry_class, "from_torchlib", classmethod(built_once)):
        yield


# -- quantization ---------------------------------------------------------------------------------


class _CalibrationReader:
    """A few random batches, the data `quantize_static` calibrates activation ranges on."""

    def __init__(self, input_name: str, shape: tuple[int, ...], batches: int = 4) -> None:
        g = torch.Generator().manual_seed(7)
        self._feeds: Iterator[dict[str, np.ndarray]] = iter(
            [{input_name: torch.randn(*shape, generator=g).numpy()} for _ in range(batches)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)

    def rewind(self) -> None:  # part of the CalibrationDataReader interface; one pass is enough here
        pass


def quantize(model: onnx.ModelProto, method: str) -> onnx.ModelProto:
    """A float32 `model` quantized by onnxruntime.quantization: "static" (`quantize_static`, QDQ format,
    int8 activations and weights, calibrated on random batches) or "dynamic" (`quantize_dynamic`:
    DynamicQuantizeLinear + MatMulInteger/ConvInteger)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src, pre, dst = Path(tmp, "model.onnx"), Path(tmp, "pre.onnx"), Path(tmp, "quant.onnx")
        onnx.save(model, src)
        # the pre-processing onnxruntime's docs ask for: shape inference and graph clean-up
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        if method == "static":
            x = model.graph.input[0]
            shape = tuple(d.dim_value for d in x.type.tensor_type.shape.dim)
            reader: Any = _CalibrationReader(x.name, shape)
            quantize_static(
                pre, dst, reader, quant_format=QuantFormat.QDQ,
                activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
            )
        elif method == "dynamic":
            quantize_dynamic(pre, dst, weight_type=QuantType.QUInt8)
        else:
            raise ValueError(f"method must be 'static' or 'dynamic', not {method!r}")
        return onnx.load(dst)
