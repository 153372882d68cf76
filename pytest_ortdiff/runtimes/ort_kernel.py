"""One ONNX node run by onnxruntime, usable as a kernel inside TorchEvaluator.

The node becomes a one-node model with symbolic dims, so one session serves every shape of a rank.
Where onnxruntime has no float64 kernel for the op (the float64 oracle's inputs), the node runs in
float32 instead. Values of the types onnxruntime's Python API does not carry (int4, uint4, int2, uint2,
float8) cross as int8/uint8/float32 and are Cast inside the one-node model; the inputs of a node whose
onnxruntime kernel computes differently when they are constant (MatMulNBits prepacks its weights) are
initializers of the one-node model where they are constants of the model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import onnx
import onnx.helper as oh
import torch

from ..numerics.dtypes import dtype_of
from ..numerics.tensors import to_numpy
from .kernels.base import Kernel, KernelContext
from .kernels.quantization import FLOAT8_TYPES, SUB_BYTE_TYPES, storage, tag
from .ort import OrtRunner, UnsupportedByProviderError

__all__ = ["CONSTANT_SENSITIVE", "OrtKernel"]

#: ops whose onnxruntime kernel computes differently when some of their inputs are constant: MatMulNBits
#: prepacks a constant B (with its scales and zero points), and only a prepacked B takes the accuracy_level=4
#: path that quantizes A to int8 (MLAS CompInt8); fed as an input, B is dequantized to float32 and multiplied
#: in float32. The inputs of these that are constants of the model are initializers of the one-node model.
CONSTANT_SENSITIVE = frozenset({("com.microsoft", "MatMulNBits")})

_TP = onnx.TensorProto
# onnx type -> (the type its values cross as, the opset whose Cast has the type): onnxruntime's Python API
# has no numpy type for these, and the carrier holds every value exactly
_CARRIERS: dict[int, tuple[int, int]] = {
    _TP.INT4: (_TP.INT8, 21),
    _TP.UINT4: (_TP.UINT8, 21),
    _TP.INT2: (_TP.INT8, 25),
    _TP.UINT2: (_TP.UINT8, 25),
    _TP.FLOAT8E4M3FN: (_TP.FLOAT, 19),
    _TP.FLOAT8E4M3FNUZ: (_TP.FLOAT, 19),
    _TP.FLOAT8E5M2: (_TP.FLOAT, 19),
    _TP.FLOAT8E5M2FNUZ: (_TP.FLOAT, 19),
    _TP.FLOAT8E8M0: (_TP.FLOAT, 25),
}
_LOW_TORCH = {**SUB_BYTE_TYPES, **FLOAT8_TYPES}  # onnx type -> torch dtype
_LOW_ONNX = {dt: code for code, dt in _LOW_TORCH.items()}
# onnxruntime's type strings of the carried types
_ORT_TYPE_NAMES = {f"tensor({_TP.DataType.Name(code).lower()})": code for code in _CARRIERS}


def _onnx_type(dtype: torch.dtype) -> int:
    code = _LOW_ONNX.get(dtype)
    return code if code is not None else dtype_of(dtype).onnx


def _carry(x: torch.Tensor) -> torch.Tensor:
    """A tensor of a carried type as its carrier: the byte view of a 2/4-bit one, float32 for float8."""
    return storage(x) if x.dtype in _SUB_BYTE_TORCH else x.to(torch.float32)


def _initializer(name: str, x: torch.Tensor) -> onnx.TensorProto:
    import onnx.numpy_helper

    return onnx.numpy_helper.from_array(to_numpy(x), name)


_SUB_BYTE_TORCH = frozenset(SUB_BYTE_TYPES.values())
_IR_VERSION = 10  # (int4/uint4 and float8 need 9 or more; onnxruntime 1.2x reads 10)

#: sessions one kernel keeps (one per input shape once onnxruntime refused symbolic dims; one per dtype
#: and rank signature otherwise, far fewer)
_MAX_SESSIONS = 16


class OrtKernel(Kernel):
    """Runs its node with onnxruntime on the provider matching the evaluator's device."""

    def __init__(
        self,
        node: onnx.NodeProto,
        ctx: KernelContext,
        opsets: Mapping[str, int],
        value_types: Mapping[str, Any] | None = None,
        constants: Collection[str] = (),
    ) -> None:
        """`constants`: names of the model's constant values (its initializers); read for the ops in
        CONSTANT_SENSITIVE only."""
        super().__init__(node, ctx)
        self.op_type = node.op_type  # type: ignore[misc]
        self.opsets = dict(opsets)
        self.provider = "CUDA" if ctx.device.type == "cuda" else "CPU"
        self._runners: OrderedDict[tuple[Any, ...], _OneNode] = OrderedDict()
        self._float32_for: set[tuple[Any, ...]] = set()  # input signatures onnxruntime lacks in float64
        # True once onnxruntime refused the model with symbolic dims: a session per input shape from then on
        self._exact_shapes = False
        #: input positions held as initializers of the one-node model
        self.constant_inputs = (
            frozenset(i for i, x in enumerate(node.input) if x and x in constants)
            if (node.domain or "", node.op_type) in CONSTANT_SENSITIVE
            else frozenset()
        )

    def _key(self, inputs: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
        key: tuple[Any, ...]
        if self._exact_shapes:
            key = tuple((x.dtype, tuple(x.shape)) if x is not None else None for x in inputs)
        else:
            key = tuple((x.dtype, x.dim()) if x is not None else None for x in inputs)
        if self.constant_inputs:  # a constant's value is its name's (and its shape)
            key += tuple((self.node.input[i], tuple(inputs[i].shape)) for i in sorted(self.constant_inputs) if inputs[i] is not None)  # type: ignore[union-attr]
        return key

    def _runner(self, inputs: tuple[torch.Tensor | None, ...]) -> _OneNode:
        key = self._key(inputs)
        hit = self._runners.get(key)
        if hit is not None:
            if self._exact_shapes:
                self._runners.move_to_end(key)
            return hit
        exact = self._exact_shapes  # (read once: another thread may switch it while this one builds)
        try:
            hit = self._make_runner(inputs, exact=exact)
        except UnsupportedByProviderError:
            raise
        except Exception:
            if exact:
                raise
            # onnxruntime's shape inference refuses a few nodes whose inputs have symbolic dims (a Resize
            # given `sizes`: "Number of elements of input 'sizes' (0) must be same as rank of input 'X'"):
            # declared with the inputs' own shapes, they run
            try:
                hit = self._make_runner(inputs, exact=True)
            except UnsupportedByProviderError:  # (no kernel at this dtype: run() computes in float32 then)
                self._switch_to_exact_shapes()
                raise
            except Exception:
                pass
            else:
                self._switch_to_exact_shapes()
            if hit is None:
                raise
        self._runners[self._key(inputs)] = hit
        while len(self._runners) > _MAX_SESSIONS:  # (a session per shape: the least recently used goes)
            self._runners.popitem(last=False)
        return hit

    def _switch_to_exact_shapes(self) -> None:
        if not self._exact_shapes:
            self._exact_shapes = True
            self._runners.clear()

    def _make_runner(self, inputs: tuple[torch.Tensor | None, ...], *, exact: bool) -> _OneNode:
        """The node as a one-node model, its session created: its inputs declared with symbolic dims of their
        ranks (one session for every shape), or with `exact` their own shapes; the constant inputs of a
        CONSTANT_SENSITIVE op as initializers; values of carried types crossing as their carriers."""
        node = self.node
        in_names = [f"i{i}" if x is not None else "" for i, x in enumerate(inputs)]
        out_names = [f"o{i}" if o else "" for i, o in enumerate(node.output)]
        graph_inputs, initializers, casts_in = [], [], []
        feed_names: list[str] = []
        carried_in: list[bool] = []
        opset = 0  # the default domain's opset the Casts need
        for i, (n, x) in enumerate(zip(in_names, inputs, strict=True)):
            if x is None:
                continue
            if i in self.constant_inputs:
                initializers.append(_initializer(n, x))
                continue
            code = _onnx_type(x.dtype)
            dims = list(x.shape) if exact else [f"d{i}_{j}" for j in range(x.dim())]
            carrier = _CARRIERS.get(code)
            if carrier is None:
                graph_inputs.append(oh.make_tensor_value_info(n, code, dims))
                feed_names.append(n)
            else:
                graph_inputs.append(oh.make_tensor_value_info(f"{n}_carried", carrier[0], dims))
                casts_in.append(oh.make_node("Cast", [f"{n}_carried"], [n], to=code))
                feed_names.append(f"{n}_carried")
                opset = max(opset, carrier[1])
            carried_in.append(carrier is not None)
        one = oh.make_node(node.op_type, in_names, out_names, domain=node.domain, name=node.name or node.op_type)
        one.attribute.extend(node.attribute)

        def build(out_types: Mapping[str, int]) -> tuple[OrtRunner, list[str]]:
            outputs, casts_out, need = [], [], opset
            fetch = []
            for n in out_names:
                if not n:
                    continue
                carrier = _CARRIERS.get(out_types.get(n, 0))
                if carrier is None:
                    outputs.append(oh.make_empty_tensor_value_info(n))
                    fetch.append(n)
                    continue
                casts_out.append(oh.make_node("Cast", [n], [f"{n}_carried"], to=carrier[0]))
                outputs.append(oh.make_empty_tensor_value_info(f"{n}_carried"))
                fetch.append(f"{n}_carried")
                need = max(need, carrier[1])
            opsets = dict(self.opsets)
            if need > opsets.get("", 0):
                # the Casts need an opset that has the type; a contrib node does not read the default
                # domain's (a default-domain node of such a type has that opset already)
                opsets[""] = need
            graph = oh.make_graph([*casts_in, one, *casts_out], f"single_{node.op_type}", graph_inputs, outputs, initializers)
            model = oh.make_model(graph, opset_imports=[oh.make_opsetid(d, v) for d, v in opsets.items()], ir_version=_IR_VERSION)
            # errors only: onnxruntime warns for a node run alone what it would not for the model ("Expected shape
            # from model of {-1,-1,0} does not match actual shape ..." on every call), which is no news to the user
            runner = OrtRunner(model, provider=self.provider, session_options={"log_severity_level": 3})
            runner.session  # noqa: B018  (created here: a model onnxruntime refuses fails now, not in the run)
            return runner, fetch

        runner, fetch = build({})
        # an output of a carried type (known once onnxruntime has typed the node) crosses as its carrier too
        out_types = {o.name: _ORT_TYPE_NAMES[o.type] for o in runner.session.get_outputs() if o.type in _ORT_TYPE_NAMES}
        if out_types:
            runner, fetch = build(out_types)
        retag = [_LOW_TORCH[out_types[n]] if n in out_types else None for n in out_names if n]
        return _OneNode(runner, feed_names, carried_in, fetch, retag)

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        key = tuple((x.dtype, x.dim()) if x is not None else None for x in inputs)
        if key not in self._float32_for:
            try:
                return self._run(inputs)
            except Exception as exc:
                # The float64 oracle feeds float64, for which onnxruntime lacks many kernels (Hardmax,
                # ...) and many contrib ops' schemas have no type ("Type 'tensor(double)' of input
                # parameter ... is invalid"): this node then runs in float32, inputs cast down and
                # outputs back up.
                if not any(x is not None and x.dtype == torch.float64 for x in inputs):
                    raise
                if not isinstance(exc, UnsupportedByProviderError) and "tensor(double)" not in str(exc):
                    raise
                self._float32_for.add(key)
        down = tuple(x.to(torch.float32) if x is not None and x.dtype == torch.float64 else x for x in inputs)
        return tuple(y.to(torch.float64) if y.dtype == torch.float32 else y for y in self._run(down))

    def _run(self, inputs: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, ...]:
        one = self._runner(inputs)
        fed = [x for i, x in enumerate(inputs) if x is not None and i not in self.constant_inputs]
        feeds = {n: _carry(x) if carried else x for n, x, carried in zip(one.feed_names, fed, one.carried_in, strict=True)}
        outs = iter([y if dt is None else _uncarry(y, dt) for y, dt in zip(one.runner.run(one.fetch, feeds), one.retag, strict=True)])
        return tuple(next(outs) if o else torch.empty(0, device=self.ctx.device) for o in self.node.output)


class _OneNode(NamedTuple):
    """A session of the one-node model and how values cross it."""

    runner: OrtRunner
    feed_names: list[str]  # per fed input (the constants aside), in order
    carried_in: list[bool]  # per fed input: crosses as its carrier
    fetch: list[str]  # per present output
    retag: list[torch.dtype | None]  # per present output: the carried type it comes back as


def _uncarry(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A carried output back in its own type (exact: the carrier holds every value of the type)."""
    return tag(y, dtype) if dtype in _SUB_BYTE_TORCH else y.to(dtype)
