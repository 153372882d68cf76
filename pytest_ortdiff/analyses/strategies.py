"""Hypothesis strategies for shape and value fuzzing: a model's symbolic dims (respecting its builder's
constraints), feeds per dtype and value regime, and the providers/dtypes the run enabled."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from ..numerics.dtypes import DType, dtype_of
from ..runtimes import selection
from ..runtimes.model_io import load_model

__all__ = ["REGIMES", "PinnedDims", "dims", "dtypes", "feeds", "make_feeds", "pinned_dims", "providers", "symbolic_dims"]

#: value regimes `feeds` knows
REGIMES = ("normal", "uniform", "large", "tiny", "special")

_DEFAULT_RANGE = (1, 64)


def symbolic_dims(model: Any) -> list[str]:
    """The names of the symbolic dims of a model's inputs, in order of first appearance."""

    m = load_model(model)
    init = {i.name for i in m.graph.initializer}
    out: list[str] = []
    for vi in m.graph.input:
        if vi.name in init:
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param and d.dim_param not in out:
                out.append(d.dim_param)
    return out


@dataclass(frozen=True)
class PinnedDims:
    """What a model fixes of its inputs' symbolic dims, as onnxruntime's symbolic shape inference reads it:
    `fixed` {dim: value} for a dim the model's weights or constants fix (a Linear's in-features exported as
    a symbolic `hidden`: every other value fails in onnxruntime), `same` {dim: dim drawn for it} for a dim
    that must equal another (two inputs' sequence lengths under two names)."""

    fixed: Mapping[str, int] = field(default_factory=dict)
    same: Mapping[str, str] = field(default_factory=dict)

    def why(self, name: str) -> str:
        if name in self.fixed:
            return f"the model fixes {name!r} at {self.fixed[name]} (its weights or constants do: onnxruntime's symbolic shape inference)"
        return f"the model makes {name!r} equal to {self.same[name]!r} (onnxruntime's symbolic shape inference)"


def pinned_dims(model: Any) -> PinnedDims:
    """The symbolic input dims `model` fixes, or makes equal to another (see `PinnedDims`), from
    onnxruntime's symbolic shape inference (`onnxruntime.tools.symbolic_shape_infer`, merging dims where an
    op needs them equal). Nothing pinned where that inference cannot read the model (an op it does not
    know, a model above 2 GB): a dim the model fixes then fails in onnxruntime when drawn otherwise."""
    m = load_model(model)
    init = {i.name for i in m.graph.initializer}
    before = {vi.name: [d.dim_param if d.dim_param else None for d in vi.type.tensor_type.shape.dim] for vi in m.graph.input if vi.name not in init}
    if not any(p for dims_ in before.values() for p in dims_):
        return PinnedDims()
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        logger = logging.getLogger("onnxruntime.tools.symbolic_shape_infer")
        level = logger.level
        logger.setLevel(logging.CRITICAL)  # (its warnings about ops it guesses are not the user's business)
        try:
            inferred = SymbolicShapeInference.infer_shapes(m, auto_merge=True)
        finally:
            logger.setLevel(level)
    except Exception:  # (a model it cannot read: nothing pinned, as before)
        return PinnedDims()
    if inferred is None:
        return PinnedDims()
    known = set(symbolic_dims(m))
    fixed: dict[str, int] = {}
    same: dict[str, str] = {}
    for vi in inferred.graph.input:
        params = before.get(vi.name)
        if params is None:
            continue
        for p, d in zip(params, vi.type.tensor_type.shape.dim, strict=False):
            if p is None:
                continue
            if d.HasField("dim_value") and d.dim_value > 0:
                fixed.setdefault(p, int(d.dim_value))
            elif d.dim_param and d.dim_param != p and d.dim_param in known:
                same.setdefault(p, d.dim_param)
    # dims that must be equal, as groups (the inference merges them in an order of its own): each group is
    # drawn once, as its dim that comes first among the inputs; a group holding a fixed dim is fixed
    order = symbolic_dims(m)
    parent = {d: d for d in order}

    def root(d: str) -> str:
        while parent[d] != d:
            d = parent[d]
        return d

    for a, b in same.items():
        ra, rb = root(a), root(b)
        if ra != rb:
            first, second = sorted((ra, rb), key=order.index)
            parent[second] = first
    groups: dict[str, list[str]] = {}
    for d in order:
        groups.setdefault(root(d), []).append(d)
    joined: dict[str, str] = {}
    for rep, members in groups.items():
        value = next((fixed[d] for d in members if d in fixed), None)
        for d in members:
            if value is not None:
                fixed[d] = value
            elif d != rep:
                joined[d] = rep
    return PinnedDims(fixed, joined)


