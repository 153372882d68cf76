"""The one-node models and random feeds the normalization, activation and matmul cases are made of."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

MS = "com.microsoft"

#: case dtype -> onnx element type
ELEM = {"float32": 1, "float16": 10, "bfloat16": 16, "float64": 11}


def one_node(
    op: str,
    domain: str,
    inputs: Sequence[tuple[str, Any] | None],
    outputs: Sequence[tuple[str, int, int] | None],
    attrs: Mapping[str, Any] | None = None,
    *,
    weights: Sequence[str] = (),
    opset: int = 17,
) -> tuple[Any, dict[str, Any]]:
    """A model of one `domain::op` node and its feeds. `inputs`: (name, torch tensor) in the op's order, None
    for an omitted optional one; those named in `weights` become initializers (as an exporter writes
    gamma, beta and tables), the others graph inputs fed. `outputs`: (name, onnx element type, rank; its dims
    left unnamed), None for an output not asked for."""
    import torch
    from onnx import helper

    from ...numerics.dtypes import dtype_of

    graph_inputs, initializers, feeds = [], [], {}
    for item in inputs:
        if item is None:
            continue
        name, t = item
        if name in weights:
            raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()  # (bfloat16 has no numpy type)
            initializers.append(helper.make_tensor(name, dtype_of(t.dtype).value, list(t.shape), raw, raw=True))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, dtype_of(t.dtype).value, list(t.shape)))
            feeds[name] = t
    node = helper.make_node(
        op,
        [item[0] if item is not None else "" for item in inputs],
        [item[0] if item is not None else "" for item in outputs],
        domain=domain,
        **dict(attrs or {}),
    )
    while node.input and not node.input[-1]:
        node.input.pop()
    while node.output and not node.output[-1]:
        node.output.pop()
    graph_outputs = [helper.make_tensor_value_info(name, elem, [None] * rank) for name, elem, rank in (o for o in outputs if o is not None)]
    graph = helper.make_graph([node], f"{op}_case", graph_inputs, graph_outputs, initializer=initializers)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9), feeds


def randn(*shape: int, dtype: str = "float32", seed: int = 0, scale: float = 1.0, shift: float = 0.0) -> Any:
    """Normal values (times `scale`, plus `shift`) drawn in float32 by a seeded generator, then cast."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + shift).to(getattr(torch, dtype))


def ints(*shape: int, high: int, seed: int = 0, low: int = 0, dtype: str = "int32") -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g).to(getattr(torch, dtype))


Builder = Callable[[], tuple[Any, dict[str, Any]]]
