"""Models above protobuf's 2 GB: they exist only as a file whose weights sit in external data files, and
can be checked, run, blamed and reproduced from that file (onnx.checker and onnxruntime read them there;
nothing serializes the weights).

Writing 2 GB per test is not an option: each test lowers `model_io.PROTOBUF_LIMIT` below its small model's
size, so that the model takes the very path a real one takes (`serialized()` says None). The one place a
real model differs, protobuf's own error when asked to serialize more than 2 GB, has its own test;
`benchmarks/large_model.py` runs a real 2.4 GB export end to end.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from google.protobuf.message import EncodeError

from pytest_ortdiff import Checker, OrtRunner, blame, models
from pytest_ortdiff.cli import main
from pytest_ortdiff.engine.check import ToleranceBroken
from pytest_ortdiff.runtimes.model_io import EXTERNAL_DATA_FOLDER, check_model, serialized

model_io = importlib.import_module("pytest_ortdiff.runtimes.model_io")
DIMS = {"a": 2, "b": 16, "c": 64}


def _wrong_epsilon_layer_norm(x: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), scale, bias, eps=1e-1)


PLANTED = {"layer_norm": _wrong_epsilon_layer_norm}


def _save(model: onnx.ModelProto, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    model = onnx.ModelProto.FromString(model.SerializeToString())  # (saving moves a proto's own weights out)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    return path


def _lnmm() -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The LayerNorm -> MatMul -> Add graph, its weights initializers (as an export's are)."""
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims=DIMS, seed=1)
    weights = [i.name for i in model.graph.input if i.name != "X"]
    model.graph.initializer.extend(onnx.numpy_helper.from_array(feeds.pop(name).numpy(), name) for name in weights)
    kept = [i for i in model.graph.input if i.name == "X"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model, feeds


@pytest.fixture
def large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any], onnx.ModelProto]:
    """The LayerNorm -> MatMul -> Add graph saved with its weights in a data file, and a protobuf limit
    below its size (above its file without the weights): "above 2 GB" for everything that reads it."""
    model, feeds = _lnmm()
    path = _save(model, tmp_path / "large")
    skeleton = path.stat().st_size
    assert skeleton < model.ByteSize() // 4
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 2 * skeleton + 1024)
    assert serialized(onnx.load(str(path))) is None
    return path, feeds, model


def test_serialized_tells_protobufs_size_refusal_from_other_errors() -> None:
    class Refused:
        def __init__(self, size: int | None) -> None:
            self.size = size

        def SerializeToString(self) -> bytes:
            raise EncodeError("Failed to serialize proto")  # (what upb says above 2 GB)

        def ByteSize(self) -> int:
            if self.size is None:
                raise EncodeError("Failed to serialize proto")  # (upb cannot even count a 2.4 GB model)
            return self.size

    assert serialized(Refused(None)) is None  # type: ignore[arg-type]
    assert serialized(Refused(2**31)) is None  # type: ignore[arg-type]
    with pytest.raises(EncodeError):  # under the limit the failure is something else: it is not hidden
        serialized(Refused(100))  # type: ignore[arg-type]
    assert "larger than 2 GB, which protobuf cannot serialize" in str(model_io.too_large("the model", Refused(None)))  # type: ignore[arg-type]
    small = models.layer_norm_matmul_add(dtype="float32")
    assert serialized(small) == small.SerializeToString()


def test_a_large_model_from_its_file_checks_and_runs_as_the_small_one(large: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path, feeds, model = large
    checker = Checker("CPU", "float32")
    checked = checker.prepare(path, feeds)
    assert checked.data == b"" and checked.path == str(path.resolve())
    assert checked.nbytes == path.stat().st_size + (path.parent / "model.onnx.data").stat().st_size
    assert checked.source == checked.path  # onnxruntime opens the file
    assert checker.check(path, feeds).passed
    got = {runtime: checker.run(path, feeds, runtime=runtime) for runtime in ("ort", "torch", "float64")}
    # checked once per version of its files: new weights written there are another model
    assert check_model(onnx.load(str(path)), path=path).digest == checked.digest
    changed = onnx.load(str(path))
    w = changed.graph.initializer[0]
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w) * 2, w.name))
    onnx.save_model(changed, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    assert check_model(onnx.load(str(path)), path=path).digest != checked.digest
    # the same numbers as the model in memory, below the limit again
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 2**31 - 1)
    for runtime, outputs in got.items():
        for a, b in zip(outputs, Checker("CPU", "float32").run(model, feeds, runtime=runtime), strict=True):
            assert torch.equal(a, b), runtime


