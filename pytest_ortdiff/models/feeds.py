"""random_feeds: seeded inputs for a model, shaped by its symbolic dims, in each input's value range.

Builders store an input's sensible range in the model's metadata (`ortdiff.range.<input>` = "low,high").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx
import torch

from ..dtypes import DType, dtype_of
from ..runtimes.ort import load_model

__all__ = ["random_feeds", "set_feed_range"]

_PREFIX = "ortdiff.range."


def set_feed_range(model: onnx.ModelProto, name: str, low: float, high: float) -> None:
    """Record that input `name` takes values in [low, high) (what `random_feeds` draws)."""
    if not low < high:
        raise ValueError(f"feed range for {name!r} must have low < high, got [{low}, {high})")
    key = _PREFIX + name
    for p in model.metadata_props:
        if p.key == key:
            p.value = f"{low!r},{high!r}"
            return
    model.metadata_props.add(key=key, value=f"{low!r},{high!r}")


def _ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    out = {}
    for p in model.metadata_props:
        if p.key.startswith(_PREFIX):
            low, high = (float(x) for x in p.value.split(","))
            out[p.key[len(_PREFIX) :]] = (low, high)
    return out


def random_feeds(model: Any, *, dims: Mapping[str, int] | None = None, seed: int = 0, dtype: Any = None, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A dict input name -> torch tensor for `model`.

    `dims` gives the symbolic dims (`{"a": 2, "b": 1024, "c": 1152}`); values are drawn uniformly in each
    input's recorded range (floats default to [-1, 1), ints to [0, 10)) with a seeded generator, in
    float32 then cast, so the float16 feeds are the float32 feeds rounded. `dtype` overrides the
    floating inputs' dtype.
    """
    m = load_model(model)
    dims = dict(dims or {})
    init_names = {i.name for i in m.graph.initializer}
    ranges = _ranges(m)
    gen = torch.Generator().manual_seed(seed)
    override = dtype_of(dtype) if dtype is not None else None
    feeds: dict[str, torch.Tensor] = {}
    needed: set[str] = set()
    for vi in m.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param and d.dim_param in dims:
                shape.append(int(dims[d.dim_param]))
            else:
                needed.add(d.dim_param or f"<unnamed dim of {vi.name}>")
        if needed:
            continue
        dt = DType(tt.elem_type)
        if override is not None and dt.is_floating_point:
            dt = override
        feeds[vi.name] = _draw(tuple(shape), dt, ranges.get(vi.name), gen).to(device)
    if needed:
        raise ValueError(f"random_feeds needs a value for the symbolic dims {sorted(needed)}; pass dims={{{', '.join(repr(n) + ': ...' for n in sorted(needed))}}}")
    return feeds


def _draw(shape: tuple[int, ...], dt: DType, rng: tuple[float, float] | None, gen: torch.Generator) -> torch.Tensor:
    if dt == DType.BOOL:
        return torch.rand(shape, generator=gen) < 0.5
    if dt.is_floating_point:
        low, high = rng or (-1.0, 1.0)
        x = torch.rand(shape, generator=gen, dtype=torch.float64 if dt == DType.FLOAT64 else torch.float32)
        return (x * (high - low) + low).to(dt.torch)
    low, high = rng or (0, 10)
    return torch.randint(int(low), int(high), shape, generator=gen).to(dt.torch)
