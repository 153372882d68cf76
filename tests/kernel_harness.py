"""Shared harness for kernel tests: one-node (or small) models checked against onnx.reference and onnxruntime.

Every kernel family's test module imports from here instead of copying the helpers:

    from kernel_harness import one_node_model, check_node

`check_node` runs a model through the torch evaluator in float32, float16 and the float64 oracle and
compares it with onnx.reference (float32 / float64 models) and onnxruntime (CPU, float32 / float16), with
tolerances that say how far each reference is allowed to be.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
import onnx.shape_inference
import onnxruntime as ort
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff.numerics.tensors import to_numpy, to_torch
from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.ort import OrtRunner

__all__ = [
    "FLOAT_TYPES",
    "REF_TOL",
    "assert_outputs_close",
    "check_node",
    "given",
    "one_node_model",
    "ort_session",
    "output_names",
    "retype",
    "run_ort",
    "run_reference",
    "run_torch",
]

#: (rtol, atol) per dtype for a kernel against a reference computing in the same precision.
REF_TOL = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "float16": (4e-3, 2e-3),
    "bfloat16": (3e-2, 1e-2),
}
FLOAT_TYPES = {
    "float64": (TensorProto.DOUBLE, np.float64),
    "float32": (TensorProto.FLOAT, np.float32),
    "float16": (TensorProto.FLOAT16, np.float16),
}


def one_node_model(
    op: str,
    inputs: Mapping[str, np.ndarray | None],
    outputs: list[str],
    opset: int,
    *,
    domain: str = "",
    initializers: Mapping[str, np.ndarray] | None = None,
    ir_version: int | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    """`op` on graph inputs named and typed after `inputs` (None = an omitted optional input) and on
    `initializers` (constant inputs: axes, shapes, scales); outputs named in `outputs` ("" = not asked),
    typed by ONNX shape inference and checked in full. Input order: `inputs` then `initializers`, unless a
    name of `initializers` also appears in `inputs` (as None) to fix its place."""
    initializers = dict(initializers or {})
    order = list(inputs) + [n for n in initializers if n not in inputs]
    present = {n for n in order if (inputs.get(n) is not None) or n in initializers}
    while order and order[-1] not in present:
        order.pop()
    while outputs and not outputs[-1]:
        outputs = outputs[:-1]
    node = helper.make_node(
        op, [n if n in present else "" for n in order], outputs, domain=domain or None, **attrs
    )
    graph_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in inputs.items()
        if a is not None and n not in initializers
    ]
    inits = [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()]
    graph = helper.make_graph(
        [node], op, graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs if o], inits
    )
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    kwargs = {"ir_version": ir_version} if ir_version is not None else {}
    model = helper.make_model(graph, opset_imports=opsets, **kwargs)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def retype(model: onnx.ModelProto, dtype: str) -> onnx.ModelProto:
    """The same model with every float32 input, output, value_info and initializer retyped to `dtype`."""
    target, np_type = FLOAT_TYPES[dtype]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = target
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT:
            arr = onnx.numpy_helper.to_array(init).astype(np_type)
            g.initializer[i].CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    return out


def run_torch(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    compute_dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> list[np.ndarray]:
    ev = TorchEvaluator(model, compute_dtype=compute_dtype, **kwargs)
    out = ev.run(None, {k: to_torch(v) for k, v in feeds.items()})
    return [to_numpy(t) for t in out]


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return list(ReferenceEvaluator(model).run(None, dict(feeds)))


def ort_session(model: onnx.ModelProto, **session_options: Any) -> ort.InferenceSession:
    """onnxruntime's CPU session of `model`, cached, at an IR version this onnxruntime reads (onnx 1.23
    writes IR 14 by default, onnxruntime 1.31 reads <= 13: OrtRunner lowers it for a model that needs
    nothing newer)."""
    return OrtRunner(model, session_options=session_options or None).session


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort_session(model, graph_optimization_level="disable")
    return list(sess.run(None, dict(feeds)))


def assert_outputs_close(
    got: list[np.ndarray],
    expected: list[np.ndarray],
    tol: tuple[float, float],
    names: Iterable[str],
    *,
    check_dtype: bool = True,
) -> None:
    __tracebackhide__ = True
    names = list(names)
    assert len(got) == len(expected), f"{len(got)} outputs instead of {len(expected)}"
    for name, g, e in zip(names, got, expected, strict=True):
        g, e = np.asarray(g), np.asarray(e)
        if check_dtype:
            assert g.dtype == e.dtype, f"{name}: {g.dtype} instead of {e.dtype}"
        assert g.shape == e.shape, f"{name}: {g.shape} instead of {e.shape}"
        if g.dtype.kind in "biu" and e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e, err_msg=name)
        else:
            np.testing.assert_allclose(
                g.astype(np.float64), e.astype(np.float64), rtol=tol[0], atol=tol[1], err_msg=name
            )


def output_names(model: onnx.ModelProto) -> list[str]:
    return [o.name for o in model.graph.output]


def given(feeds: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """The feeds of the inputs present (the model is built from all of them, None marking the omitted)."""
    return {k: v for k, v in feeds.items() if v is not None}


def _cast_feeds(feeds: Mapping[str, np.ndarray], np_type: Any) -> dict[str, np.ndarray]:
    return {k: v.astype(np_type) if v.dtype == np.float32 else v for k, v in feeds.items()}


def check_node(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    dtypes: Iterable[str] = ("float32", "float16", "float64"),
    reference: str = "both",
    tol: Mapping[str, tuple[float, float]] | None = None,
) -> None:
    """The evaluator on `model` (typed float32, with float32 `feeds`) against the references.

    - float32: the evaluator vs onnx.reference and/or onnxruntime on the float32 model.
    - float16: the model retyped to float16, vs onnxruntime (and onnx.reference) on it.
    - float64: the float64 oracle (`compute_dtype=torch.float64`) vs onnx.reference on the model retyped
      to float64, where that is possible (and vs onnxruntime in float32 loosely otherwise).
    `reference`: "both", "onnx" or "ort" — which references are trusted for this op.
    """
    __tracebackhide__ = True
    tols = {**REF_TOL, **(tol or {})}
    names = output_names(model)
    for dtype in dtypes:
        if dtype == "float64":
            wide = retype(model, "float64")
            f64 = _cast_feeds(feeds, np.float64)
            got = run_torch(wide, f64)
            if reference in ("both", "onnx"):
                assert_outputs_close(got, run_reference(wide, f64), tols["float64"], names)
            # the oracle on the float32 model: float64 inside, output in float64 for floating outputs
            oracle = run_torch(model, feeds, compute_dtype=torch.float64)
            exp32 = run_ort(model, feeds) if reference == "ort" else run_reference(model, feeds)
            assert_outputs_close(oracle, exp32, tols["float32"], names, check_dtype=False)
            continue
        m = model if dtype == "float32" else retype(model, dtype)
        f = feeds if dtype == "float32" else _cast_feeds(feeds, FLOAT_TYPES[dtype][1])
        got = run_torch(m, f)
        if reference in ("both", "ort"):
            assert_outputs_close(got, run_ort(m, f), tols[dtype], names)
        if reference in ("both", "onnx") and dtype == "float32":
            assert_outputs_close(got, run_reference(m, f), tols[dtype], names)
