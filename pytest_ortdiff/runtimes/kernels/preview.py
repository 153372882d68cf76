"""Kernels of the ai.onnx.preview domain: FlexAttention, with its score_mod/prob_mod subgraphs run by the
evaluator that built the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import onnx
import torch

from .base import KernelContext, UnsupportedVariantError, kernel
from .controlflow import Subgraph, SubgraphKernel

__all__ = ["FlexAttention"]

_SOFTMAX_PRECISIONS = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
}


def _exact_type(t: torch.Tensor) -> torch.dtype:
    """The type torch computes a half-precision matmul or softmax in on every device: float32."""
    return torch.promote_types(t.dtype, torch.float32)


@kernel("FlexAttention", since=1, domain="ai.onnx.preview")
class FlexAttention(SubgraphKernel):
    """Scaled dot-product attention over [B, H, L, E] inputs with two optional modifier subgraphs:

        Scores = (Q * sqrt(scale)) @ (K * sqrt(scale))^T     in the inputs' type
        Scores = score_mod(Scores)                           in softmax_precision
        Probs  = Softmax(Scores, axis=-1); Probs = prob_mod(Probs)
        Y      = Probs @ V                                   in softmax_precision, then V's type

    The precision flow and sqrt(scale) (computed in float32, then cast to the inputs' type) are the op's
    function body's and onnx.reference's, so the float64 oracle scales as the float32 model does. A row
    that score_mod masks entirely (all -inf) is NaN, as the function body's Softmax makes it (torch's own
    flex_attention would give zeros). GQA: query head h reads K/V head h // (Hq / Hkv), without copying
    K and V per query head.
    """

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        scale = self.attr("scale")
        self.scale: float | None = None if scale is None else float(scale)
        precision = self.attr("softmax_precision")
        if precision is not None and int(precision) not in _SOFTMAX_PRECISIONS:
            allowed = ", ".join(f"{k} ({v})" for k, v in _SOFTMAX_PRECISIONS.items())
            raise UnsupportedVariantError(
                f"FlexAttention softmax_precision={precision}: expected one of {allowed}"
            )
        self.softmax_precision: int | None = None if precision is None else int(precision)
        self.score_mod = self._modifier("score_mod")
        self.prob_mod = self._modifier("prob_mod")
        self.use(*(g for g in (self.score_mod, self.prob_mod) if g is not None))

    def _modifier(self, attribute: str) -> Subgraph | None:
        if attribute not in self.attrs:
            return None
        graph = self.subgraph(attribute)
        if len(graph.inputs) != 1 or len(graph.outputs) != 1:
            raise ValueError(
                f"FlexAttention node {self.node.name or '?'!r}: its {attribute} graph {graph.name!r} takes "
                f"{len(graph.inputs)} inputs and makes {len(graph.outputs)} outputs; it must map one rank-4 "
                "tensor to one of the same shape"
            )
        return graph

    def _softmax_type(self, dtype: torch.dtype) -> torch.dtype:
        if self.softmax_precision is not None:
            return self.ctx.torch_dtype(self.softmax_precision)
        # half types softmax in float32, float32 and float64 in their own type (float64 in oracle mode)
        return torch.promote_types(dtype, torch.float32)

    def _root_scale(self, head_size: int) -> torch.Tensor:
        """sqrt(scale) in float32, as the function body computes it (Sqrt of a float32 constant)."""
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(head_size)
        return torch.sqrt(torch.tensor(scale, dtype=torch.float32, device=self.ctx.device))

    def _modify(
        self, graph: Subgraph | None, x: torch.Tensor, scope: dict[str, Any], collect: dict[str, Any] | None
    ) -> torch.Tensor:
        if graph is None:
            return x
        (y,) = graph.run((x,), graph.scope(scope), collect)
        if not isinstance(y, torch.Tensor) or y.shape != x.shape:
            got = f"shape {list(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
            raise ValueError(
                f"FlexAttention node {self.node.name or '?'!r}: its modifier graph {graph.name!r} returned "
                f"{got} for an input of shape {list(x.shape)}; it must preserve the shape"
            )
        # a graph that changes the element type is cast back, as onnx.reference does
        return y.to(x.dtype)

    def compute(
        self, inputs: Sequence[Any], scope: dict[str, Any], collect: dict[str, Any] | None
    ) -> tuple[Any, ...]:
        q, k, v = inputs
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(
                "FlexAttention needs rank-4 Q, K, V ([batch, heads, sequence, head_size]); got shapes "
                f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
            )
        batch, q_heads, q_len, head = q.shape
        kv_heads, kv_len = k.shape[1], k.shape[2]
        if k.shape[0] != batch or v.shape[0] != batch:
            raise ValueError(f"FlexAttention: batch sizes of Q, K, V differ: {batch}, {k.shape[0]}, {v.shape[0]}")
        if k.shape[3] != head:
            raise ValueError(f"FlexAttention: Q's head size {head} differs from K's {k.shape[3]}")
        if v.shape[1] != kv_heads or v.shape[2] != kv_len:
            raise ValueError(
                f"FlexAttention: K and V must share heads and sequence length; K {list(k.shape)}, V {list(v.shape)}"
            )
        if kv_heads == 0 or q_heads % kv_heads:
            raise ValueError(
                f"FlexAttention: Q's {q_heads} heads are not a multiple of K/V's {kv_heads} heads (GQA)"
            )
        group = q_heads // kv_heads
        dtype = q.dtype
        root = self._root_scale(head).to(dtype)
        ct = _exact_type(q)
        qs = (q * root).to(ct).reshape(batch, kv_heads, group, q_len, head)
        ks = (k * root).to(ct).unsqueeze(2)
        # [B, Hkv, G, L, S] -> [B, Hq, L, S]: query head h = kv head h // G, member h % G of its group
        scores = torch.matmul(qs, ks.transpose(-1, -2)).reshape(batch, q_heads, q_len, kv_len)
        st = self._softmax_type(dtype)
        scores = self._modify(self.score_mod, scores.to(dtype).to(st), scope, collect)
        probs = torch.softmax(scores.to(_exact_type(scores)), dim=-1).to(st)
        probs = self._modify(self.prob_mod, probs, scope, collect)
        pv = _exact_type(probs)
        grouped = probs.to(pv).reshape(batch, kv_heads, group, q_len, kv_len)
        y = torch.matmul(grouped, v.to(st).to(pv).unsqueeze(2))
        return (y.reshape(batch, q_heads, q_len, v.shape[3]).to(st).to(v.dtype),)
