"""The onnxruntime torch.compile backend (pytest_ortdiff.analyses.dynamo): the seeds/003 MLP trained under
torch.compile(backend=...) against eager, per-graph per-call records (checked on a planted mismatch of known
size), fallback to eager with the exporter's reason, and `ortdiff.check_compile` in real pytest runs."""

from __future__ import annotations

import copy
import importlib.util
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch

from pytest_ortdiff.analyses.dynamo import (
    CompileCheck,
    ExportFailed,
    OrtBackend,
    OrtDiffFallbackWarning,
    _convolution_backward,
    backward_decompositions,
    make_backend,
)
from pytest_ortdiff.plugin.fixtures import OrtDiff

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("onnxscript") is None, reason="onnxscript not installed (the export extra)"),
    # one worker under --dist loadgroup: the first compile and export (dynamo, onnxscript, torchlib's registry)
    # cost a few seconds per process, paid once
    pytest.mark.xdist_group("ortdiff-dynamo"),
]


class MLP(torch.nn.Module):
    """seeds/003's model."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


# a custom op computing 2x: one ONNX translation of it is off by 1e-3 (a planted mismatch of known size), and
# without one the exporter cannot take it (a graph that falls back)
@torch.library.custom_op("ortdiff_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


PLANT = 1e-3


def twice_off(x: Any) -> Any:
    from onnxscript import opset18 as op

    return op.Add(op.Mul(x, op.Constant(value_float=2.0)), op.Constant(value_float=PLANT))


def twice_plus_one(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.ortdiff_test.twice(x) + 1


class Train:
    """The seed's loop (L1 loss, Adam lr 0.1), eager and under compile: two batches of 5, then batches of 2 and
    3 as a DataLoader's last batch: dynamo recompiles with a symbolic batch size, which the backend exports
    once per concrete size."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.eager = MLP()
        self.compiled_module = copy.deepcopy(self.eager)
        self.backend = make_backend(check=True)
        compiled = torch.compile(self.compiled_module, backend=self.backend, fullgraph=True)
        gen = torch.Generator().manual_seed(1)
        batches = [(torch.randn(n, 10, generator=gen), torch.randn(n, 1, generator=gen)) for n in (5, 5, 2, 3)]
        self.eager_losses = self._train(self.eager, batches)
        self.compiled_losses = self._train(compiled, batches, self.compiled_module)

    @staticmethod
    def _train(model: Callable[..., torch.Tensor], batches: list[tuple[torch.Tensor, torch.Tensor]], params: Any = None) -> list[float]:
        optimizer = torch.optim.Adam((params or model).parameters(), lr=0.1)  # type: ignore[union-attr]
        losses = []
        for x, y in batches:
            optimizer.zero_grad()
            loss = torch.nn.functional.l1_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses


@pytest.fixture(scope="module")
def trained() -> Train:
    return Train()


