"""float16 hazards: small graphs whose intermediates leave float16's range when computed in
float16 — Pow, ReduceMean, Exp/Softmax overflowing 65504, Log and Div of values that underflowed to 0.

Each graph is what an exporter writes for a common pattern, computed entirely in the model's dtype; its
recorded feed range (`random_feeds`) makes the hazard happen in float16 while every output of the true
(float64) function stays well inside float16's range, so the float64 oracle cast to float16 is finite
and the float16 run is not. In float32, bfloat16 (float32's exponent range) and float64 the same feeds
are harmless: these graphs are how the report of a float16 overflow or underflow looks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx
import torch

from ..numerics.dtypes import dtype_of
from .feeds import set_feed_range
from .mlp import GraphBuilder, OnnxTwin, dim, record_builder

__all__ = ["FP16Hazard", "fp16_hazards"]

_I64 = onnx.TensorProto.INT64
# transformers' T5LayerNorm / LlamaRMSNorm epsilon (1e-6 is a float16 subnormal, still non-zero)
_RMS_EPS = 1e-6


@dataclass(frozen=True)
class _Hazard:
    pattern: str  # what the graph computes
    low: float  # the recorded feed range of X
    high: float
    why: str  # what goes wrong in float16 with feeds in that range


_KINDS: dict[str, _Hazard] = {
    "pow": _Hazard(
        "Y = Sqrt(ReduceSum(Pow(X, 2), axes=-1)): the magnitude of X [batch, n, 2] (re, im) pairs, as "
        "torch.abs of a view_as_real STFT is exported",
        -400.0,
        400.0,
        "x**2 > 65504 for |x| > 255.9, and re**2 + im**2 overflows once the magnitude passes 255.9 (about "
        "68 % of the pairs): +inf where the true magnitude is at most 566",
    ),
    "reduce_mean": _Hazard(
        "Y = X / Sqrt(ReduceMean(Pow(X, 2), axes=-1) + 1e-6): T5 / Llama RMS norm without the float32 "
        "upcast",
        -400.0,
        400.0,
        "x**2 overflows for |x| > 255.9 (36 % of the elements), the row's mean of squares is +inf, and "
        "x / inf = 0: a row of 64 is wiped to zeros (all but certainly: 1 - 0.64**64) where the true "
        "output is within about [-2, 2]",
    ),
    "softmax": _Hazard(
        "Y = Exp(X) / ReduceSum(Exp(X), axes=-1): softmax decomposed without subtracting the row max",
        -20.0,
        20.0,
        "exp(x) > 65504 for x > 11.09: inf / inf = NaN there, and finite / inf = 0 elsewhere in the row, "
        "where the true probabilities are in [0, 1]",
    ),
    "log": _Hazard(
        "Y = Log(X * X): the log power of a signal (log |x|**2, as log-spectrogram and log-energy features "
        "compute it)",
        -1e-4,
        1e-4,
        "x * x < 2.98e-8 rounds to 0 for |x| < 1.73e-4 (every element here) and log(0) = -inf, where the "
        "true log power is between -33.3 (the smallest non-zero float16 input) and -18.4",
    ),
    "div": _Hazard(
        "Y = X / Sqrt(ReduceSum(Pow(X, 2), axes=-1)): L2 normalization (x / x.norm(dim=-1)) written out",
        -1e-4,
        1e-4,
        "x**2 < 2.98e-8 rounds to 0 for |x| < 1.73e-4 (every element here), the norm is 0 and x / 0 = ±inf "
        "(0 / 0 = NaN), where the true output is within [-1, 1]",
    ),
}


def fp16_hazards(kind: str, *, dtype: Any = "float16", opset: int = 18, batch: int | str = "batch", n: int | str = "n") -> onnx.ModelProto:
    """A graph whose float16 computation overflows or underflows for its recorded feeds.

    `kind` (all in `fp16_hazards.kinds`), input X and output Y, every node in `dtype`:

    - "pow": X [batch, n, 2] in [-400, 400), Y = Sqrt(ReduceSum(Pow(X, 2), axes=-1)) [batch, n]: Pow
      overflows, Y is +inf where the true magnitude is at most 566;
    - "reduce_mean": X [batch, n] in [-400, 400), Y = X / Sqrt(ReduceMean(Pow(X, 2)) + 1e-6): the mean
      of squares is +inf, whole rows of Y become 0;
    - "softmax": X [batch, n] in [-20, 20), Y = Exp(X) / ReduceSum(Exp(X)): Exp overflows, NaN (inf / inf)
      and zeros;
    - "log": X [batch, n] in [-1e-4, 1e-4), Y = Log(X * X): the squares underflow to 0, -inf;
    - "div": X [batch, n] in [-1e-4, 1e-4), Y = X / Sqrt(ReduceSum(Pow(X, 2))): the squares underflow to
      0, ±inf (and NaN for x = 0).

    `batch`, `n`: a name keeps the dim symbolic, an int fixes it. The reductions run over the last axis,
    so make `n` large enough (64 in the examples) for every row to hold a hazardous value. Twin:
    `FP16Hazard(kind)`.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown fp16 hazard kind {kind!r}; valid: {', '.join(_KINDS)}")
    if opset < 13:
        raise ValueError(f"fp16_hazards needs opset >= 13 (ReduceSum with axes as an input), got opset={opset}")
    dims = [dim(batch, "batch"), dim(n, "n")]
    g = GraphBuilder(f"fp16_hazard_{kind}", dtype)
    x = g.input("X", [*dims, 2] if kind == "pow" else dims)

    def square(v: str) -> str:
        return g.op("Pow", v, g.const(2.0, name="two"), name="square")

    def reduce(op: str, v: str, name: str, keepdims: int) -> str:
        if op == "ReduceMean" and opset < 18:  # axes became an input in opset 18
            return g.op(op, v, name=name, axes=[-1], keepdims=keepdims)
        return g.op(op, v, g.const([-1], _I64, name="last_axis"), name=name, keepdims=keepdims)

    if kind == "pow":
        y = g.op("Sqrt", reduce("ReduceSum", square(x), "sum_squares", 0), name="magnitude")
    elif kind == "reduce_mean":
        ms = reduce("ReduceMean", square(x), "mean_square", 1)
        rms = g.op("Sqrt", g.op("Add", ms, g.const(_RMS_EPS, name="eps"), name="add_eps"), name="rms")
        y = g.op("Div", x, rms, name="normalize")
    elif kind == "softmax":
        e = g.op("Exp", x, name="exp")
        y = g.op("Div", e, reduce("ReduceSum", e, "sum_exp", 1), name="normalize")
    elif kind == "log":
        y = g.op("Log", g.op("Mul", x, x, name="power"), name="log")
    else:
        norm = g.op("Sqrt", reduce("ReduceSum", square(x), "sum_squares", 1), name="norm")
        y = g.op("Div", x, norm, name="normalize")
    g.output(y, "Y", dims)
    model = g.model(opset)
    hazard = _KINDS[kind]
    set_feed_range(model, "X", hazard.low, hazard.high)
    model.doc_string = f"{hazard.pattern}. float16 hazard for X in [{hazard.low:g}, {hazard.high:g}): {hazard.why}."
    record_builder(model, "fp16_hazards", {"kind": kind, "dtype": dtype_of(dtype).short, "opset": opset, "batch": batch, "n": n})
    return model


