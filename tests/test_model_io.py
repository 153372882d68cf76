"""model_io.load_model, the one loader: what is not an ONNX model is one ModelLoadError naming the file
and the problem (never protobuf's DecodeError), and external data is read only from regular files inside
the model's directory, reached without a symlink (issue 12, items 12 and 19)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_ortdiff import models
from pytest_ortdiff.runtimes.model_io import (
    ModelLoadError,
    expose_all_values,
    exposed_bytes,
    load_model,
)

W = np.arange(4, dtype=np.float32).reshape(2, 2)


def _external_model(directory: Path, location: str = "model.onnx.data") -> Path:
    """A model whose initializer W lives in `location`, relative to the model's directory."""
    (directory / location).parent.mkdir(parents=True, exist_ok=True)
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "XY")
    graph = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Y"])], "g", [x], [y], [numpy_helper.from_array(W, "W")])
    path = directory / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path), save_as_external_data=True, location=location, size_threshold=0)
    return path


def _relocate(path: Path, location: str) -> None:
    proto = onnx.load(str(path), load_external_data=False)
    proto.graph.initializer[0].external_data[0].value = location
    onnx.save(proto, str(path))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe location, but not a model", "not an ONNX model (Error parsing message"),
        (b"\x08\x07", "not an ONNX model (2 bytes holding no graph)"),
    ],
    ids=["garbage", "protobuf-without-graph"],
)
def test_bytes_that_are_not_a_model_name_the_file_and_the_problem(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match=re.escape(f"cannot load {str(path)!r}: {message}")):
        load_model(path)
    with pytest.raises(ModelLoadError, match=r"^cannot load the model's bytes: not an ONNX model"):
        load_model(memoryview(data))


def test_a_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"it is a directory; pass the \.onnx file in it"):
        load_model(tmp_path)


def test_external_data_next_to_the_model_loads(tmp_path: Path) -> None:
    path = _external_model(tmp_path / "m", "weights/w.bin")
    link = tmp_path / "via-link"
    link.symlink_to(path.parent)  # the model's own directory may be reached through a symlink
    for p in (path, link / "model.onnx"):
        np.testing.assert_array_equal(numpy_helper.to_array(load_model(p).graph.initializer[0]), W)


@pytest.mark.parametrize("case", ["missing", "symlink", "symlinked-dir", "dotdot", "absolute", "directory"])
def test_external_data_outside_the_model_directory_is_refused(tmp_path: Path, case: str) -> None:
    """Item 19: never read outside the model's directory, whatever onnx version is installed."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(4, 7, np.float32).tobytes())
    path = _external_model(tmp_path / "m", "sub/model.onnx.data" if case == "symlinked-dir" else "model.onnx.data")
    data = path.parent / "model.onnx.data"
    expected = {
        "missing": "which does not exist next to the model",
        "symlink": "is a symbolic link",
        "symlinked-dir": "is a symbolic link",
        "dotdot": "which is not a file inside the model's directory",
        "absolute": "which is not a file inside the model's directory",
        "directory": "which is not a regular file",
    }[case]
    if case == "missing":
        data.unlink()
    elif case == "symlink":
        data.unlink()
        data.symlink_to(secret)
    elif case == "symlinked-dir":
        sub = path.parent / "sub"
        (tmp_path / "outside").mkdir()
        os.replace(sub / "model.onnx.data", tmp_path / "outside" / "model.onnx.data")
        sub.rmdir()
        sub.symlink_to(tmp_path / "outside")
    elif case == "dotdot":
        _relocate(path, "../secret.bin")
    elif case == "absolute":
        _relocate(path, str(secret))
    else:
        data.unlink()
        data.mkdir()
    with pytest.raises(ModelLoadError, match=f"^model {str(path)!r}: tensor 'W' keeps its data in .*{expected}"):
        load_model(path)


def test_iter_graphs_and_has_subgraph_reach_nested_bodies() -> None:
    """The one graph walk the evaluator, blame and the precision search share: bodies of bodies included."""
    import onnx.helper as oh

    from pytest_ortdiff.runtimes.model_io import has_subgraph, iter_graphs

    inner = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "inner", [], [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    nested_if = oh.make_node("If", ["c"], ["z"], then_branch=inner, else_branch=inner)
    body = oh.make_graph([nested_if], "body", [], [oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1])])
    outer = oh.make_node("If", ["c"], ["out"], then_branch=body, else_branch=inner)
    graph = oh.make_graph([outer, oh.make_node("Relu", ["out"], ["r"])], "main", [], [])
    # depth first, attributes in their stored order (onnx.helper sorts them: else_branch before then_branch)
    assert [g.name for g in iter_graphs(graph)] == ["main", "inner", "body", "inner", "inner"]
    assert [has_subgraph(n) for n in graph.node] == [True, False]


def test_exposed_bytes_parse_as_the_model_with_every_value_exposed() -> None:
    """The outputs follow the model's own bytes as a second message; protobuf merges it into the first."""
    model = models.layer_norm_matmul_add(dtype="float32")
    want = expose_all_values(model)
    for data in (model.SerializeToString(), None):
        got = onnx.ModelProto()
        got.ParseFromString(exposed_bytes(model, data))
        assert got == want
        assert [o.name for o in got.graph.output] == ["Z", "norm", "mm"]