def test_a_large_model_in_memory_is_refused_with_the_fix(large: Any) -> None:
    path, feeds, _ = large
    proto = onnx.load(str(path))
    fix = r"is larger than 2 GB \(0\.0 GiB\), which protobuf cannot serialize: pass the path of its \.onnx file"
    with pytest.raises(ValueError, match=fix):
        Checker("CPU", "float32").check(proto, feeds)
    with pytest.raises(ValueError, match=fix):
        OrtRunner(proto)
    with pytest.raises(ValueError, match=fix):
        blame(proto, feeds)


def _rows(table: Any) -> list[tuple[Any, ...]]:
    return [(r.node, r.explained, r.local_max_abs, r.drift_max_abs, r.oracle_max_abs, r.exact, r.skipped) for r in table]


def test_blame_of_a_large_model_names_the_planted_kernel_as_the_small_one(large: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path, feeds, model = large
    table = blame(path, feeds, kernels=PLANTED)
    assert table.culprit is not None and table.culprit.node == "layer_norm"
    checker = Checker("CPU", "float32", tolerance={"atol": 1e-6, "rtol": 0})
    with pytest.raises(ToleranceBroken) as info:
        checker.check(path, feeds, kernels=PLANTED, blame=True)
    carried = info.value.result.blame
    assert carried is not None and carried.culprit is not None and carried.culprit.node == "layer_norm"
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 2**31 - 1)
    small = blame(model, feeds, kernels=PLANTED)
    assert _rows(table) == _rows(small) == _rows(carried)


