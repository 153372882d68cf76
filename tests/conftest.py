"""Shared test set-up and helpers.

pytester's in-process runs restore sys.modules afterwards, dropping modules first imported inside them;
torch cannot be imported twice in one process, so the heavy modules are imported here, up front.
Helpers the test modules share are fixtures here, not copies: `cli` (the command line, in-process),
`seed_test` (a pytester module checking the seeds/000 graph), `contrib_source` / `contrib_model` (a graph
of two ops without a torch kernel) and `xdist_args` (a pytester run on two xdist workers).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import onnx.reference
import onnxruntime  # noqa: F401
import pytest
import torch

# Triton, where installed, runs its kernels in its interpreter on a machine without CUDA
# (tests/test_diff_triton.py): the switch is read when triton is first imported, so it is set here
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import device_watch

import pytest_ortdiff.numerics.diff
import pytest_ortdiff.runtimes.evaluator  # noqa: F401

# torch.onnx's exporters, for the same reason: a TorchScript export first made inside a pytester run (e.g.
# test_parity's fixture test) imports torch's dynamo exporter there, the restore drops it, and the worker's
# next dynamo export finds its op registry empty ("_registry must not be empty"): tests/test_suite_order.py
with contextlib.suppress(ImportError):
    import torch.onnx._internal.exporter._core
    import torch.onnx._internal.torchscript_exporter.utils

# -- the device watch ----------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _device_watch() -> Iterator[None]:
    """Every TorchEvaluator run of the suite fails on a tensor made without the run's device (tests/device_watch.py):
    what would put a tensor on the CPU next to CUDA ones on a GPU shows on CPU CI. ORTDIFF_DEVICE_WATCH=0: off."""
    if not device_watch.enabled():
        yield
        return
    with device_watch.watching():
        yield


# -- the terminal's width ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """xdist workers run with COLUMNS=80 in their environment, which the summary takes as a terminal 80
    columns wide; the pytester runs of this suite print their tables as to a pipe, whatever the worker.
    A test about the width sets COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


# -- the command line, in-process ------------------------------------------------------------------


@dataclass(frozen=True)
class CliResult:
    """What `python -m pytest_ortdiff ARGS` printed and returned."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _cwd(path: Path | None) -> Iterator[None]:
    old = os.getcwd()
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_cli(*args: str, cwd: Path | None = None) -> CliResult:
    """`python -m pytest_ortdiff ARGS` in this process: the same main(), without an interpreter start-up
    per call (tests/test_cli.py runs it once through `python -m` too)."""
    from pytest_ortdiff.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _cwd(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            rc = exc.code if isinstance(exc.code, int) else 1
    return CliResult(rc, out.getvalue(), err.getvalue())


@pytest.fixture
def cli() -> Callable[..., CliResult]:
    """`cli("merge", "job.json", cwd=path)`: the command line's exit status, stdout and stderr."""
    return run_cli


# -- pytester modules ------------------------------------------------------------------------------

SEED_TEST = """
import pytest
from pytest_ortdiff import models

@pytest.mark.ortdiff({marker})
def test_lnmm(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={dims}, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
"""


@pytest.fixture
def seed_test() -> Callable[..., str]:
    """The source of a test module checking the seeds/000 graph: `seed_test("dtypes=['float16']")`."""

    def source(marker: str = "", dims: str = '{"a": 2, "b": 16, "c": 32}') -> str:
        return SEED_TEST.format(marker=marker, dims=dims)

    return source


#: Inverse -> Trilu (com.microsoft): two ops onnxruntime's CPU provider runs (float32 and float64) and the torch
#: evaluator has no kernel for (contrib ops nothing the tools write needs)
CONTRIB_SOURCE = """
import onnx
import onnx.helper as oh
import torch

CONTRIB_OPS = ("com.microsoft::Inverse", "com.microsoft::Trilu")

def contrib_model(relu=False):
    nodes = [
        oh.make_node("Inverse", ["x"], ["q"], domain="com.microsoft", name="inv"),
        oh.make_node("Trilu", ["q"], ["f" if relu else "y"], domain="com.microsoft", upper=0, name="tril"),
    ] + ([oh.make_node("Relu", ["f"], ["y"], name="relu")] if relu else [])
    graph = oh.make_graph(
        nodes, "contrib", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 3])],
    )
    opsets = [oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)]
    return oh.make_model(graph, opset_imports=opsets, ir_version=9)

FEEDS = {"x": torch.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])}
"""


@pytest.fixture
def contrib_source() -> str:
    """Source defining `contrib_model(relu=False)`, `CONTRIB_OPS` and `FEEDS`, for a pytester module."""
    return CONTRIB_SOURCE


@pytest.fixture
def contrib_model() -> Callable[..., onnx.ModelProto]:
    """`contrib_model(relu=False)`: the Inverse -> Trilu graph (-> Relu with relu=True)."""
    scope: dict[str, Any] = {}
    exec(CONTRIB_SOURCE, scope)
    return scope["contrib_model"]  # type: ignore[no-any-return]


@pytest.fixture
def xdist_args() -> list[str]:
    """Arguments of a pytester run on two xdist workers (skips without pytest-xdist). pytest-benchmark,
    when installed, warns that xdist disables it, and the inner run's filterwarnings=error fails on it."""
    pytest.importorskip("xdist")
    return ["-n", "2", "-p", "xdist", "-p", "no:benchmark"]



# -- the deployed-model corpus (tests/deployed_models.py) --------------------------------------------


@pytest.fixture(scope="session")
def deployed(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`deployed("llama-genai-int4")`: the file of one form of the deployed-model corpus, built on first use
    and cached in pytest's cache (keyed by the tools' versions; shared by xdist workers); skips the test
    when a tool the form needs is not installed (transformers, onnxruntime-genai)."""
    import deployed_models

    cache = getattr(pytestconfig, "cache", None)
    root = cache.mkdir("ortdiff-deployed") if cache is not None else tmp_path_factory.mktemp("ortdiff-deployed")

    def build(name: str) -> Path:
        why = deployed_models.why_unavailable(deployed_models.FORMS[name])
        if why:
            pytest.skip(why)
        return deployed_models.build(name, root)

    return build


# -- faults ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _file_size_limit(nbytes: int) -> Iterator[None]:
    """Writes of this process past `nbytes` of a file fail (EFBIG, after a short write), as on a full disk:
    a real fault in the kernel, whatever code writes. Python ignores SIGXFSZ, so the write raises OSError."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture
def file_size_limit() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """`with file_size_limit(1000): ...`: every file written past 1,000 bytes fails midway (OSError EFBIG)."""
    return _file_size_limit
