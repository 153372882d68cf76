"""What a user brings, through real pytest runs (pytester): their own image model (Conv, MaxPool,
GlobalAveragePool) under the marker, on CPU in float32 and float16."""

from __future__ import annotations

import pytest

USER_CONV_MODEL = 'import numpy as np\nimport onnx\nimport pytest\nfrom onnx import TensorProto, helper, numpy_helper\n\nfrom pytest_ortdiff import models\n\nTYPES = {"float32": (TensorProto.FLOAT, np.float32), "float16": (TensorProto.FLOAT16, np.float16)}\n\n\ndef conv_relu_pool(dtype: str) -> onnx.ModelProto:\n    elem, np_type = TYPES[dtype]\n    rng = np.random.default_rng(0)\n    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np_type), "w")\n    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np_type), "b")\n    nodes = [\n        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),\n        helper.make_node("Relu", ["c"], ["r"]),\n        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),\n        helper.make_node("GlobalAveragePool", ["p"], ["y"]),\n    ]\n    graph = helper.make_graph(\n        nodes, "conv_relu_pool",\n        [helper.make_tensor_value_info("x", elem, ["batch", 3, 16, 16])],\n        [helper.make_tensor_value_info("y", elem, ["batch", 8, 1, 1])],\n        [w, b],\n    )\n    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])\n\n\n@pytest.mark.ortdiff(dtypes=["float32", "float16"])\ndef test_my_image_model(ortdiff):\n    model = conv_relu_pool(ortdiff.dtype)\n    feeds = models.random_feeds(model, dims={"batch": 2}, seed=0)\n    report = ortdiff.check(model, feeds)\n    assert report.max_abs < (1e-5 if ortdiff.dtype == "float32" else 2e-3)\n'


def test_a_users_conv_model_passes_in_float32_and_float16(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_image=USER_CONV_MODEL)
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(
        [
            "*test_my_image_model[[]CPU-float32[]] PASSED*",
            "*test_my_image_model[[]CPU-float16[]] PASSED*",
            "*ortdiff summary*",
        ]
    )
    result.assert_outcomes(passed=2)