fp16_hazards.kinds = tuple(_KINDS)  # type: ignore[attr-defined]
# for hypothesis (pytest_ortdiff.strategies.dims): any size is a valid graph; the reductions need rows of a
# few dozen elements for the hazard to be (all but) certain, see the docstring
fp16_hazards.dims = {"batch": (1, 8), "n": (1, 256)}  # type: ignore[attr-defined]
fp16_hazards.constraints = ()  # type: ignore[attr-defined]


class FP16Hazard(OnnxTwin, builder="fp16_hazards"):
    """Eager twin of `fp16_hazards(kind)`: the same ops in the input's dtype, so float16 inputs overflow
    and underflow exactly where the graph does. `forward(X) -> Y`."""

    def __init__(self, kind: str = "softmax") -> None:
        super().__init__()
        if kind not in _KINDS:
            raise ValueError(f"unknown fp16 hazard kind {kind!r}; valid: {', '.join(_KINDS)}")
        self.kind = kind

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.kind == "pow":
            return X.pow(2).sum(-1).sqrt()
        if self.kind == "reduce_mean":
            return X / (X.pow(2).mean(-1, keepdim=True) + torch.tensor(_RMS_EPS, dtype=X.dtype)).sqrt()
        if self.kind == "softmax":
            e = X.exp()
            return e / e.sum(-1, keepdim=True)
        if self.kind == "log":
            return (X * X).log()
        return X / X.pow(2).sum(-1, keepdim=True).sqrt()
