"""A model above protobuf's 2 GB, end to end: checked, and blamed with a planted wrong kernel, from its file.

Writes a 2.4 GB float32 model (9 layers of MatMul 8192x8192 -> Add -> Tanh, the weights in one external data
file, as `torch.onnx.export` saves a model above 2 GB) into a temporary folder (or --dir), then times
`Checker.check(path, feeds)` and `blame(path, feeds, kernels={planted Tanh})` in this process, with the peak
resident memory after each. Needs ~3 GB of disk and ~12 GB of memory; takes a few minutes.

    python benchmarks/large_model.py [--layers 9] [--dir DIR]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import torch

HIDDEN = 8192


def write(folder: Path, layers: int) -> Path:
    rng = np.random.default_rng(0)
    nodes, weights = [], []
    x = "x"
    for i in range(layers):
        w = rng.random((HIDDEN, HIDDEN), dtype=np.float32)
        w -= 0.5
        w *= np.float32(3.4 / np.sqrt(HIDDEN))  # (unit variance through the layer)
        weights += [nh.from_array(w, f"layers.{i}.weight"), nh.from_array(np.full(HIDDEN, 0.01, np.float32), f"layers.{i}.bias")]
        del w
        nodes += [
            oh.make_node("MatMul", [x, f"layers.{i}.weight"], [f"mm{i}"], name=f"layers.{i}/MatMul"),
            oh.make_node("Add", [f"mm{i}", f"layers.{i}.bias"], [f"add{i}"], name=f"layers.{i}/Add"),
            oh.make_node("Tanh", [f"add{i}"], [f"h{i}"], name=f"layers.{i}/Tanh"),
        ]
        x = f"h{i}"
    graph = oh.make_graph(nodes, "large", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, HIDDEN])], [oh.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [4, HIDDEN])], weights)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    path = folder / "large.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="large.onnx.data", size_threshold=1024)
    return path


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # (kB on Linux)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=9, help="layers of 8192x8192 float32 weights (256 MiB each; default 9: 2.25 GiB)")
    parser.add_argument("--dir", type=Path, default=None, help="folder to write the model into (default: a temporary one, removed after)")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    from pytest_ortdiff import Checker, blame

    with tempfile.TemporaryDirectory() as tmp:
        folder = opts.dir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        path = write(folder, opts.layers)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"wrote {path} ({size / 2**30:.2f} GiB with its data file) in {time.perf_counter() - t:.1f} s; torch {torch.__version__}, 1 thread")
        feeds = {"x": torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(0))}
        t = time.perf_counter()
        result = Checker("CPU", "float32").check(path, feeds)
        print(f"Checker.check(path): {time.perf_counter() - t:.1f} s, passed={result.passed}, max abs {result.report.max_abs:.3g}; peak memory {peak_gb():.1f} GiB")
        planted = f"layers.{opts.layers // 2}/Tanh"
        t = time.perf_counter()
        table = blame(path, feeds, kernels={planted: lambda a: torch.tanh(a) * (1 + 1e-3)})
        took = time.perf_counter() - t
        culprit = table.culprit.node if table.culprit is not None else None
        print(f"blame(path) with {planted} planted wrong: {took:.1f} s, culprit {culprit} ({'found' if culprit == planted else 'MISSED'}); peak memory {peak_gb():.1f} GiB")
        print(table.render(top=5))


if __name__ == "__main__":
    main()
