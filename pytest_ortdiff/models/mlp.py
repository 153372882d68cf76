"""MLPs (Linear -> ReLU -> Linear, and Linear -> GELU -> Linear), and the twin machinery
every builder of the zoo shares.

A zoo builder returns an `onnx.ModelProto` whose weights are initializers drawn from a seeded
`torch.Generator`, and records its name and keyword arguments in the model's metadata
(`ortdiff.builder`, `ortdiff.builder_args`). `torch_twin(model)` reads them back and returns the eager
`torch.nn.Module` computing the same function: its state dict *is* the graph's initializers (same names,
same layouts), its `forward` takes the graph's inputs in order, by the same names, and returns the
graph's outputs (one tensor, or a tuple in graph order).
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import onnx
import onnx.helper as oh
import torch

from ..numerics.dtypes import DType, dtype_of
from ..runtimes.ort import load_model
from .feeds import set_feed_range

__all__ = ["BUILDER_ARGS_KEY", "BUILDER_KEY", "MLP", "GeluMLP", "OnnxTwin", "builder_info", "gelu_mlp", "mlp", "torch_twin"]

BUILDER_KEY = "ortdiff.builder"
BUILDER_ARGS_KEY = "ortdiff.builder_args"

# builder name -> twin class (filled by OnnxTwin subclasses)
_TWINS: dict[str, type[OnnxTwin]] = {}


# -- metadata and twins ---------------------------------------------------------------------------


def record_builder(model: onnx.ModelProto, name: str, args: Mapping[str, Any]) -> None:
    """Store the builder's name and keyword arguments (JSON) in the model's metadata."""
    for key, value in ((BUILDER_KEY, name), (BUILDER_ARGS_KEY, json.dumps(dict(args), sort_keys=True))):
        for p in model.metadata_props:
            if p.key == key:
                p.value = value
                break
        else:
            model.metadata_props.add(key=key, value=value)


def builder_info(model: Any) -> tuple[str, dict[str, Any]]:
    """(builder name, keyword arguments) a zoo model was built with; ValueError for other models."""
    m = load_model(model)
    props = {p.key: p.value for p in m.metadata_props}
    if BUILDER_KEY not in props:
        if m.graph.name == "layer_norm_matmul_add":  # the reference graph's builder predates the metadata
            (ln,) = [n for n in m.graph.node if n.op_type == "LayerNormalization"]
            eps = next((a.f for a in ln.attribute if a.name == "epsilon"), 1e-5)
            return "layer_norm_matmul_add", {"epsilon": eps}
        raise ValueError(
            f"model {m.graph.name!r} was not built by a pytest_ortdiff.models builder (no {BUILDER_KEY!r} metadata); "
            f"torch twins exist for: {', '.join(sorted([*_TWINS, 'layer_norm_matmul_add']))}"
        )
    return props[BUILDER_KEY], json.loads(props.get(BUILDER_ARGS_KEY, "{}"))


def torch_twin(model: Any) -> torch.nn.Module:
    """The eager torch twin of a zoo model, holding the model's initializers as its state dict.

    `torch_twin(m)(**feeds)` computes in eager torch what `m` computes in onnxruntime (one tensor, or a
    tuple in the graph's output order).
    """
    name, args = builder_info(model)
    if name == "layer_norm_matmul_add":
        from .layer_norm import LayerNormMatMulAdd

        return LayerNormMatMulAdd(epsilon=float(args.get("epsilon", 1e-5))).eval()
    cls = _TWINS.get(name)
    if cls is None:
        raise ValueError(f"no torch twin for builder {name!r}; twins exist for: {', '.join(sorted(_TWINS))}")
    return cls.from_onnx(model)


class OnnxTwin(torch.nn.Module):
    """Base of the zoo's eager twins: constructed from the builder's keyword arguments (the same seeded
    weights the builder draws), or from a built model with `from_onnx(model)` (its initializers loaded as
    the state dict, so a model whose weights were edited still has a matching twin)."""

    builder: ClassVar[str] = ""

    def __init_subclass__(cls, builder: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if builder:
            cls.builder = builder
            _TWINS[builder] = cls

    @classmethod
    def from_onnx(cls, model: Any) -> OnnxTwin:
        m = load_model(model)
        name, args = builder_info(m)
        if name != cls.builder:
            raise ValueError(f"{cls.__name__} is the twin of {cls.builder!r}, this model was built by {name!r}; use models.torch_twin(model)")
        accepted = inspect.signature(cls.__init__).parameters
        twin = cls(**{k: v for k, v in args.items() if k in accepted})
        from ..numerics.tensors import from_onnx_tensor

        state = {init.name: from_onnx_tensor(init) for init in m.graph.initializer}
        twin.load_state_dict(state, strict=True)
        return twin.eval()


# -- building graphs --------------------------------------------------------------------------------


def tensor_proto(name: str, t: torch.Tensor) -> onnx.TensorProto:
    """An initializer from a torch tensor (bfloat16 included), bit for bit."""
    t = t.detach().cpu().contiguous()
    proto = onnx.TensorProto()
    proto.name = name
    proto.dims.extend(t.shape)
    proto.data_type = dtype_of(t.dtype).onnx
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    proto.raw_data = raw.numpy().tobytes()
    return proto


class GraphBuilder:
    """A few conveniences over onnx.helper: named nodes, Constant nodes, initializers, one dtype.

    `op(op_type, *inputs, name=..., outputs=1, **attrs)` returns the output name (or names); node and
    output share the name, so reports and blame tables speak the graph's own words.
    """

    def __init__(self, name: str, dtype: Any) -> None:
        self.name = name
        self.dtype = dtype_of(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()

    def _fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def input(self, name: str, shape: list[Any], elem_type: int | None = None) -> str:
        self._names.add(name)
        self.inputs.append(oh.make_tensor_value_info(name, self.dtype.onnx if elem_type is None else elem_type, shape))
        return name

    def output(self, value: str, name: str, shape: list[Any], elem_type: int | None = None) -> None:
        """Expose `value` as graph output `name` (renaming the producing node's output)."""
        if value != name:
            for node in self.nodes:
                for i, o in enumerate(node.output):
                    if o == value:
                        node.output[i] = name
                for i, x in enumerate(node.input):
                    if x == value:
                        node.input[i] = name
        self.outputs.append(oh.make_tensor_value_info(name, self.dtype.onnx if elem_type is None else elem_type, shape))

    def initializer(self, name: str, t: torch.Tensor) -> str:
        self._names.add(name)
        self.initializers.append(tensor_proto(name, t))
        return name

    def op(self, op_type: str, *inputs: str, name: str | None = None, outputs: int = 1, **attrs: Any) -> Any:
        base = self._fresh(name or op_type.lower())
        outs = [base] if outputs == 1 else [self._fresh(f"{base}_{i}") for i in range(outputs)]
        self.nodes.append(oh.make_node(op_type, list(inputs), outs, name=base, **attrs))
        return outs[0] if outputs == 1 else outs

    def const(self, value: Any, elem_type: int | None = None, name: str = "const") -> str:
        """A Constant node holding `value` (a python number/list) in `elem_type` (default: the graph's dtype)."""
        dt = DType(self.dtype.onnx if elem_type is None else elem_type)
        t = torch.tensor(value, dtype=torch.float64 if dt.is_floating_point else torch.int64).to(dt.torch)
        out = self._fresh(name)
        self.nodes.append(oh.make_node("Constant", [], [out], name=out, value=tensor_proto(out, t)))
        return out

    def model(self, opset: int) -> onnx.ModelProto:
        model = oh.make_model(
            oh.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers),
            ir_version=max(9, oh.find_min_ir_version_for([oh.make_opsetid("", opset)])),
            opset_imports=[oh.make_opsetid("", opset)],
        )
        return model


def uniform(gen: torch.Generator, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float32) * (high - low) + low


def linear_weight(gen: torch.Generator, shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
    """torch.nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn in float32."""
    bound = 1.0 / math.sqrt(fan_in)
    return uniform(gen, shape, -bound, bound)


def dim(value: Any, default: str) -> Any:
    """A dim for make_tensor_value_info: an int fixes it, a string names a symbolic dim."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"dim {default!r} must be an int (fixed) or a str (symbolic name), got {value!r}")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"dim {default!r} must be >= 1, got {value}")
    return value


def check_positive(**values: int) -> None:
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive int, got {v!r}")


# -- mlp: Linear -> ReLU -> Linear ----------------------------------------------------------------


def _mlp_weights(in_features: int, hidden: int, out_features: int, dtype: Any, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = {
        "fc1.weight": linear_weight(gen, (hidden, in_features), in_features),
        "fc1.bias": linear_weight(gen, (hidden,), in_features),
        "fc2.weight": linear_weight(gen, (out_features, hidden), hidden),
        "fc2.bias": linear_weight(gen, (out_features,), hidden),
    }
    return {k: v.to(dtype_of(dtype).torch) for k, v in w.items()}


def _two_layer(name: str, activation: str, dtype: Any, opset: int, in_features: int, hidden: int, out_features: int, batch: Any, seed: int, approximate: str = "none") -> onnx.ModelProto:
    check_positive(in_features=in_features, hidden=hidden, out_features=out_features)
    if opset < 13:
        raise ValueError(f"{name} needs opset >= 13, got opset={opset}")
    g = GraphBuilder(name, dtype)
    x = g.input("X", [dim(batch, "batch"), in_features])
    for k, v in _mlp_weights(in_features, hidden, out_features, dtype, seed).items():
        g.initializer(k, v)
    h = g.op("Gemm", x, "fc1.weight", "fc1.bias", name="fc1", transB=1)
    if activation == "relu":
        a = g.op("Relu", h, name="relu")
    elif opset >= 20:
        a = g.op("Gelu", h, name="gelu", approximate=approximate)
    elif approximate == "none":
        # 0.5 * x * (1 + erf(x / sqrt(2))), what exporters emit below opset 20
        e = g.op("Erf", g.op("Div", h, g.const(math.sqrt(2.0), name="sqrt2"), name="gelu_div"), name="gelu_erf")
        a = g.op("Mul", g.op("Mul", h, g.const(0.5, name="half"), name="gelu_half"), g.op("Add", e, g.const(1.0, name="one"), name="gelu_add"), name="gelu")
    else:
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        cube = g.op("Mul", g.op("Mul", h, h, name="gelu_sq"), h, name="gelu_cube")
        inner = g.op("Add", h, g.op("Mul", cube, g.const(0.044715, name="c"), name="gelu_cubic"), name="gelu_inner")
        t = g.op("Tanh", g.op("Mul", inner, g.const(math.sqrt(2.0 / math.pi), name="k"), name="gelu_scaled"), name="gelu_tanh")
        a = g.op("Mul", g.op("Mul", h, g.const(0.5, name="half"), name="gelu_half"), g.op("Add", t, g.const(1.0, name="one"), name="gelu_add"), name="gelu")
    y = g.op("Gemm", a, "fc2.weight", "fc2.bias", name="fc2", transB=1)
    g.output(y, "Y", [dim(batch, "batch"), out_features])
    model = g.model(opset)
    set_feed_range(model, "X", -2.0, 2.0)
    return model


def mlp(*, dtype: Any = "float32", opset: int = 18, in_features: int = 10, hidden: int = 32, out_features: int = 1, batch: int | str = "batch", seed: int = 0) -> onnx.ModelProto:
    """The MLP: Y = Gemm(Relu(Gemm(X, fc1.weight, fc1.bias, transB=1)), fc2.weight, fc2.bias, transB=1).

    X is [batch, in_features] (batch symbolic unless an int is given), in [-2, 2); the weights are
    initializers in torch.nn.Linear's layout and init, drawn from `seed`. Twin: `MLP`.
    """
    model = _two_layer("mlp", "relu", dtype, opset, in_features, hidden, out_features, batch, seed)
    record_builder(model, "mlp", {"dtype": dtype_of(dtype).short, "opset": opset, "in_features": in_features, "hidden": hidden, "out_features": out_features, "batch": batch, "seed": seed})
    return model


mlp.dims = {"in_features": (1, 64), "hidden": (1, 128), "out_features": (1, 16), "batch": (1, 64)}  # type: ignore[attr-defined]
mlp.build_dims = ("in_features", "hidden", "out_features")  # type: ignore[attr-defined]
mlp.constraints = ()  # type: ignore[attr-defined]


def gelu_mlp(*, dtype: Any = "float32", opset: int = 18, in_features: int = 16, hidden: int = 64, out_features: int = 16, batch: int | str = "batch", approximate: str = "none", seed: int = 0) -> onnx.ModelProto:
    """Linear -> GELU -> Linear (a transformer's MLP): Gemm, then `Gelu` at opset >= 20 or its exporter
    decomposition below (Erf for approximate="none", Tanh for "tanh"), then Gemm. Twin: `GeluMLP`."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    model = _two_layer("gelu_mlp", "gelu", dtype, opset, in_features, hidden, out_features, batch, seed, approximate)
    record_builder(model, "gelu_mlp", {"dtype": dtype_of(dtype).short, "opset": opset, "in_features": in_features, "hidden": hidden, "out_features": out_features, "batch": batch, "approximate": approximate, "seed": seed})
    return model


gelu_mlp.dims = {"in_features": (1, 64), "hidden": (1, 128), "out_features": (1, 64), "batch": (1, 64)}  # type: ignore[attr-defined]
gelu_mlp.build_dims = ("in_features", "hidden", "out_features")  # type: ignore[attr-defined]
gelu_mlp.constraints = ()  # type: ignore[attr-defined]


class MLP(OnnxTwin, builder="mlp"):
    """Eager twin of `mlp`: torch.nn.Linear -> ReLU -> torch.nn.Linear (state dict = the initializers)."""

    def __init__(self, in_features: int = 10, hidden: int = 32, out_features: int = 1, dtype: Any = "float32", seed: int = 0) -> None:
        super().__init__()
        dt = dtype_of(dtype).torch
        self.fc1 = torch.nn.Linear(in_features, hidden, dtype=dt)
        self.fc2 = torch.nn.Linear(hidden, out_features, dtype=dt)
        self.load_state_dict(_mlp_weights(in_features, hidden, out_features, dtype, seed))

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(h)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(X)))


class GeluMLP(MLP, builder="gelu_mlp"):
    """Eager twin of `gelu_mlp`: torch.nn.Linear -> GELU -> torch.nn.Linear."""

    def __init__(self, in_features: int = 16, hidden: int = 64, out_features: int = 16, dtype: Any = "float32", approximate: str = "none", seed: int = 0) -> None:
        super().__init__(in_features, hidden, out_features, dtype, seed)
        self.approximate = approximate

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(h, approximate=self.approximate)