def test_every_value_of_a_large_model_comes_from_one_session_over_its_files(large: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ortdiff.engine.blame import ort_intermediates

    path, feeds, model = large
    made: list[Any] = []
    real = OrtRunner.__init__

    def spy(self: OrtRunner, model: Any, **kwargs: Any) -> None:
        made.append((type(model).__name__, len(model) if isinstance(model, bytes) else 0, dict(kwargs.get("session_options") or {})))
        real(self, model, **kwargs)

    monkeypatch.setattr(OrtRunner, "__init__", spy)
    got = ort_intermediates(path, feeds)
    ((kind, size, options),) = made
    # the model's file without its weights plus the exposed outputs, its weights read from their folder
    assert kind == "bytes" and size < path.stat().st_size + 1024 and options[EXTERNAL_DATA_FOLDER] == str(path.parent.resolve())
    monkeypatch.setattr(OrtRunner, "__init__", real)
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 2**31 - 1)
    want = ort_intermediates(model, feeds)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_reproducibility_of_a_large_model_runs_from_its_file(large: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ortdiff.engine.reproducible import check_reproducible

    path, feeds, _ = large
    report = check_reproducible(path, feeds, vary=("threads",), runs=2)
    assert report.variations and all(not v.error for v in report.variations)
    with pytest.raises(ValueError, match="larger than 2 GB"):
        check_reproducible(onnx.load(str(path)), feeds, runs=2)
    # the localiser's every-value copy reads the weights from their folder too: it runs (two runs alike)
    reproducible = importlib.import_module("pytest_ortdiff.engine.reproducible")
    exposed, config = model_io.exposed_for_ort(onnx.load(str(path), load_external_data=False), None, path)
    assert config == {EXTERNAL_DATA_FOLDER: str(path.parent.resolve())}
    assert reproducible._localise_ort(exposed, config, onnx.load(str(path)), feeds, "CPU", {}, None, 2) == reproducible._NOT_LOCALISED


def test_bytes_with_external_data_open_where_the_session_options_name_their_folder(tmp_path: Path) -> None:
    model, feeds = _lnmm()
    path = _save(model, tmp_path / "m")
    skeleton = path.read_bytes()
    with pytest.raises(ValueError, match=rf"pass the model's path.*or name their folder in session_options=\{{'{EXTERNAL_DATA_FOLDER}'"):
        OrtRunner(skeleton)
    (y,) = OrtRunner(skeleton, session_options={EXTERNAL_DATA_FOLDER: str(path.parent)}).run(None, feeds)
    (want,) = OrtRunner(path).run(None, feeds)
    assert torch.equal(y, want)
    with pytest.raises(FileNotFoundError, match=r"the model's bytes \(external data in '.*elsewhere'\): the data of tensor .* which does not exist"):
        OrtRunner(skeleton, session_options={EXTERNAL_DATA_FOLDER: str(tmp_path / "elsewhere")})


def test_the_compare_command_takes_a_large_model_file(large: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path, _, _ = large
    rc = main(["compare", str(path), "--dim", "a=2", "--dim", "b=16", "--dim", "c=64"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "torch evaluator vs onnxruntime CPU float32" in out


def test_graph_notes_of_a_large_float16_model_come_from_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ortdiff.engine.blame import ort_graph_notes

    model = models.fp16_hazards("softmax")
    want = ort_graph_notes(model)
    if not want or "inserted" not in want[0]:
        pytest.skip("this onnxruntime build has float16 kernels for Exp/ReduceSum/Div on CPU")
    path = _save(model, tmp_path / "fp16")
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", 16)
    assert ort_graph_notes(path) == want
    assert ort_graph_notes(onnx.load(str(path))) == []  # (in memory: no file to read; notes are a bonus, no error)


def test_aligning_executions_refuses_a_large_model_with_what_to_do_instead(large: Any) -> None:
    from pytest_ortdiff.analyses.align import check_optimization, compare_executions

    path, feeds, _ = large
    with pytest.raises(ValueError, match=r"'a' is larger than 2 GB: aligning executions serializes the model again.*Checker\.check\(path, feeds, blame=True\)"):
        compare_executions(path, path, feeds, labels=("'a'", "b"))
    with pytest.raises(ValueError, match="the model is larger than 2 GB"):
        check_optimization(path, feeds)


def test_a_model_file_under_2_gb_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # whether a model read from its file is above 2 GB comes from the files load_model saw, not from
    # reading the file again: a test checking a model file at every provider x dtype pays one parse each
    model, feeds = _lnmm()
    path = _save(model, tmp_path / "small")
    reads: list[str] = []
    real = onnx.load_model

    def spy(f: Any, *args: Any, **kwargs: Any) -> onnx.ModelProto:
        reads.append(str(f))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(onnx, "load_model", spy)
    checked = Checker("CPU", "float32").prepare(path, feeds)
    assert checked.data and checked.path is None and reads == []
    assert model_io.model_files(path) == [path.resolve(), (path.parent / "model.onnx.data").resolve()] and reads == []
    path.touch()  # (another version of the file: read again)
    assert model_io.model_files(path)[0] == path.resolve() and reads == [str(path.resolve())]


def test_fuzzing_a_large_model_runs_it_from_its_file(large: Any) -> None:
    from pytest_ortdiff.analyses.fuzz import fuzz

    path, _, _ = large
    result = fuzz(Checker("CPU", "float32"), path, dims={"a": (1, 3), "b": (1, 8), "c": (64, 64)}, max_examples=3)
    assert result.examples >= 1 and result.passed


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_real_export_above_the_limit_gives_the_in_memory_numbers_and_table(exporter: str, dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the Whisper-like front end (Conv1d + GELU + positional embedding + attention) exported by each torch
    # exporter, saved as a model above 2 GB is (weights in a data file): from its path, the same outputs on
    # every runtime and the same blame table as the model in memory
    from real_models import MODELS, export

    torch_dtype = getattr(torch, dtype)
    model = export("whisper", exporter, torch_dtype)
    inits = {i.name for i in model.graph.initializer}
    assert len(inits) >= 4  # (the weights are initializers: what goes to the data file)
    names = [i.name for i in model.graph.input if i.name not in inits]
    feeds = dict(zip(names, MODELS["whisper"].inputs(torch_dtype), strict=True))
    path = _save(model, tmp_path / exporter)
    checker = Checker("CPU", dtype)
    want = {runtime: checker.run(model, feeds, runtime=runtime) for runtime in ("ort", "torch")}
    want_table = blame(model, feeds, dtype=dtype)
    monkeypatch.setattr(model_io, "PROTOBUF_LIMIT", path.stat().st_size)  # (the file without its weights fits)
    assert checker.prepare(path, feeds).path == str(path.resolve())  # (from its file: "above 2 GB")
    for runtime, outputs in want.items():
        for a, b in zip(checker.run(path, feeds, runtime=runtime), outputs, strict=True):
            assert torch.equal(a, b), runtime
    table = blame(path, feeds, dtype=dtype)
    assert _rows(table) == _rows(want_table)
    assert table.notes == want_table.notes and table.first_divergence == want_table.first_divergence


def test_a_large_model_runs_from_its_file_on_cuda(large: Any) -> None:
    from pytest_ortdiff.runtimes.providers import unavailable_reason

    why = unavailable_reason("CUDA")
    if why:
        pytest.skip(f"CUDA: {why}")
    path, feeds, _ = large
    checker = Checker("CUDA", "float32")
    assert checker.check(path, feeds).passed
    table = blame(path, feeds, provider="CUDA", kernels=PLANTED)
    assert table.culprit is not None and table.culprit.node == "layer_norm"