def test_seed_mlp_trains_under_the_ort_backend_like_eager(trained: Train) -> None:
    # the reference is eager torch on the same weights and batches
    np.testing.assert_allclose(trained.compiled_losses, trained.eager_losses, rtol=1e-5, atol=0)
    for (name, p), q in zip(trained.eager.named_parameters(), trained.compiled_module.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    assert [g.id for g in trained.backend.graphs] == ["forward 0", "backward 0", "forward 1", "backward 1"]
    assert all(r.ran_on == "onnxruntime" for r in trained.backend.records)
    assert not trained.backend.fallbacks
    ops = {g.id: {n.op_type for m in g.models.values() for n in m.graph.node} for g in trained.backend.graphs}
    assert "Relu" in ops["forward 0"]
    assert {"LessOrEqual", "Where"} <= ops["backward 0"]  # threshold_backward: ReLU's gradient ran on onnxruntime


def test_exported_graph_on_onnxruntime_computes_the_fx_graph(trained: Train) -> None:
    # the backward graph's model, run by a bare InferenceSession on fresh inputs, against its FX graph in eager
    graph = trained.backend.graphs[1]
    (model,) = graph.models.values()
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(2)
    inputs = [torch.randn([d.dim_value for d in i.type.tensor_type.shape.dim], generator=gen) for i in model.graph.input]
    got = sess.run(None, {i.name: t.numpy() for i, t in zip(model.graph.input, inputs, strict=True)})
    expected = [t for t in graph.gm(*inputs) if isinstance(t, torch.Tensor)]
    assert len(got) == len(expected)
    for e, g_ in zip(expected, got, strict=True):
        np.testing.assert_allclose(g_, e.numpy(), rtol=1e-5, atol=1e-6)


def test_symbolic_shapes_export_once_per_concrete_shape(trained: Train) -> None:
    forward, backward = trained.backend.graphs[2:]
    assert any(isinstance(p.meta.get("val"), torch.SymInt) for p in forward.gm.graph.nodes if p.op == "placeholder")
    # batches of 2 and 3 through the same dynamo graph: one static ONNX model each
    batch = [[d.dim_value for d in m.graph.input[-1].type.tensor_type.shape.dim] for m in backward.models.values()]
    assert sorted(batch) == [[2, 1], [3, 1]]  # (the tangent of the output)
    assert (forward.calls, backward.calls) == (2, 2)


def test_check_records_every_call_of_forward_and_backward(trained: Train) -> None:
    records = trained.backend.records
    calls = [(g, c) for c in (1, 2) for g in ("forward 0", "backward 0")] + [(g, c) for c in (1, 2) for g in ("forward 1", "backward 1")]
    assert [(r.graph, r.call) for r in records] == calls
    for r in records:
        assert r.passed is True and r.verdict == "ok"
        assert r.max_abs is not None and r.max_abs < 1e-5
        assert re.search(r"f32\[[235],10\]", r.shapes)  # the batch
    text = trained.backend.report()
    assert text.splitlines()[0].startswith("onnxruntime (CPUExecutionProvider) vs the same FX graph in eager torch")
    assert re.search(r"^\s+graph\s+call\s+inputs\s+ran on\s+max abs\s+max ulp\s+verdict$", text, re.M)
    assert re.search(r"^\s+backward 0\s+2\s+f32\[5,10\].*onnxruntime\s+\S+\s+\S+\s+ok$", text, re.M)
    assert re.search(r"^\s+forward 1\s+2\s+f32\[32,10\] f32\[32\] 3 .*onnxruntime\s+\S+\s+\S+\s+ok$", text, re.M)
    summary = trained.backend.summary().splitlines()
    assert re.match(r"^\s+graph\s+calls\s+shapes\s+worst max abs\s+worst max ulp\s+broken\s+eager$", summary[1])
    assert [line.split()[:4] for line in summary[2:]] == [["forward", "0", "2", "1"], ["backward", "0", "2", "1"], ["forward", "1", "2", "2"], ["backward", "1", "2", "2"]]


def test_planted_mismatch_is_recorded_per_call_with_its_size() -> None:
    backend = make_backend(check=True, tolerance={"atol": 1e-4, "rtol": 0.0}, custom_translation_table={torch.ops.ortdiff_test.twice.default: twice_off})
    compiled = torch.compile(twice_plus_one, backend=backend, dynamic=False)
    x = torch.randn(64, generator=torch.Generator().manual_seed(3))
    out = [compiled(x), compiled(x)]
    # the reference: the planted translation in float32 numpy, minus eager
    xs = x.numpy()
    planted = (xs * np.float32(2) + np.float32(PLANT)) + np.float32(1)
    eager = twice_plus_one(x).numpy()
    np.testing.assert_array_equal(out[1].numpy(), planted)  # the compiled function returns onnxruntime's numbers
    assert [(r.graph, r.call, r.verdict) for r in backend.records] == [("inference 0", 1, "BROKEN"), ("inference 0", 2, "BROKEN")]
    # the graph's output is twice(x) + 1; ORT's Add runs on the planted value
    assert backend.records[0].max_abs == pytest.approx(float(np.abs(planted.astype(np.float64) - eager).max()), rel=1e-6)
    text = backend.report()
    assert "inference 0, call 1: tolerance broken" in text
    assert "allclose" in text or "outside atol" in text


def test_unexportable_graph_falls_back_to_eager_with_the_reason(trained: Train) -> None:
    backend = make_backend(check=True)
    compiled = torch.compile(twice_plus_one, backend=backend, dynamic=False)
    x = torch.randn(8)
    with pytest.warns(OrtDiffFallbackWarning, match=r"inference 0 \[f32\[8\]\]: export failed, runs eagerly: .*No ONNX function found for .*ortdiff_test\.twice"):
        first = compiled(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per graph and signature, not per call
        second = compiled(x)
    torch.testing.assert_close(first, twice_plus_one(x), rtol=0, atol=0)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    (fallback,) = backend.fallbacks
    assert (fallback.graph, fallback.stage) == ("inference 0", "export")
    assert "ConversionError at step 3/3 (ONNX translation)" in fallback.reason
    assert [(r.ran_on, r.verdict, r.fallback) for r in backend.records] == [("eager", "eager (export failed)", fallback)] * 2
    assert "fallbacks (these graphs ran eagerly):" in backend.report()


def test_fallback_false_raises_the_exporter_error_shortened(trained: Train) -> None:
    compiled = torch.compile(twice_plus_one, backend=make_backend(fallback=False), dynamic=False)
    with pytest.raises(ExportFailed, match=r"export failed: ConversionError .*No ONNX function found for .*twice") as info:
        compiled(torch.randn(8))
    assert len(str(info.value)) < 600 and "\x1b[" not in str(info.value) and "\n" not in str(info.value)


def test_check_compile_lists_the_graph_that_fell_back(trained: Train) -> None:
    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x).relu()
            torch._dynamo.graph_break()  # two dynamo graphs: the exporter cannot take the second
            return twice_plus_one(y)  # (the graph of the test above: its export failure is cached)

    result = OrtDiff("CPU", "float32").check_compile(Mixed(), (torch.randn(8),))
    assert isinstance(result, CompileCheck) and result.passed
    (on_ort,) = result.on_onnxruntime
    ((graph, stage),) = [(f.graph, f.stage) for f in result.fallbacks]
    assert (on_ort.split()[0], graph.split()[0], stage) == ("inference", "inference", "export")
    assert int(graph.split()[1]) == int(on_ort.split()[1]) + 1  # the graph after the break
    assert "fallbacks (these graphs ran eagerly):" in result.render()
    assert result.row().worst == f"ran eagerly: {graph} (no ONNX function for ortdiff_test.twice)"


def test_check_compile_skips_without_onnxscript(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript raises ImportError
    with pytest.raises(pytest.skip.Exception, match=r"needs onnxscript: pip install 'pytest-ortdiff\[export\]'"):
        OrtDiff("CPU", "float32").check_compile(torch.nn.Linear(2, 2), (torch.randn(1, 2),))


CHECK_COMPILE_TESTS = '''
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.layers(x)


def test_mlp_trains_like_eager(ortdiff):
    torch.manual_seed(0)
    result = ortdiff.check_compile(MLP(), (torch.randn(5, 10),), train_steps=2)
    assert [s.step for s in result.steps] == [1, 2]
    # (graph ids count on across checks: check_compile reuses one backend per configuration)
    assert [g.split()[0] for g in result.on_onnxruntime] == ["forward", "backward"]


@torch.library.custom_op("ortdiff_pytester::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


def twice_off(x):
    from onnxscript import opset18 as op

    return op.Add(op.Mul(x, op.Constant(value_float=2.0)), op.Constant(value_float=1e-3))


class Planted(torch.nn.Module):
    def forward(self, x):
        return torch.ops.ortdiff_pytester.twice(x)


def test_planted_mismatch(ortdiff):
    table = {torch.ops.ortdiff_pytester.twice.default: twice_off}
    ortdiff.check_compile(Planted(), (torch.randn(8),), custom_translation_table=table)
'''


def test_check_compile_passes_and_fails_with_the_diff_tables(pytester: pytest.Pytester, trained: Train) -> None:
    # (`trained` first: the exporter's modules are imported outside pytester's sys.modules snapshot)
    pytester.makepyfile(CHECK_COMPILE_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*ortdiff: torch.compile (onnxruntime CPU) vs eager float32: tolerance broken (atol=0.0001 rtol=0.0001)*",
            "*  - output: *",
            "*onnxruntime (CPUExecutionProvider) vs the same FX graph in eager torch, per graph and call*: 1 graphs, 1 calls",
            "*  graph        call  inputs  ran on       max abs  max ulp*verdict",
            "*  inference 0  1     f32[[]8[]]  onnxruntime  0.001*BROKEN",
            "*inference 0, call 1: tolerance broken*",
        ]
    )
    result.stdout.fnmatch_lines(["*test_mlp_trains_like_eager*[[]compile[]]*passed", "*test_planted_mismatch*[[]compile[]]*failed"], consecutive=False)


@pytest.mark.parametrize("transposed", [False, True], ids=["conv", "conv_transpose"])
def test_convolution_backward_as_convolutions_matches_aten(transposed: bool) -> None:
    # torch has no decomposition of convolution_backward and torchlib no ONNX function: the backend's own,
    # against aten's kernel in float64, over strides, paddings, dilations, groups, 1-d and 2-d
    gen = torch.Generator().manual_seed(4)
    for dim, stride, pad, dil, groups in [(1, 1, 0, 1, 1), (1, 2, 1, 2, 2), (2, 2, 1, 1, 1), (2, 1, 0, 2, 2), (2, 2, 1, 2, 2)]:
        cin, cout, k = 4, 6, 3
        x = torch.randn(2, cin, *[7] * dim, generator=gen, dtype=torch.float64)
        shape = (cin, cout // groups) if transposed else (cout, cin // groups)
        w = torch.randn(*shape, *[k] * dim, generator=gen, dtype=torch.float64)
        out_pad = [stride - 1 if transposed else 0] * dim
        conv = (x, w, None, [stride] * dim, [pad] * dim, [dil] * dim, transposed, out_pad, groups)
        grad = torch.randn_like(torch.ops.aten.convolution.default(*conv))
        args = (grad, x, w, [cout], [stride] * dim, [pad] * dim, [dil] * dim, transposed, out_pad, groups, [True, True, True])
        expected = torch.ops.aten.convolution_backward.default(*args)
        got = _convolution_backward(*args)
        for name, e, g_ in zip(("input", "weight", "bias"), expected, got, strict=True):
            torch.testing.assert_close(g_, e, rtol=1e-12, atol=1e-12, msg=f"grad {name}: {dim}-d stride {stride} pad {pad} dilation {dil} groups {groups}")
    assert backward_decompositions()[torch.ops.aten.convolution_backward.default] is _convolution_backward


def test_backend_is_a_torch_compile_backend() -> None:
    from pytest_ortdiff.analyses.dynamo import ort_backend

    assert isinstance(ort_backend, OrtBackend) and not ort_backend.check and ort_backend.fallback
    with pytest.raises(ValueError, match="opset must be an ONNX opset version"):
        make_backend(opset=0)