def _builder_spec(target: Any) -> tuple[dict[str, tuple[int, int]], tuple[Any, ...], PinnedDims]:
    """(dim name -> (low, high), constraints, pins) from a builder function's `dims` / `constraints`
    attributes, or from a ModelProto's symbolic dims with the default range and what it pins of them."""
    if callable(target) and not hasattr(target, "graph"):
        spec = dict(getattr(target, "dims", {}) or {})
        if not spec:
            raise ValueError(f"builder {getattr(target, '__name__', target)!r} declares no `dims` ranges; give bounds: dims(builder, name=(low, high), ...)")
        return {k: (int(v[0]), int(v[1])) for k, v in spec.items()}, tuple(getattr(target, "constraints", ()) or ()), PinnedDims()
    pins = pinned_dims(target)
    return {d: (pins.fixed[d], pins.fixed[d]) if d in pins.fixed else _DEFAULT_RANGE for d in symbolic_dims(target)}, (), pins


def _satisfied(constraint: Any, values: Mapping[str, int]) -> bool:
    if callable(constraint):
        return bool(constraint(values))
    return bool(eval(constraint, {"__builtins__": {}}, dict(values)))  # builders' own expressions


def dims(target: Any, *, max_size: int | None = None, **bounds: int | tuple[int, int]) -> st.SearchStrategy[dict[str, int]]:
    """A strategy for a dict of dim values for a builder (its `dims` ranges and `constraints`, e.g.
    "hidden % heads == 0") or a model (its symbolic input dims, default 1..64).

    Keyword bounds override one dim: `c=(1, 256)` draws c in [1, 256]; `a=2` pins a. `max_size` bounds the
    product of all dims (elements of the largest input), to keep examples cheap.
    """
    spec, constraints, pins = _builder_spec(target)
    given: dict[str, tuple[int, int]] = {}  # dim drawn -> the bounds given for it (a dim another is drawn as: theirs too)
    for name, b in bounds.items():
        if name not in spec:
            raise ValueError(f"dims(): {name!r} is not a dim of this model/builder; its dims are {sorted(spec)}")
        if isinstance(b, int):
            b = (b, b)
        lo, hi = int(b[0]), int(b[1])
        if not 0 <= lo <= hi:
            raise ValueError(f"dims(): bounds for {name!r} must satisfy 0 <= low <= high, got ({lo}, {hi})")
        if name in pins.fixed and (lo, hi) != spec[name]:
            v = pins.fixed[name]
            raise ValueError(f"dims(): {name}={(lo, hi) if lo != hi else lo}: {pins.why(name)}, and onnxruntime fails on any other value; drop {name!r} from the bounds (it is drawn as {v}) or give {name}={v}")
        drawn = pins.same.get(name, name)  # (dims that must be equal: one draw, within every bound given for them)
        if drawn in given:
            lo, hi = max(lo, given[drawn][0]), min(hi, given[drawn][1])
            if lo > hi:
                raise ValueError(f"dims(): the bounds given for {name!r} and for the dims it must equal leave no value in common ({pins.why(name) if name in pins.same else 'they are drawn as one'}); give one range")
        given[drawn] = (lo, hi)
    spec.update(given)
    if max_size is not None and max_size < 1:
        raise ValueError(f"dims(): max_size must be >= 1, got {max_size}")
    order = list(spec)
    # each expression constraint is checked as soon as every dim it names is drawn: the dim that
    # completes it is drawn from the values that satisfy it (no rejection sampling, good shrinking)
    staged: dict[str, list[Any]] = {n: [] for n in order}
    late: list[Any] = []
    for c in constraints:
        names = _names(c) if isinstance(c, str) else None
        if names is None or not names <= set(order):
            late.append(c)
            continue
        last = max(names, key=order.index)
        staged[last].append(c)

    @st.composite
    def draw_dims(draw: Any) -> dict[str, int]:
        from hypothesis import reject

        values: dict[str, int] = {}
        for name in order:
            if name in pins.same:  # (drawn once, for the dim it must equal)
                continue
            lo, hi = spec[name]
            checks = staged[name]
            if checks and hi - lo <= 4096:
                candidates = [v for v in range(lo, hi + 1) if all(_satisfied(c, {**values, name: v}) for c in checks)]
                if not candidates:
                    reject()
                values[name] = draw(st.sampled_from(candidates))
            else:
                values[name] = draw(st.integers(lo, hi))
                if checks and not all(_satisfied(c, values) for c in checks):
                    reject()
        if pins.same:
            values = {name: values[pins.same[name]] if name in pins.same else values[name] for name in order}
        if late and not all(_satisfied(c, values) for c in late):
            reject()
        if max_size is not None and math.prod(values.values()) > max_size:
            reject()
        return values

    return draw_dims()


def _names(expression: str) -> set[str]:
    return set(compile(expression, "<constraint>", "eval").co_names)


