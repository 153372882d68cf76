"""Resampling kernels (ONNX's tensor family): Resize, Upsample, GridSample, AffineGrid.

Resize is separable: one gather + weighted sum per resized axis, with per-axis indices and weights
computed on small 1-D tensors (the spec's coordinate transforms, in float64), never per element.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import ClassVar

import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "AffineGrid",
    "GridSample",
    "GridSample20",
    "Resize",
    "Resize10",
    "Resize11",
    "Resize13",
    "Resize18",
    "Upsample",
    "Upsample9",
]

_COORD_MODES = {
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",
}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple"}


def _wide(x: torch.Tensor) -> torch.dtype:
    """Where interpolation weights are applied: float32 for 16-bit floats and integers, else X's dtype."""
    if x.is_floating_point() and x.dtype not in (torch.float16, torch.bfloat16):
        return x.dtype
    return torch.float32


def _source_coords(
    mode: str,
    out_len: int,
    in_len: int,
    scale: float,
    roi: tuple[float, float] | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x_original for every output index of one axis (float64), and for tf_crop_and_resize the mask of
    outputs that fall outside the input (they get extrapolation_value)."""
    y = torch.arange(out_len, dtype=torch.float64, device=device)
    out_width = scale * in_len
    # align_corners and tf_crop_and_resize divide by the fractional output width scale * length, as ONNX's
    # node tests and onnx.reference do, by design (onnx/onnx#2462); onnxruntime and torch divide by the
    # integer output length instead, which differs when scale * length is not an integer (never with sizes).
    if mode == "align_corners":
        x = torch.zeros_like(y) if out_width == 1 else y * (in_len - 1) / (out_width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        if roi is None:
            raise ValueError("Resize with coordinate_transformation_mode=tf_crop_and_resize needs the roi input")
        start, end = roi
        if out_width == 1:
            x = torch.full_like(y, (start + end) * (in_len - 1) / 2)
        else:
            x = start * (in_len - 1) + y * (end - start) * (in_len - 1) / (out_width - 1)
        return x, (x < 0) | (x > in_len - 1)
    elif mode == "pytorch_half_pixel":
        # the spec's text: 0 for a length-1 output (onnx.reference takes -0.5; linear and nearest agree)
        x = torch.zeros_like(y) if out_len == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_width)
        x = offset + (y + 0.5) / scale - 0.5
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    else:  # pragma: no cover - validated in __init__
        raise AssertionError(mode)
    return x, None


def _nearest_index(x: torch.Tensor, mode: str, scale: float) -> torch.Tensor:
    if mode == "round_prefer_floor":
        return torch.ceil(x - 0.5)
    if mode == "round_prefer_ceil":
        return torch.floor(x + 0.5)
    if mode == "floor":
        return torch.floor(x)
    if mode == "ceil":
        return torch.ceil(x)
    # "simple": Resize-10 and Upsample had no nearest_mode; onnxruntime keeps their original rule,
    # ceil when downsampling and truncation otherwise.
    return torch.ceil(x) if scale < 1 else torch.trunc(x)


def _keys(r: torch.Tensor, a: float) -> list[torch.Tensor]:
    """Keys' cubic convolution weights of the four taps floor(x)-1 .. floor(x)+2 for fraction r."""
    s = 1 - r
    return [
        ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
    ]


def _weights(
    mode: str, ratio: torch.Tensor, scale: float, antialias: bool, a: float
) -> torch.Tensor:
    """(out, n) weights of the n taps around x_original: tap j sits at floor(x) - n/2 + 1 + j, with
    `ratio` = x - floor(x) in (0, 1] (an integer x counts as the right end of the interval before it)."""
    r = ratio[:, None]
    if not antialias:
        if mode == "linear":
            return torch.cat([1 - r, r], dim=1)
        return torch.cat(_keys(r, a), dim=1)
    # The antialiasing filter is the interpolation kernel stretched by 1/scale when downsampling.
    s = min(scale, 1.0)
    reach = 1 if mode == "linear" else 2
    start = math.floor(-reach / s) + 1
    taps = torch.arange(start, 2 - start, dtype=torch.float64, device=ratio.device)
    d = ((taps[None, :] - r) * s).abs()
    if mode == "linear":
        w = (1 - d).clamp(0, 1)
    else:
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        w = torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))
    return w / w.sum(dim=1, keepdim=True)


