"""The reference graph: LayerNormalization -> MatMul -> Add, and its torch twin.

X in [-60, 60) ((rand - 0.5) * 120); scale, bias, weights, bias2 in [0, 1).
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx.helper as oh
import torch

from ..numerics.dtypes import dtype_of
from .feeds import set_feed_range

__all__ = ["LayerNormMatMulAdd", "layer_norm_matmul_add"]


def layer_norm_matmul_add(*, dtype: Any = "float16", opset: int = 18, epsilon: float = 1e-5) -> onnx.ModelProto:
    """Z = LayerNormalization(X, scale, bias, axis=-1) @ weights + bias2, dims a x b x c symbolic."""
    if opset < 17:
        raise ValueError(f"LayerNormalization needs opset >= 17, got opset={opset}")
    itype = dtype_of(dtype).onnx
    model = oh.make_model(
        oh.make_graph(
            [
                oh.make_node("LayerNormalization", ["X", "scale", "bias"], ["norm"], axis=-1, epsilon=epsilon, name="layer_norm"),
                oh.make_node("MatMul", ["norm", "weights"], ["mm"], name="matmul"),
                oh.make_node("Add", ["mm", "bias2"], ["Z"], name="add"),
            ],
            "layer_norm_matmul_add",
            [
                oh.make_tensor_value_info("X", itype, ["a", "b", "c"]),
                oh.make_tensor_value_info("scale", itype, ["c"]),
                oh.make_tensor_value_info("bias", itype, ["c"]),
                oh.make_tensor_value_info("weights", itype, ["c", "c"]),
                oh.make_tensor_value_info("bias2", itype, ["c"]),
            ],
            [oh.make_tensor_value_info("Z", itype, ["a", "b", "c"])],
        ),
        ir_version=9,
        opset_imports=[oh.make_opsetid("", opset)],
    )
    set_feed_range(model, "X", -60.0, 60.0)
    for name in ("scale", "bias", "weights", "bias2"):
        set_feed_range(model, name, 0.0, 1.0)
    return model


# for hypothesis (pytest_ortdiff.strategies.dims): the range of each symbolic dim; no constraints
layer_norm_matmul_add.dims = {"a": (1, 4), "b": (1, 64), "c": (1, 256)}  # type: ignore[attr-defined]
layer_norm_matmul_add.constraints = ()  # type: ignore[attr-defined]


class LayerNormMatMulAdd(torch.nn.Module):
    """Eager twin of `layer_norm_matmul_add`: same inputs, same function."""

    def __init__(self, epsilon: float = 1e-5) -> None:
        super().__init__()
        self.epsilon = epsilon

    def forward(self, X: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, weights: torch.Tensor, bias2: torch.Tensor) -> torch.Tensor:
        norm = torch.nn.functional.layer_norm(X, (X.shape[-1],), scale, bias, self.epsilon)
        return norm @ weights + bias2
