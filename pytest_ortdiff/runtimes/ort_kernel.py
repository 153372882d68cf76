"""One ONNX node run by onnxruntime, usable as a kernel inside TorchEvaluator.

The node becomes a one-node model with symbolic dims, so one session serves every shape of a rank.
Where onnxruntime has no float64 kernel for the op (the float64 oracle's inputs), the node runs in
float32 instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import onnx
import onnx.helper as oh
import torch

from ..dtypes import dtype_of
from .kernels.base import Kernel, KernelContext
from .ort import OrtRunner, UnsupportedByProviderError

__all__ = ["OrtKernel"]

#: sessions one kernel keeps (one per input shape once onnxruntime refused symbolic dims; one per dtype
#: and rank signature otherwise, far fewer)
_MAX_SESSIONS = 16


class OrtKernel(Kernel):
    """Runs its node with onnxruntime on the provider matching the evaluator's device."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext, opsets: Mapping[str, int], value_types: Mapping[str, Any] | None = None) -> None:
        super().__init__(node, ctx)
        self.op_type = node.op_type  # type: ignore[misc]
        self.opsets = dict(opsets)
        self.provider = "CUDA" if ctx.device.type == "cuda" else "CPU"
        self._runners: OrderedDict[tuple[Any, ...], tuple[OrtRunner, list[str], list[str]]] = OrderedDict()
        self._float32_for: set[tuple[Any, ...]] = set()  # input signatures onnxruntime lacks in float64
        # True once onnxruntime refused the model with symbolic dims: a session per input shape from then on
        self._exact_shapes = False

    def _key(self, inputs: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
        if self._exact_shapes:
            return tuple((x.dtype, tuple(x.shape)) if x is not None else None for x in inputs)
        return tuple((x.dtype, x.dim()) if x is not None else None for x in inputs)

    def _runner(self, inputs: tuple[torch.Tensor | None, ...]) -> tuple[OrtRunner, list[str], list[str]]:
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

    def _make_runner(self, inputs: tuple[torch.Tensor | None, ...], *, exact: bool) -> tuple[OrtRunner, list[str], list[str]]:
        """The node as a one-node model, its session created: its inputs declared with symbolic dims of their
        ranks (one session for every shape), or with `exact` their own shapes."""
        node = self.node
        in_names = [f"i{i}" if x is not None else "" for i, x in enumerate(inputs)]
        out_names = [f"o{i}" if o else "" for i, o in enumerate(node.output)]
        graph_inputs = [
            oh.make_tensor_value_info(n, dtype_of(x.dtype).onnx, list(x.shape) if exact else [f"d{i}_{j}" for j in range(x.dim())])
            for i, (n, x) in enumerate(zip(in_names, inputs, strict=True))
            if x is not None
        ]
        graph_outputs = [oh.make_empty_tensor_value_info(n) for n in out_names if n]
        one = oh.make_node(node.op_type, in_names, out_names, domain=node.domain, name=node.name or node.op_type)
        one.attribute.extend(node.attribute)
        opsets = [oh.make_opsetid(d, v) for d, v in self.opsets.items()]
        model = oh.make_model(oh.make_graph([one], f"single_{node.op_type}", graph_inputs, graph_outputs), opset_imports=opsets, ir_version=9)
        runner = OrtRunner(model, provider=self.provider)
        runner.session  # noqa: B018  (created here: a model onnxruntime refuses fails now, not in the run)
        return (runner, [n for n in in_names if n], [n for n in out_names if n])

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        key = tuple((x.dtype, x.dim()) if x is not None else None for x in inputs)
        if key not in self._float32_for:
            try:
                return self._run(inputs)
            except UnsupportedByProviderError:
                # The float64 oracle feeds float64, for which onnxruntime lacks many kernels (Hardmax,
                # ...): this node then runs in float32, inputs cast down and outputs back up.
                if not any(x is not None and x.dtype == torch.float64 for x in inputs):
                    raise
                self._float32_for.add(key)
        down = tuple(x.to(torch.float32) if x is not None and x.dtype == torch.float64 else x for x in inputs)
        return tuple(y.to(torch.float64) if y.dtype == torch.float32 else y for y in self._run(down))

    def _run(self, inputs: tuple[torch.Tensor | None, ...]) -> tuple[torch.Tensor, ...]:
        runner, in_names, out_names = self._runner(inputs)
        feeds = dict(zip(in_names, [x for x in inputs if x is not None], strict=True))
        outs = iter(runner.run(out_names, feeds))
        return tuple(next(outs) if o else torch.empty(0, device=self.ctx.device) for o in self.node.output)
