"""Signal kernels (ONNX's math family): DFT, STFT, MelWeightMatrix and the Hann, Hamming and Blackman windows.

Complex tensors are ONNX's: a trailing dimension of 2 (real, imaginary), or 1 for a real signal.
"""

from __future__ import annotations

import math

import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ['DFT', 'DFT20', 'STFT', 'BlackmanWindow', 'HammingWindow', 'HannWindow', 'MelWeightMatrix']


class _Window(Kernel):
    """A window of `size` points, computed in float64 and cast to `output_datatype` (default float)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.periodic = bool(self.attr("periodic", 1))
        self.dtype = ctx.torch_dtype(int(self.attr("output_datatype", onnx.TensorProto.FLOAT)))

    def run(self, size: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = int(size)
        period = n if self.periodic else n - 1
        phase = torch.arange(n, dtype=torch.float64, device=self.ctx.device) * (2 * math.pi / period)
        return (self.window(phase).to(self.dtype),)

    def window(self, phase: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@kernel("HannWindow", since=17)
class HannWindow(_Window):
    def window(self, phase: torch.Tensor) -> torch.Tensor:
        return 0.5 - 0.5 * torch.cos(phase)


@kernel("HammingWindow", since=17)
class HammingWindow(_Window):
    """alpha = 25/46 (not torch's 0.54), beta = 1 - alpha."""

    def window(self, phase: torch.Tensor) -> torch.Tensor:
        alpha = 25.0 / 46.0
        return alpha - (1.0 - alpha) * torch.cos(phase)


@kernel("BlackmanWindow", since=17)
class BlackmanWindow(_Window):
    def window(self, phase: torch.Tensor) -> torch.Tensor:
        return 0.42 - 0.5 * torch.cos(phase) + 0.08 * torch.cos(2 * phase)


_FFT_TYPES = (torch.float32, torch.float64)


def _as_complex(x: torch.Tensor, what: str) -> torch.Tensor:
    """[..., 1] real or [..., 2] (real, imaginary) -> a complex tensor [...] (float32 at least)."""
    wide = x if x.dtype in _FFT_TYPES else x.float()
    if x.shape[-1] == 1:
        return torch.complex(wide[..., 0], torch.zeros_like(wide[..., 0]))
    if x.shape[-1] == 2:
        return torch.view_as_complex(wide.contiguous())
    raise ValueError(f"{what}: the last dimension must be 1 (real) or 2 (complex); got {x.shape[-1]}")


def _dft(
    x: torch.Tensor, length: int | None, axis: int, inverse: bool, onesided: bool, op: str
) -> torch.Tensor:
    rank = x.dim()
    if not -rank <= axis < rank - 1 and not (axis < 0 and axis + rank < rank - 1):
        raise ValueError(f"{op}: axis {axis} is out of the signal dimensions of a rank-{rank} input")
    a = axis % rank
    if a == rank - 1:
        raise ValueError(f"{op}: axis {axis} names the complex dimension; it must be a signal dimension")
    n = length if length is not None else (2 * (x.shape[a] - 1) if inverse and onesided else x.shape[a])
    c = _as_complex(x, op)
    if inverse and onesided:
        # one-sided spectrum -> the full real signal of length n
        return torch.fft.irfft(c, n=n, dim=a).unsqueeze(-1).to(x.dtype)
    y = torch.fft.ifft(c, n=n, dim=a) if inverse else torch.fft.fft(c, n=n, dim=a)
    if onesided:
        y = y.narrow(a, 0, n // 2 + 1)
    return torch.view_as_real(y).to(x.dtype)


@kernel("DFT", since=17)
class DFT(Kernel):
    """Opset 17: `axis` (default 1) an attribute; optional `dft_length` input pads or truncates."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.axis = int(self.attr("axis", 1))
        self.inverse = bool(self.attr("inverse", 0))
        self.onesided = bool(self.attr("onesided", 0))

    def run(self, x: torch.Tensor, dft_length: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        n = None if dft_length is None else int(dft_length)
        return (_dft(x, n, self.axis, self.inverse, self.onesided, "DFT"),)


@kernel("DFT", since=20)
class DFT20(DFT):
    """Opset 20: `axis` an optional input (default -2, the last signal dimension)."""

    def run(
        self,
        x: torch.Tensor,
        dft_length: torch.Tensor | None = None,
        axis: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        n = None if dft_length is None else int(dft_length)
        a = -2 if axis is None else int(axis)
        return (_dft(x, n, a, self.inverse, self.onesided, "DFT"),)


@kernel("STFT", since=17)
class STFT(Kernel):
    """signal [batch, length, 1|2], frame_step, optional window [frame_length] and frame_length ->
    [batch, frames, bins, 2]; frames = 1 + (length - frame_length) // frame_step (torch's count)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.onesided = bool(self.attr("onesided", 1))

    def run(
        self,
        signal: torch.Tensor,
        frame_step: torch.Tensor,
        window: torch.Tensor | None = None,
        frame_length: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        if signal.dim() != 3:
            raise ValueError(f"STFT takes a [batch, length, 1|2] signal; got shape {list(signal.shape)}")
        if frame_length is not None:
            n = int(frame_length)
        elif window is not None:
            n = int(window.shape[0])
        else:
            n = int(signal.shape[1])
        if window is not None and int(window.shape[0]) != n:
            raise ValueError(f"STFT: window of {window.shape[0]} points for frames of {n}")
        step = int(frame_step)
        if step <= 0:
            raise ValueError(f"STFT: frame_step must be positive; got {step}")
        c = _as_complex(signal, "STFT")  # [batch, length]
        frames = c.unfold(1, n, step)  # [batch, frames, n]
        if window is not None:
            frames = frames * window.to(frames.real.dtype)
        y = torch.fft.fft(frames, n=n, dim=-1)
        if self.onesided:
            if signal.shape[-1] == 2:
                raise UnsupportedVariantError("STFT with onesided=1 of a complex signal: the spec defines it for real signals")
            y = y[..., : n // 2 + 1]
        return (torch.view_as_real(y).to(signal.dtype),)


@kernel("MelWeightMatrix", since=17)
class MelWeightMatrix(Kernel):
    """[dft_length // 2 + 1, num_mel_bins] triangular filters between two edges, in `output_datatype`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.dtype = ctx.torch_dtype(int(self.attr("output_datatype", onnx.TensorProto.FLOAT)))

    def run(
        self,
        num_mel_bins: torch.Tensor,
        dft_length: torch.Tensor,
        sample_rate: torch.Tensor,
        lower_edge_hertz: torch.Tensor,
        upper_edge_hertz: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        mels, n, rate = int(num_mel_bins), int(dft_length), int(sample_rate)
        dev = self.ctx.device
        f64 = torch.float64
        # the spec's arithmetic: mel scale in the edges' precision, bin edges floored to integers
        lo = lower_edge_hertz.reshape(()).to(f64)
        hi = upper_edge_hertz.reshape(()).to(f64)
        low_mel = 2595 * torch.log1p(lo / 700) / math.log(10)
        high_mel = 2595 * torch.log1p(hi / 700) / math.log(10)
        step = (high_mel - low_mel) / (mels + 2)
        edges = torch.arange(mels + 2, dtype=f64, device=dev) * step + low_mel
        hz = 700 * torch.expm1(edges / 2595 * math.log(10))
        bins = torch.floor((n + 1) * hz / rate).to(torch.int64)
        left, center, right = bins[:-2], bins[1:-1], bins[2:]
        j = torch.arange(n // 2 + 1, dtype=torch.int64, device=dev)[:, None]
        up = (j - left).to(f64) / (center - left).clamp(min=1).to(f64)
        down = (right - j).to(f64) / (right - center).clamp(min=1).to(f64)
        out = torch.zeros(n // 2 + 1, mels, dtype=f64, device=dev)
        out = torch.where((left <= j) & (j <= center) & (center > left), up, out)
        out = torch.where((center == left) & (j == center), torch.ones_like(out), out)
        out = torch.where((center <= j) & (j < right) & (right > center), down, out)
        return (out.to(self.dtype),)
