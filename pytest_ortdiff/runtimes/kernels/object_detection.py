"""Object-detection kernels (ONNX's object_detection family): RoiAlign and NonMaxSuppression, and the
precision in which RoI ops lay out their bins (shared with MaxRoiPool).
"""

from __future__ import annotations

import math

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ["NonMaxSuppression", "RoiAlign", "RoiAlign16", "geometry_dtype"]


def geometry_dtype(rois: torch.Tensor, ctx: KernelContext) -> torch.dtype:
    """The precision of a RoI op's discrete choices (how many samples a bin has, which pixels it takes):
    the RoIs' own (float32 at least, as onnxruntime computes float16), except in the float64 oracle.

    Those choices jump where float32 rounding crosses an integer (8.5 * 0.8f - 1.0 * 0.8f is exactly 6 in
    float32, 6.0000000894 in float64: ceil(6 / 3) is 2 samples, or 3). The oracle measures the arithmetic
    error of the float32 model's values, so it must make the float32 model's choices: in oracle mode, RoIs
    that survive a round trip through float32 were float32 (or float16) in the model and are laid out in
    float32; only RoIs that do not (a float64 model's) keep float64.
    """
    if rois.dtype != torch.float64 or ctx.compute_dtype is None:
        return torch.promote_types(rois.dtype, torch.float32)
    if torch.equal(rois.to(torch.float32).to(torch.float64), rois):
        return torch.float32
    return torch.float64