def _regime_values(regime: str, dt: DType, shape: tuple[int, ...], gen: torch.Generator, rng: tuple[float, float] | None) -> torch.Tensor:
    work = torch.float64 if dt == DType.FLOAT64 else torch.float32
    if regime == "normal":
        return torch.randn(shape, generator=gen, dtype=work)
    if regime == "uniform":
        low, high = rng or (-1.0, 1.0)
        return torch.rand(shape, generator=gen, dtype=work) * (high - low) + low
    if regime == "large":
        # magnitudes up to 1/16 of the dtype's max: a few additions or a square overflow
        top = math.log2(dt.max) - 4
        exps = torch.rand(shape, generator=gen, dtype=work) * (top / 2) + top / 2
        sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(work)
        return sign * torch.exp2(exps)
    if regime == "tiny":
        # around the smallest normal: subnormals and values that underflow when squared
        base = math.log2(dt.tiny)
        exps = torch.rand(shape, generator=gen, dtype=work) * 12 + (base - 6)
        sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0).to(work)
        return sign * torch.exp2(exps)
    if regime == "special":
        x = torch.randn(shape, generator=gen, dtype=work)
        specials = torch.tensor([0.0, -0.0, dt.tiny / 4, -dt.tiny / 4, dt.max, -dt.max, math.inf, -math.inf, math.nan, 1.0], dtype=work)
        pick = torch.randint(0, len(specials), shape, generator=gen)
        mask = torch.rand(shape, generator=gen) < 0.3
        return torch.where(mask, specials[pick], x)
    raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")


def feeds(
    model: Any,
    dims: Mapping[str, int] | st.SearchStrategy[dict[str, int]],
    dtype: Any = None,
    *,
    regime: str | st.SearchStrategy[str] = "uniform",
    device: str = "cpu",
) -> st.SearchStrategy[dict[str, torch.Tensor]]:
    """A strategy for feeds of `model`: tensors per input for the given dims (a dict, or a strategy from
    `dims()`, composed with flatmap), floating inputs in `dtype` and drawn in a value regime:

    - "uniform": each input's recorded range (as `random_feeds`), "normal": N(0, 1),
    - "large": magnitudes near the dtype's max (overflow), "tiny": around the smallest normal (underflow),
    - "special": a mix of zeros, subnormals, ±max, ±inf and NaN.

    Integer inputs are drawn in their recorded range. Values come from a seeded torch generator whose
    seed hypothesis draws (and shrinks), so a failure reproduces from hypothesis's database.
    """

    m = load_model(model)
    if isinstance(regime, str) and regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    override = dtype_of(dtype) if dtype is not None else None
    dims_st = dims if isinstance(dims, st.SearchStrategy) else st.just(dict(dims))
    regime_st = regime if isinstance(regime, st.SearchStrategy) else st.just(regime)

    def build(args: tuple[dict[str, int], str, int]) -> dict[str, torch.Tensor]:
        values, reg, seed = args
        return make_feeds(m, values, reg, seed, dtype=override, device=device)

    return st.tuples(dims_st, regime_st, st.integers(0, 2**31 - 1)).map(build)


def make_feeds(model: Any, values: Mapping[str, int], regime: str, seed: int, *, dtype: Any = None, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The feeds one example of `feeds()` draws: deterministic in (dims, regime, seed), so a failure
    report's three values reproduce it."""
    from ..models.feeds import _ranges

    m = load_model(model)
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; valid: {', '.join(REGIMES)}")
    override = dtype_of(dtype) if dtype is not None else None
    ranges = _ranges(m)
    init = {i.name for i in m.graph.initializer}
    gen = torch.Generator().manual_seed(int(seed))
    out = {}
    for vi in m.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param in values:
                shape.append(int(values[d.dim_param]))
            else:
                raise ValueError(f"no value for dim {d.dim_param!r} of input {vi.name!r}; dims given: {sorted(values)}")
        dt = DType(tt.elem_type)
        if override is not None and dt.is_floating_point:
            dt = override
        if dt.is_floating_point:
            t = _regime_values(regime, dt, tuple(shape), gen, ranges.get(vi.name)).to(dt.torch)
        elif dt == DType.BOOL:
            t = torch.rand(tuple(shape), generator=gen) < 0.5
        else:
            lo, hi = ranges.get(vi.name, (0, 10))
            t = torch.randint(int(lo), int(hi), tuple(shape), generator=gen).to(dt.torch)
        out[vi.name] = t.to(device)
    return out


def providers() -> st.SearchStrategy[str]:
    """Providers the current pytest run enabled (`--ort-providers`), CPU outside pytest."""
    return st.sampled_from(selection.current().providers)


def dtypes() -> st.SearchStrategy[str]:
    """Dtypes the current pytest run enabled (`--ort-dtypes`), float32 outside pytest."""
    return st.sampled_from(selection.current().dtypes)