def _resize_axis(
    x: torch.Tensor,
    axis: int,
    out_len: int,
    scale: float,
    roi: tuple[float, float] | None,
    how: _Resampling,
) -> torch.Tensor:
    in_len = x.shape[axis]
    coords, outside = _source_coords(how.coord, out_len, in_len, scale, roi, x.device)
    if how.mode == "nearest":
        idx = _nearest_index(coords, how.nearest, scale).long().clamp(0, in_len - 1)
        y = x.index_select(axis, idx)
    else:
        base = torch.floor(coords)
        ratio = torch.where(coords == base, torch.ones_like(coords), coords - base)
        w = _weights(how.mode, ratio, scale, how.antialias, how.cubic_a)
        n = w.shape[1]
        first = base + torch.where(coords == base, -(n // 2), 1 - n // 2).to(base.dtype)
        taps = first.long()[:, None] + torch.arange(n, device=x.device)[None, :]
        if how.exclude_outside:
            w = torch.where((taps < 0) | (taps >= in_len), torch.zeros_like(w), w)
            total = w.sum(dim=1, keepdim=True)
            w = w / torch.where(total == 0, torch.ones_like(total), total)
        # Taps outside the input read the edge (the spec pads by replication).
        taps = taps.clamp(0, in_len - 1)
        gathered = x.index_select(axis, taps.reshape(-1))
        shape = list(x.shape)
        shape[axis : axis + 1] = [out_len, n]
        gathered = gathered.reshape(shape)
        wshape = [1] * x.dim()
        wshape[axis : axis + 1] = [out_len, n]
        y = (gathered * w.to(x.dtype).reshape(wshape)).sum(dim=axis + 1)
    if outside is not None and bool(outside.any()):
        mshape = [1] * x.dim()
        mshape[axis] = out_len
        fill = torch.tensor(how.extrapolation, dtype=y.dtype, device=y.device)
        y = torch.where(outside.reshape(mshape), fill, y)
    return y


class _Resampling:
    """The interpolation a Resize/Upsample node asks for, validated once."""

    def __init__(
        self,
        op: str,
        mode: str,
        coord: str,
        nearest: str,
        cubic_a: float,
        antialias: bool,
        exclude_outside: bool,
        extrapolation: float,
    ) -> None:
        if mode == "bilinear":  # Upsample-7's spelling of linear
            mode = "linear"
        if mode not in ("nearest", "linear", "cubic"):
            raise UnsupportedVariantError(f"{op} mode={mode!r}: the spec defines nearest, linear and cubic")
        if coord not in _COORD_MODES:
            raise UnsupportedVariantError(
                f"{op} coordinate_transformation_mode={coord!r}: known modes are {sorted(_COORD_MODES)}"
            )
        if nearest not in _NEAREST_MODES:
            raise UnsupportedVariantError(
                f"{op} nearest_mode={nearest!r}: known modes are round_prefer_floor, round_prefer_ceil, floor, ceil"
            )
        self.mode = mode
        self.coord = coord
        self.nearest = nearest
        self.cubic_a = cubic_a
        # The spec applies the antialiasing filter to linear and cubic only; nearest ignores the flag.
        self.antialias = antialias and mode != "nearest"
        self.exclude_outside = exclude_outside
        self.extrapolation = extrapolation


def _resize(
    x: torch.Tensor,
    how: _Resampling,
    scales: Sequence[float] | None,
    sizes: Sequence[int] | None,
    roi: Sequence[float] | None,
    axes: Sequence[int] | None,
    policy: str,
    op: str,
) -> torch.Tensor:
    rank = x.dim()
    axes = [a % rank for a in axes] if axes is not None else list(range(rank))
    if len(set(axes)) != len(axes):
        raise ValueError(f"{op}: axes {list(axes)} repeat an axis")
    given = scales if scales is not None else sizes
    if given is None:
        raise ValueError(f"{op} needs scales or sizes (exactly one of them non-empty)")
    if len(given) != len(axes):
        raise ValueError(
            f"{op}: {'scales' if scales is not None else 'sizes'} has {len(given)} values for "
            f"{len(axes)} axes of X (rank {rank})"
        )
    rois: dict[int, tuple[float, float]] = {}
    if roi is not None and len(roi) > 0:
        if len(roi) != 2 * len(axes):
            raise ValueError(f"{op}: roi has {len(roi)} values, expected 2 x {len(axes)} (starts then ends)")
        rois = {a: (float(roi[i]), float(roi[len(axes) + i])) for i, a in enumerate(axes)}
    in_shape = list(x.shape)
    if scales is not None:
        if any(s <= 0 for s in scales):
            raise ValueError(f"{op}: scales must be positive, got {list(scales)}")
        factor = {a: float(s) for a, s in zip(axes, scales, strict=True)}
        # onnx.reference and onnxruntime take floor(in * scale), without the roi factor the spec's text shows.
        out = {a: math.floor(factor[a] * in_shape[a]) for a in axes}
    else:
        assert sizes is not None
        factor = {a: int(s) / in_shape[a] for a, s in zip(axes, sizes, strict=True)}
        out = {a: int(s) for a, s in zip(axes, sizes, strict=True)}
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise UnsupportedVariantError(
                    f"{op} keep_aspect_ratio_policy={policy!r}: known policies are stretch, not_larger, not_smaller"
                )
            pick = min if policy == "not_larger" else max
            common = pick(factor.values())
            factor = dict.fromkeys(axes, common)
            out = {a: int(common * in_shape[a] + 0.5) for a in axes}
    if any(in_shape[a] == 0 for a in axes):
        raise ValueError(f"{op} of an empty axis: X has shape {tuple(in_shape)}")
    integer = not x.is_floating_point()
    y = x if (integer and how.mode == "nearest") else x.to(_wide(x))
    for a in axes:
        trivial_roi = a not in rois or (math.isclose(rois[a][0], 0.0) and math.isclose(rois[a][1], 1.0))
        if math.isclose(factor[a], 1.0) and out[a] == in_shape[a] and trivial_roi:
            continue  # identity along this axis
        y = _resize_axis(y, a, out[a], factor[a], rois.get(a), how)
    if integer and how.mode != "nearest":
        info = torch.iinfo(x.dtype)
        y = torch.round(y).clamp(info.min, info.max)
    return y.to(x.dtype)


def _values(t: torch.Tensor | None) -> list[float] | None:
    """A host list of a small constant input (scales, sizes, roi); None when omitted or empty."""
    if t is None or t.numel() == 0:
        return None
    return [float(v) for v in t.detach().cpu().reshape(-1).tolist()]


class _ResizeBase(Kernel):
    def _how(self, coord_default: str) -> _Resampling:
        return _Resampling(
            "Resize",
            self.attr("mode", "nearest"),
            self.attr("coordinate_transformation_mode", coord_default),
            self.attr("nearest_mode", "round_prefer_floor"),
            float(self.attr("cubic_coeff_a", -0.75)),
            bool(self.attr("antialias", 0)),
            bool(self.attr("exclude_outside", 0)),
            float(self.attr("extrapolation_value", 0.0)),
        )


@kernel("Resize", since=10)
class Resize10(_ResizeBase):
    """Opset 10: inputs (X, scales); asymmetric coordinates, nearest or linear."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.how = _Resampling(
            "Resize", self.attr("mode", "nearest"), "asymmetric", "simple", -0.75, False, False, 0.0
        )
        if self.how.mode == "cubic":
            raise UnsupportedVariantError("Resize (opset 10) mode='cubic': opset 10 defines nearest and linear")

    def run(self, x: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (_resize(x, self.how, _values(scales), None, None, None, "stretch", "Resize"),)


@kernel("Resize", since=11)
class Resize11(_ResizeBase):
    """Opsets 11-19: inputs (X, roi, scales, sizes); every attribute of the version's spec."""

    coord_modes = _COORD_MODES - {"half_pixel_symmetric"}

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.how = self._how("half_pixel")
        if self.how.coord not in self.coord_modes:
            raise UnsupportedVariantError(
                f"Resize (opset {ctx.opset}) coordinate_transformation_mode={self.how.coord!r}: "
                f"not defined before {'opset 19' if self.how.coord == 'half_pixel_symmetric' else 'opset 13'}"
            )
        axes = self.attr("axes", None)
        self.axes = [int(a) for a in axes] if axes is not None else None
        self.policy = self.attr("keep_aspect_ratio_policy", "stretch")

    def run(
        self,
        x: torch.Tensor,
        roi: torch.Tensor | None = None,
        scales: torch.Tensor | None = None,
        sizes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        sc, sz = _values(scales), _values(sizes)
        if sc is not None and sz is not None:
            raise ValueError("Resize takes scales or sizes, not both: leave one of them empty")
        sizes_int = [int(v) for v in sz] if sz is not None else None
        roi_v = _values(roi) if self.how.coord == "tf_crop_and_resize" else None
        return (_resize(x, self.how, sc, sizes_int, roi_v, self.axes, self.policy, "Resize"),)


@kernel("Resize", since=13)
class Resize13(Resize11):
    """Opset 13 drops tf_half_pixel_for_nn; roi and scales become optional."""

    coord_modes = _COORD_MODES - {"half_pixel_symmetric", "tf_half_pixel_for_nn"}


@kernel("Resize", since=18)
class Resize18(Resize11):
    """Opset 18 adds antialias, axes and keep_aspect_ratio_policy."""

    coord_modes = _COORD_MODES - {"half_pixel_symmetric", "tf_half_pixel_for_nn"}


@kernel("Resize", since=19)
class Resize(Resize11):
    """Opset 19 adds half_pixel_symmetric."""

    coord_modes = _COORD_MODES - {"tf_half_pixel_for_nn"}


@kernel("Upsample", since=7)
class Upsample(Kernel):
    """Opset 7: `scales` attribute; asymmetric coordinates, nearest or (bi)linear (deprecated at 10)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.how = _Resampling(
            "Upsample", self.attr("mode", "nearest"), "asymmetric", "simple", -0.75, False, False, 0.0
        )
        if self.how.mode == "cubic":
            raise UnsupportedVariantError("Upsample mode='cubic': Upsample defines nearest and linear")
        scales = self.attr("scales", None)
        self.scales = [float(s) for s in scales] if scales is not None else None

    def _upsample(self, x: torch.Tensor, scales: list[float] | None) -> torch.Tensor:
        if scales is None or len(scales) != x.dim():
            raise ValueError(f"Upsample needs one scale per axis of X (rank {x.dim()}), got {scales}")
        if any(s < 1 for s in scales):
            raise ValueError(f"Upsample scales must be >= 1, got {scales}")
        return _resize(x, self.how, scales, None, None, None, "stretch", "Upsample")

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self._upsample(x, self.scales),)


@kernel("Upsample", since=9)
class Upsample9(Upsample):
    """Opset 9: scales as the second input."""

    def run(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return (self._upsample(x, _values(scales)),)


def _reflect(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Reflect by the nearer border until within [lo, hi] (GridSample's reflection padding)."""
    rng = hi - lo
    if rng == 0:
        return torch.full_like(x, lo)
    below = lo - x
    above = x - hi
    nb = torch.trunc(below / rng)
    rb = below - nb * rng
    na = torch.trunc(above / rng)
    ra = above - na * rng
    from_below = torch.where(nb % 2 == 0, lo + rb, hi - rb)
    from_above = torch.where(na % 2 == 0, hi - ra, lo + ra)
    return torch.where(x < lo, from_below, torch.where(x > hi, from_above, x))


class _GridSampleBase(Kernel):
    modes: ClassVar[dict[str, str]] = {}

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        mode = self.attr("mode", "linear" if self.since >= 20 else "bilinear")
        if mode not in self.modes:
            raise UnsupportedVariantError(
                f"GridSample (opset {self.since}) mode={mode!r}: known modes are {sorted(self.modes)}"
            )
        self.mode = self.modes[mode]
        self.padding = self.attr("padding_mode", "zeros")
        if self.padding not in ("zeros", "border", "reflection"):
            raise UnsupportedVariantError(
                f"GridSample padding_mode={self.padding!r}: known modes are zeros, border, reflection"
            )
        self.align = bool(self.attr("align_corners", 0))

    def run(self, x: torch.Tensor, grid: torch.Tensor) -> tuple[torch.Tensor, ...]:
        spatial = list(x.shape[2:])
        r = len(spatial)
        if grid.dim() != r + 2 or grid.shape[-1] != r or grid.shape[0] != x.shape[0]:
            raise ValueError(
                f"GridSample: grid of shape {tuple(grid.shape)} does not match X of shape {tuple(x.shape)} "
                f"(expected [N, *out_spatial, {r}])"
            )
        if self.since < 20 and r != 2:
            raise UnsupportedVariantError(f"GridSample (opset {self.since}) of a {r}-D input: opset 16 defines 2-D only")
        wide = _wide(x)
        n, c = x.shape[0], x.shape[1]
        out_spatial = list(grid.shape[1:-1])
        # Coordinates in float32 at least (onnx.reference computes them in float32), float64 in the oracle.
        g = grid.to(torch.promote_types(grid.dtype, torch.float32)).reshape(n, -1, r)
        per_axis: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        strides = [math.prod(spatial[i + 1 :]) for i in range(r)]
        for i, size in enumerate(spatial):
            # the grid's last axis lists coordinates innermost axis first (x, y, z)
            u = g[..., r - 1 - i]
            if self.align:
                pos = (u + 1) / 2 * (size - 1)
                lo, hi = 0.0, size - 1.0
            else:
                pos = ((u + 1) * size - 1) / 2
                lo, hi = -0.5, size - 0.5
            if self.mode == "nearest":
                pos = torch.round(pos)  # half to even, as torch and onnxruntime do
            if self.padding == "border" and self.mode != "cubic":
                # Only outside [lo, hi]: a linear tap between -0.5 and 0 reads the edge pixel either way.
                pos = torch.where((pos < lo) | (pos > hi), pos.clamp(0, size - 1), pos)
            elif self.padding == "border":
                # Cubic taps are clamped one by one with the point itself left where it is, as onnxruntime
                # and torch do (onnx.reference first clamps the point into [0, size - 1]).
                pass
            elif self.padding == "reflection":
                pos = _reflect(pos, lo, hi)
            per_axis.append(self._taps(pos, size, lo, hi))
        xf = x.to(wide).reshape(n, c, -1)
        y = torch.zeros(n, c, g.shape[1], dtype=wide, device=x.device)
        for combo in itertools.product(*per_axis):
            flat = torch.zeros_like(combo[0][0])
            weight = torch.ones_like(combo[0][1])
            for i, (idx, w) in enumerate(combo):
                flat = flat + idx * strides[i]
                weight = weight * w
            vals = xf.gather(2, flat.reshape(n, 1, -1).expand(n, c, -1))
            y = y + vals * weight.to(wide).reshape(n, 1, -1)
        return (y.reshape(n, c, *out_spatial).to(x.dtype),)

    def _taps(
        self, pos: torch.Tensor, size: int, lo: float, hi: float
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(index, weight) per tap of one axis; a tap outside the input is read per padding_mode
        (zeros: weight 0, border: clamped, reflection: reflected index)."""
        if self.mode == "nearest":
            offsets, weights = [0], [torch.ones_like(pos)]
            base = pos
        else:
            base = torch.floor(pos)
            t = pos - base
            if self.mode == "linear":
                offsets, weights = [0, 1], [1 - t, t]
            else:
                offsets, weights = [-1, 0, 1, 2], _keys(t, -0.75)
        taps = []
        for off, w in zip(offsets, weights, strict=True):
            idx = base + off
            if self.padding == "zeros":
                inside = (idx >= 0) & (idx <= size - 1)
                w = torch.where(inside, w, torch.zeros_like(w))
                idx = idx.clamp(0, size - 1)
            elif self.padding == "border":
                idx = idx.clamp(0, size - 1)
            else:
                idx = torch.trunc(_reflect(idx, lo, hi)).clamp(0, size - 1)
            taps.append((idx.long(), w))
        return taps


@kernel("GridSample", since=16)
class GridSample(_GridSampleBase):
    """Opset 16: 4-D X, modes bilinear / nearest / bicubic."""

    modes: ClassVar[dict[str, str]] = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@kernel("GridSample", since=20)
class GridSample20(_GridSampleBase):
    """Opsets 20 and 22: N-D X, modes linear / nearest / cubic."""

    modes: ClassVar[dict[str, str]] = {"linear": "linear", "nearest": "nearest", "cubic": "cubic"}


@kernel("AffineGrid", since=20)
class AffineGrid(Kernel):
    """grid[n, ..., :] = theta[n] @ (x, y[, z], 1) over the normalized base grid of `size`."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.align = bool(self.attr("align_corners", 0))

    def run(self, theta: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dims = [int(v) for v in size.detach().cpu().tolist()]
        spatial = dims[2:]
        r = len(spatial)
        if r not in (2, 3) or theta.dim() != 3 or tuple(theta.shape[1:]) != (r, r + 1):
            raise ValueError(
                f"AffineGrid: theta of shape {tuple(theta.shape)} and size {dims} do not match "
                "([N, 2, 3] with [N, C, H, W], or [N, 3, 4] with [N, C, D, H, W])"
            )
        wide = _wide(theta)
        lines = []
        for s in spatial:
            if self.align:
                step = torch.arange(s, dtype=torch.float64, device=theta.device)
                v = step * (2.0 / (s - 1)) - 1 if s > 1 else torch.full((1,), -1.0, dtype=torch.float64, device=theta.device)
            else:
                v = (torch.arange(s, dtype=torch.float64, device=theta.device) * 2 + 1) / s - 1
            lines.append(v.to(wide).to(theta.device))
        mesh = torch.meshgrid(*lines, indexing="ij")
        # homogeneous base coordinates, innermost axis first: (x, y[, z], 1)
        base = torch.stack([*reversed(mesh), torch.ones_like(mesh[0])], dim=-1).reshape(-1, r + 1)
        grid = torch.einsum("pk,njk->npj", base, theta.to(wide))
        return (grid.reshape(theta.shape[0], *spatial, r).to(theta.dtype),)