def _axis_samples(
    start: torch.Tensor, length: torch.Tensor, pooled: int, grid: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Along one axis, for every RoI r, bin p and sample i (up to the largest grid): the low/high pixel
    and their bilinear weights, and whether the sample exists (i < grid[r]) — as onnxruntime's
    pre-calculation does it: a sample beyond [-1, size] weighs nothing, one below 0 is clamped to 0, one at
    or beyond the last pixel reads that pixel only."""
    big = max(int(grid.max().item()), 1) if grid.numel() else 1
    dev, dt = start.device, start.dtype
    binsz = length / pooled
    p = torch.arange(pooled, device=dev, dtype=dt).reshape(1, -1, 1)
    i = torch.arange(big, device=dev, dtype=dt).reshape(1, 1, -1)
    g = grid.to(dt).reshape(-1, 1, 1)
    # a RoI without samples (grid 0) divides by 1 instead: its samples do not exist anyway
    step = binsz.reshape(-1, 1, 1) / torch.clamp(g, min=1)
    pos = start.reshape(-1, 1, 1) + p * binsz.reshape(-1, 1, 1) + (i + 0.5) * step
    exists = (i < g).expand_as(pos)
    outside = (pos < -1.0) | (pos > size)
    pos = torch.clamp(pos, min=0)
    low = torch.floor(pos)
    last = low >= size - 1
    low = torch.where(last, torch.full_like(low, size - 1), low)
    high = torch.where(last, low, low + 1)
    pos = torch.where(last, low, pos)
    frac = pos - low
    w_low = torch.where(outside, torch.zeros_like(frac), 1 - frac)
    w_high = torch.where(outside, torch.zeros_like(frac), frac)
    return low.long(), high.long(), w_low, w_high, exists, outside


class _RoiAlign(Kernel):
    """RoI Align: each output bin the average (or max) of a grid of bilinearly sampled points.

    avg is separable (a sample's weight is a y-weight times an x-weight), so each RoI is two small
    matrix products with the image. max follows onnx.reference and onnxruntime 1.17+: the max over the
    samples of the largest of the four *weighted* corner values (not of the interpolated value, which the
    spec's wording would suggest); a sample outside the image counts as 0.
    """

    half_pixel_default = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.mode = str(self.attr("mode", "avg"))
        if self.mode not in ("avg", "max"):
            raise UnsupportedVariantError(f"RoiAlign mode={self.mode!r}: expected 'avg' or 'max'")
        self.out_h = int(self.attr("output_height", 1))
        self.out_w = int(self.attr("output_width", 1))
        self.sampling_ratio = int(self.attr("sampling_ratio", 0))
        self.scale = float(self.attr("spatial_scale", 1.0))
        ctm = str(self.attr("coordinate_transformation_mode", "half_pixel" if self.half_pixel_default
                            else "output_half_pixel"))
        if ctm not in ("half_pixel", "output_half_pixel"):
            raise UnsupportedVariantError(
                f"RoiAlign coordinate_transformation_mode={ctm!r}: expected 'half_pixel' or 'output_half_pixel'"
            )
        self.half_pixel = ctm == "half_pixel"

    def run(
        self, x: torch.Tensor, rois: torch.Tensor, batch_indices: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        n_rois = rois.shape[0]
        _, channels, height, width = x.shape
        ct = torch.promote_types(x.dtype, torch.float32)
        xc = x.to(ct)
        r = rois.to(ct)
        offset = 0.5 if self.half_pixel else 0.0
        start_w, start_h = r[:, 0] * self.scale - offset, r[:, 1] * self.scale - offset
        len_w = r[:, 2] * self.scale - offset - start_w
        len_h = r[:, 3] * self.scale - offset - start_h
        if not self.half_pixel:
            # malformed RoIs forced to 1x1, as the reference does
            len_w, len_h = torch.clamp(len_w, min=1.0), torch.clamp(len_h, min=1.0)
        if self.sampling_ratio > 0:
            grid_h = torch.full((n_rois,), self.sampling_ratio, device=x.device, dtype=torch.long)
            grid_w = grid_h
        else:
            grid_h, grid_w = self._adaptive_grid(rois.to(geometry_dtype(rois, self.ctx)))
        count = torch.clamp(grid_h * grid_w, min=1).to(ct)
        ylo, yhi, wylo, wyhi, yexists, _ = _axis_samples(start_h, len_h, self.out_h, grid_h, height)
        xlo, xhi, wxlo, wxhi, xexists, _ = _axis_samples(start_w, len_w, self.out_w, grid_w, width)
        batch = batch_indices.long()
        if self.mode == "avg":
            y = self._avg(xc, batch, (ylo, yhi, wylo, wyhi, yexists), (xlo, xhi, wxlo, wxhi, xexists), count)
        else:
            y = self._max(xc, batch, (ylo, yhi, wylo, wyhi, yexists), (xlo, xhi, wxlo, wxhi, xexists))
        return (y.reshape(n_rois, channels, self.out_h, self.out_w).to(x.dtype),)

    def _adaptive_grid(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sampling_ratio=0: ceil(RoI size / output size) samples per bin along each axis, computed in
        the precision of `r` (see geometry_dtype)."""
        offset = 0.5 if self.half_pixel else 0.0
        scale = torch.tensor(self.scale, dtype=r.dtype, device=r.device)
        len_w = (r[:, 2] * scale - offset) - (r[:, 0] * scale - offset)
        len_h = (r[:, 3] * scale - offset) - (r[:, 1] * scale - offset)
        if not self.half_pixel:
            len_w, len_h = torch.clamp(len_w, min=1.0), torch.clamp(len_h, min=1.0)
        grid_h = torch.ceil(len_h / self.out_h).long().clamp(min=0)
        grid_w = torch.ceil(len_w / self.out_w).long().clamp(min=0)
        return grid_h, grid_w

    @staticmethod
    def _weights(
        axis: tuple[torch.Tensor, ...], size: int
    ) -> torch.Tensor:
        """(R, pooled, size): the summed bilinear weight of each pixel over a bin's existing samples."""
        lo, hi, wlo, whi, exists, = axis
        ex = exists.to(wlo.dtype)
        out = torch.zeros(*lo.shape[:2], size, dtype=wlo.dtype, device=lo.device)
        out.scatter_add_(2, lo.reshape(*lo.shape[:2], -1), (wlo * ex).reshape(*lo.shape[:2], -1))
        out.scatter_add_(2, hi.reshape(*hi.shape[:2], -1), (whi * ex).reshape(*hi.shape[:2], -1))
        return out

    def _avg(
        self,
        x: torch.Tensor,
        batch: torch.Tensor,
        yaxis: tuple[torch.Tensor, ...],
        xaxis: tuple[torch.Tensor, ...],
        count: torch.Tensor,
    ) -> torch.Tensor:
        wy = self._weights(yaxis, x.shape[2])  # (R, ph, H)
        wx = self._weights(xaxis, x.shape[3])  # (R, pw, W)
        out = torch.zeros(batch.shape[0], x.shape[1], self.out_h, self.out_w, dtype=x.dtype, device=x.device)
        # one pass per image of the batch (not per RoI): X[b] is never copied per RoI
        for b in torch.unique(batch).tolist():
            sel = torch.nonzero(batch == b).reshape(-1)
            cols = torch.einsum("chw,rqw->rchq", x[b], wx[sel])
            out[sel] = torch.einsum("rph,rchq->rcpq", wy[sel], cols)
        return out / count.reshape(-1, 1, 1, 1)

    def _max(
        self,
        x: torch.Tensor,
        batch: torch.Tensor,
        yaxis: tuple[torch.Tensor, ...],
        xaxis: tuple[torch.Tensor, ...],
    ) -> torch.Tensor:
        ylo, yhi, wylo, wyhi, yex = yaxis  # (R, ph, Gh)
        xlo, xhi, wxlo, wxhi, xex = xaxis  # (R, pw, Gw)
        b = batch.reshape(-1, 1, 1, 1, 1)
        best: torch.Tensor | None = None
        for yi, wy in ((ylo, wylo), (yhi, wyhi)):
            for xi, wx in ((xlo, wxlo), (xhi, wxhi)):
                # (R, ph, Gh, pw, Gw, C)
                v = x[b, :, yi[:, :, :, None, None], xi[:, None, None, :, :]]
                v = v * (wy[:, :, :, None, None] * wx[:, None, None, :, :])[..., None]
                best = v if best is None else torch.maximum(best, v)
        assert best is not None
        exists = (yex[:, :, :, None, None] & xex[:, None, None, :, :])[..., None]
        best = torch.where(exists, best, torch.full_like(best, -math.inf)).amax(dim=(2, 4))
        # a bin without samples (an empty RoI in half_pixel mode) is 0
        best = torch.where(torch.isneginf(best), torch.zeros_like(best), best)
        return best.permute(0, 3, 1, 2)


@kernel("RoiAlign", since=10)
class RoiAlign(_RoiAlign):
    """RoiAlign-10: RoI coordinates used as they are (what opset 16 calls output_half_pixel)."""

    half_pixel_default = False


@kernel("RoiAlign", since=16)
class RoiAlign16(_RoiAlign):
    """RoiAlign-16: coordinate_transformation_mode, half_pixel (shift by -0.5) by default."""

    half_pixel_default = True


@kernel("NonMaxSuppression", since=10)
class NonMaxSuppression(Kernel):
    """Greedy NMS per batch and class: candidates above score_threshold in descending score (ties: lower
    box index first), a candidate kept unless its IoU with a kept box exceeds iou_threshold, at most
    max_output_boxes_per_class (0 or omitted: none). Output rows [batch, class, box], batch-major, then
    class, then selection order, as onnxruntime. NonMaxSuppression-11 only clarified the spec."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.center_point_box = int(self.attr("center_point_box", 0))
        if self.center_point_box not in (0, 1):
            raise UnsupportedVariantError(
                f"NonMaxSuppression center_point_box={self.center_point_box}: expected 0 or 1"
            )

    def _corners(self, boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.center_point_box == 1:
            xc, yc, w, h = boxes.unbind(-1)
            return xc - w / 2, yc - h / 2, xc + w / 2, yc + h / 2
        y1, x1, y2, x2 = boxes.unbind(-1)
        # either diagonal is allowed: take min/max
        return torch.minimum(x1, x2), torch.minimum(y1, y2), torch.maximum(x1, x2), torch.maximum(y1, y2)

    def run(
        self,
        boxes: torch.Tensor,
        scores: torch.Tensor,
        max_out: torch.Tensor | None = None,
        iou_threshold: torch.Tensor | None = None,
        score_threshold: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        dev = boxes.device
        limit = int(max_out.reshape(-1)[0].item()) if max_out is not None and max_out.numel() else 0
        iou_thr = float(iou_threshold.reshape(-1)[0].item()) if iou_threshold is not None and iou_threshold.numel() else 0.0
        n_batch, n_class, _ = scores.shape
        rows: list[torch.Tensor] = []
        if limit > 0:
            x1, y1, x2, y2 = self._corners(boxes)  # each (B, N)
            area = (x2 - x1) * (y2 - y1)
            # pairwise IoU per batch (B, N, N); a pair without overlap or with an empty box never suppresses
            ix = torch.clamp(torch.minimum(x2[:, :, None], x2[:, None, :]) - torch.maximum(x1[:, :, None], x1[:, None, :]), min=0)
            iy = torch.clamp(torch.minimum(y2[:, :, None], y2[:, None, :]) - torch.maximum(y1[:, :, None], y1[:, None, :]), min=0)
            inter = ix * iy
            union = area[:, :, None] + area[:, None, :] - inter
            valid = (inter > 0) & (area[:, :, None] > 0) & (area[:, None, :] > 0) & (union > 0)
            iou = inter / torch.where(valid, union, torch.ones_like(union))
            suppress = (valid & (iou > iou_thr)).cpu()
            for b in range(n_batch):
                for c in range(n_class):
                    s = scores[b, c]
                    order = torch.sort(s, descending=True, stable=True).indices
                    if score_threshold is not None and score_threshold.numel():
                        order = order[s[order] > score_threshold.reshape(-1)[0].to(s.dtype)]
                    order = order.cpu()
                    sup = suppress[b][order][:, order]
                    alive = torch.ones(order.numel(), dtype=torch.bool, device=order.device)  # (on the host, as `sup`)
                    kept: list[int] = []
                    # one step per *kept* box (at most `limit`), each suppressing its overlaps at once
                    while len(kept) < limit:
                        left = torch.nonzero(alive)
                        if left.numel() == 0:
                            break
                        i = int(left[0, 0])
                        kept.append(i)
                        alive &= ~sup[i]
                        alive[i] = False
                    if kept:
                        idx = order[torch.tensor(kept, dtype=torch.long, device=order.device)]
                        rows.append(torch.stack(
                            [torch.full_like(idx, b), torch.full_like(idx, c), idx], dim=1
                        ))
        out = torch.cat(rows) if rows else torch.zeros(0, 3, dtype=torch.long, device=dev)
        return (out.to(device=dev, dtype=torch.int64),)
