"""onnxruntime's NCHWc layout ops in the torch evaluator: conv nets saved by onnxruntime at ORT_ENABLE_ALL
(its NCHWc transformer's graph: blocked convolutions with fused activations and sums, pools, upsampling,
reorders) run in the evaluator and its float64 oracle, matching onnxruntime."""

from __future__ import annotations

import io
import os
import tempfile
import warnings
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from real_models import export
from torch import nn

from pytest_ortdiff import TorchEvaluator
from pytest_ortdiff.runtimes.kernels.contrib.layout import nchwc_block_size, reorder_filter

NCHWC = "com.microsoft.nchwc"


class _ConvNet(nn.Module):
    """Convolutions (first layer on 3 channels, strided, depthwise with a residual sum, pointwise), max and
    average pools, nearest and bilinear upsampling, and the pools of a classifier head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 24, 3, padding=1, stride=2)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.c3 = nn.Conv2d(24, 32, 1)
        self.c4 = nn.Conv2d(32, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.c1(x))
        y = F.relu(self.c2(y))
        y = F.relu(y + self.dw(y))
        y = torch.sigmoid(self.c3(y))
        z = F.avg_pool2d(F.max_pool2d(y, 2), 3, stride=1, padding=1)
        z = F.interpolate(z, scale_factor=2.0, mode="nearest") + F.interpolate(z, scale_factor=2.0, mode="bilinear")
        z = F.leaky_relu(self.c4(z + y), 0.1)
        return torch.cat([F.adaptive_avg_pool2d(z, 1), F.adaptive_max_pool2d(z, 1)], 1).flatten(1)


def _saved_at_enable_all(model: onnx.ModelProto) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        so.log_severity_level = 3  # (its warning that the file suits this machine only)
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(so.optimized_model_filepath)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture(scope="module")
def conv_net() -> tuple[onnx.ModelProto, np.ndarray]:
    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_ConvNet().eval(), (torch.randn(1, 3, 16, 16),), buf, dynamo=False, opset_version=17, input_names=["x"])
    return _saved_at_enable_all(onnx.load_from_string(buf.getvalue())), np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)


def test_conv_net_saved_at_enable_all_runs_in_the_evaluator(conv_net: tuple[onnx.ModelProto, np.ndarray]) -> None:
    model, x = conv_net
    ops = Counter(n.op_type for n in model.graph.node if n.domain == NCHWC)
    # the NCHWc graph onnxruntime writes (no ReorderInput: the first conv reads NCHW; torch exports the
    # global max pool as a MaxPool): the one-node cases hold the others
    assert {"Conv", "MaxPool", "AveragePool", "Upsample", "GlobalAveragePool", "ReorderOutput"} <= set(ops)
    assert any(a.name == "activation" for n in model.graph.node if n.op_type == "Conv" for a in n.attribute)
    assert any(len(n.input) > 3 and n.input[3] for n in model.graph.node if n.domain == NCHWC and n.op_type == "Conv")  # a fused sum
    expected = _ort(model, {"x": x})
    ours = TorchEvaluator(model).run(None, {"x": torch.from_numpy(x)})[0]
    oracle = TorchEvaluator(model, compute_dtype="float64").run(None, {"x": torch.from_numpy(x)})[0]
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5 * scale, rtol=0)
    np.testing.assert_allclose(oracle.numpy(), expected, atol=1e-5 * scale, rtol=0)


def test_resnet_block_saved_at_enable_all() -> None:
    model = _saved_at_enable_all(export("resnet_folded", "torchscript"))
    assert any(n.domain == NCHWC and n.op_type == "Conv" for n in model.graph.node)
    x = np.random.default_rng(1).standard_normal((1, 4, 16, 16)).astype(np.float32)
    name = model.graph.input[0].name
    expected = _ort(model, {name: x})
    ours = TorchEvaluator(model).run(None, {name: torch.from_numpy(x)})[0]
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5 * float(np.abs(expected).max()), rtol=0)


def test_reorder_filter_matches_onnxruntimes_weights(conv_net: tuple[onnx.ModelProto, np.ndarray]) -> None:
    # the layout the kernels read is the one onnxruntime wrote: the first conv's OIHW weights, reordered
    model, _ = conv_net
    first = next(n for n in model.graph.node if n.domain == NCHWC and n.op_type == "Conv")
    stored = onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == first.input[1]))
    block = nchwc_block_size()
    assert block in (8, 16) and stored.shape[0] % block == 0
    torch.manual_seed(0)
    w = _ConvNet().c1.weight.detach()
    padded = torch.zeros(stored.shape)
    padded[: w.shape[0]] = w
    np.testing.assert_array_equal(reorder_filter(padded, block, nchw_input=True).numpy(), stored)
