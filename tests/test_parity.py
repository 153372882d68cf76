"""parity.check_export: modules mirroring real architectures (a Llama decoder layer and its attention, a BERT
encoder layer, a ResNet block) match onnxruntime's run of their exports by both exporters, in float32 and
float16; a planted export-divergent op is named as the first diverging scope (and FX node); an export
failure is reported as one; the `ortdiff.check_export` fixture passes and fails through pytest.

Exports are the cost (a dynamo export takes a second or more): each is made once per session (`_report`).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import math
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest
import torch
from real_models import MODELS, _torchlib_registry_built_once
from torch import nn

from pytest_ortdiff import Tolerance
from pytest_ortdiff.analyses.parity import (
    ExportFailed,
    ExportParityReport,
    check_export,
    module_scope,
)
from pytest_ortdiff.engine.check import UnsupportedByProvider
from pytest_ortdiff.models.llama import LlamaDecoderLayer

HAS_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None
needs_onnxscript = pytest.mark.skipif(not HAS_ONNXSCRIPT, reason="torch.onnx.export(dynamo=True) needs onnxscript: pip install -e '.[export]'")
EXPORTERS = [pytest.param("dynamo", marks=needs_onnxscript), "torchscript"]
PLANTED = "encoder.layers.1.mlp.act"


# -- modules ----------------------------------------------------------------------------------------


class BertSelfAttention(nn.Module):
    """HF's BertSelfAttention: query/key/value projections, scaled scores plus the additive mask, softmax."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        scores = heads(self.query(x)) @ heads(self.key(x)).transpose(-1, -2) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        return (scores.softmax(-1) @ heads(self.value(x))).transpose(1, 2).reshape(b, s, -1)


class BertOutput(nn.Module):
    """HF's BertSelfOutput / BertOutput: dense, residual, post-LayerNorm."""

    def __init__(self, fan_in: int, hidden: int) -> None:
        super().__init__()
        self.dense, self.LayerNorm = nn.Linear(fan_in, hidden), nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.self, self.output = BertSelfAttention(hidden, heads), BertOutput(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertLayer(nn.Module):
    """HF's BertLayer: attention block, then GELU intermediate and output, both post-norm residual."""

    def __init__(self, hidden: int = 16, heads: int = 2, intermediate: int = 32) -> None:
        super().__init__()
        self.attention = BertAttention(hidden, heads)
        self.intermediate = nn.Sequential(nn.Linear(hidden, intermediate), nn.GELU())
        self.output = BertOutput(intermediate, hidden)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        a = self.attention(hidden_states, attention_mask)
        return self.output(self.intermediate(a), a)


class Architectures(nn.Module):
    """Three architectures in one module, so one export checks them all, each a scope of its own: a Llama
    decoder layer (RMSNorm, rotary GQA attention, SwiGLU; the zoo's eager twin), a BERT encoder layer (with
    an additive mask as a keyword input) and a ResNet basic block (Conv + eval BatchNorm, folded on export)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.llama = LlamaDecoderLayer(hidden=16, heads=2, kv_heads=1, intermediate=32)
        self.bert = BertLayer()
        self.conv = MODELS["resnet_folded"].module()

    def forward(self, hidden: torch.Tensor, image: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        return self.llama(hidden), self.bert(hidden, mask), self.conv(image)


def _architecture_inputs() -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    mask = torch.zeros(1, 1, 1, 5)
    mask[..., -1] = -1e4  # the last position padded
    return (torch.randn(1, 5, 16, generator=g), torch.randn(1, 4, 16, 16, generator=g)), {"mask": mask}


# The planted op: eager computes SiLU, x * sigmoid(x); its ONNX translation computes x * sigmoid(1.702 x)
# (the sigmoid approximation of GELU). Dynamo exports it as a custom op with its own translation; the
# TorchScript exporter as an autograd.Function with its own symbolic.


@torch.library.custom_op("ortdiff_tests::planted_silu", mutates_args=())
def planted_silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


@planted_silu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _planted_translation() -> dict[Any, Any]:
    from onnxscript import opset18 as op

    def planted_silu_onnx(x: Any) -> Any:
        return op.Mul(x, op.Sigmoid(op.Mul(x, op.CastLike(1.702, x))))

    return {torch.ops.ortdiff_tests.planted_silu.default: planted_silu_onnx}


class PlantedSiLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)

    @staticmethod
    def symbolic(g: Any, x: Any) -> Any:
        k = g.op("CastLike", g.op("Constant", value_t=torch.tensor(1.702)), x)
        return g.op("Mul", x, g.op("Sigmoid", g.op("Mul", x, k)))


class PlantedSiLU(nn.Module):
    def __init__(self, exporter: str) -> None:
        super().__init__()
        self.exporter = exporter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exporter == "dynamo":
            return planted_silu(x)
        return PlantedSiLUFunction.apply(x)  # type: ignore[no-any-return]


class MLP(nn.Module):
    def __init__(self, hidden: int, act: nn.Module) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(hidden, 2 * hidden), act, nn.Linear(2 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, hidden: int, act: nn.Module) -> None:
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(hidden), MLP(hidden, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Encoder(nn.Module):
    def __init__(self, hidden: int, exporter: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(hidden, nn.SiLU()), Block(hidden, PlantedSiLU(exporter))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class PlantedModel(nn.Module):
    """Embedding, two pre-norm MLP blocks, a head; the second block's activation is the planted op."""

    def __init__(self, exporter: str, hidden: int = 8) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.encoder, self.head = nn.Linear(4, hidden), Encoder(hidden, exporter), nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)))


class AiryHead(nn.Module):
    """A Linear then `torch.special.airy_ai`, which neither exporter translates."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.airy_ai(self.proj(x))


# -- one export per (case, exporter, dtype) per session ---------------------------------------------


@functools.cache
def _case(name: str, exporter: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], dict[str, torch.Tensor], dict[str, Any]]:
    if name == "architectures":
        args, kwargs = _architecture_inputs()
        return Architectures().eval(), args, kwargs, {}
    if name == "planted":
        x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2))
        options = {"custom_translation_table": _planted_translation()} if exporter == "dynamo" else {}
        return PlantedModel(exporter).eval(), (x,), {}, options
    raise KeyError(name)


@functools.cache
def _report(name: str, exporter: str, dtype: str = "float32") -> ExportParityReport:
    module, args, kwargs, options = _case(name, exporter)
    # the dynamo exporter rebuilds its torchlib registry on every export: once is enough here
    with _torchlib_registry_built_once():
        return check_export(module, args, kwargs, exporter=exporter, dtype=dtype, export_options=options, localize=True)  # type: ignore[arg-type]


def _eager_and_ort(name: str, report: ExportParityReport, dtype: torch.dtype) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The reference numbers, computed here without pytest_ortdiff: the module cast by hand in eager torch,
    and onnxruntime's own InferenceSession on the exported model."""
    module, args, kwargs, _ = _case(name, report.exporter)
    ours = copy.deepcopy(module).to(dtype)
    args = tuple(a.to(dtype) for a in args)
    kwargs = {k: v.to(dtype) for k, v in kwargs.items()}
    with torch.no_grad():
        out = ours(*args, **kwargs)
    eager = [t.float().numpy() for t in (out if isinstance(out, tuple) else (out,))]
    assert report.model is not None
    sess = onnxruntime.InferenceSession(report.model.SerializeToString(), providers=["CPUExecutionProvider"])
    # both exporters order these inputs as args then kwargs (dynamo: as given; TorchScript: the signature's)
    feeds = dict(zip([i.name for i in sess.get_inputs()], [t.numpy() for t in (*args, *kwargs.values())], strict=True))
    return eager, [np.asarray(o, dtype=np.float32) for o in sess.run(None, feeds)]


def _max_abs(eager: list[np.ndarray], ort: list[np.ndarray]) -> float:
    return max(float(np.abs(e.astype(np.float64) - o).max()) for e, o in zip(eager, ort, strict=True))


# -- passing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_real_architectures_match_their_export(exporter: str) -> None:
    report = _report("architectures", exporter)
    assert report.passed, report.render()
    assert report.outputs.max_abs == pytest.approx(_max_abs(*_eager_and_ort("architectures", report, torch.float32)), rel=1e-6, abs=1e-12)
    assert report.outputs.max_abs < 1e-5
    # every architecture, and the blocks inside it, compared at its own output in the ONNX graph
    rows = {s.label: s for s in report.scopes}
    for scope in ("llama", "llama.self_attn", "llama.mlp", "bert", "bert.attention.self", "bert.intermediate", "conv", "conv.bn1", "conv.downsample"):
        assert rows[scope].values and rows[scope].report is not None and not rows[scope].diverged, scope
    assert report.first_scope is None and report.first_node is None
    # eval BatchNorm is folded into the Conv before it by both exporters: the Conv has no value of its own
    assert rows["conv.conv1"].report is None and rows["conv.conv1"].note in ("folded into conv.bn1", "not in the export (folded away, or an identity)")
    if exporter == "dynamo":
        assert len(report.nodes) > 50 and not any(n.diverged for n in report.nodes)
    assert "per module scope, in execution order" in report.render()
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is True and data["exporter"] == exporter and len(data["scopes"]) == len(report.scopes)


# -- failing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_planted_divergence_is_named_first(exporter: str) -> None:
    report = _report("planted", exporter)
    assert not report.passed and report.violations
    first = report.first_scope
    assert first is not None and first.scope == PLANTED and first.module_type == "PlantedSiLU", report.render()
    before = [s for s in report.scopes[: report.scopes.index(first)] if s.report is not None]
    assert len(before) >= 8 and not any(s.diverged for s in before)
    # the planted value, recomputed in float64 from eager's input to the activation: SiLU vs x*sigmoid(1.702x)
    module, (x,), _, _ = _case("planted", exporter)
    with torch.no_grad():
        h = module.encoder.layers[0](module.embed(x))
        u = module.encoder.layers[1].mlp.up(module.encoder.layers[1].norm(h)).double()
    planted = (u * torch.sigmoid(u) - u * torch.sigmoid(1.702 * u)).abs().max().item()
    assert first.report is not None and first.report.max_abs == pytest.approx(planted, rel=1e-4)
    if exporter == "dynamo":
        node = report.first_node
        assert node is not None and node.scope == PLANTED and "planted_silu" in node.target
    assert report.outputs.max_abs == pytest.approx(_max_abs(*_eager_and_ort("planted", report, torch.float32)), rel=1e-6)
    text = report.render()
    assert f"first diverging scope: {PLANTED} (PlantedSiLU)" in text
    assert [line.split()[-2:] for line in text.splitlines() if line.strip().startswith(PLANTED + " ")] == [["first", "divergence"]]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_an_export_failure_is_reported_as_such(exporter: str) -> None:
    with pytest.raises(ExportFailed) as info, _torchlib_registry_built_once():
        check_export(AiryHead(), (torch.randn(2, 4),), exporter=exporter)  # type: ignore[arg-type]
    exc = info.value
    assert exc.exporter == exporter and exc.module == "AiryHead"
    assert "special_airy_ai" in exc.detail and "Torch IR graph" not in exc.detail and "\x1b[" not in exc.detail
    assert len(exc.detail.splitlines()) <= 9
    assert str(exc).startswith(f"torch.onnx.export(dynamo={exporter == 'dynamo'}) cannot export AiryHead:")
    row = exc.row("CPU", "float32", Tolerance().for_dtype("float32"))
    assert not row.passed and row.worst.startswith("export failed: ") and "special_airy_ai" in row.worst and row.max_abs is None


def test_float16_casts_a_copy_of_the_module_and_the_inputs() -> None:
    report = _report("planted", "torchscript", "float16")
    module, _, _, _ = _case("planted", "torchscript")
    assert all(p.dtype == torch.float32 for p in module.parameters())  # the caller's module is left as it is
    assert report.model is not None and report.model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert report.dtype == "float16" and report.outputs.dtype == "float16" and report.tolerance.atol == 1e-2
    assert report.outputs.max_abs == pytest.approx(_max_abs(*_eager_and_ort("planted", report, torch.float16)), rel=1e-6)
    # in float16 too the planted op is found first, every scope before it within float16's tolerance
    first = report.first_scope
    assert not report.passed and first is not None and first.scope == PLANTED, report.render()
    assert first.report is not None and first.report.dtype == "float16"


def test_bad_arguments_are_named() -> None:
    m = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"exporter must be .dynamo."):
        check_export(m, (torch.ones(1, 2),), exporter="onnx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"dynamic_shapes is for exporter=.dynamo.*dynamic_axes"):
        check_export(m, (torch.ones(1, 2),), exporter="torchscript", dynamic_shapes={"input": {0: "batch"}})
    with pytest.raises(ValueError, match="export_options may not set opset_version"):
        check_export(m, (torch.ones(1, 2),), exporter="torchscript", export_options={"opset_version": 17})
    with pytest.raises(TypeError, match=r"takes a torch\.nn\.Module"):
        check_export(lambda x: x, (torch.ones(1, 2),))  # type: ignore[arg-type]


def test_bfloat16_on_cpu_is_a_named_hole_or_a_report() -> None:
    # onnxruntime's CPU provider lacks bfloat16 kernels for most ops: a skip reason naming the op, not a crash
    try:
        report = check_export(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),), exporter="torchscript", dtype="bfloat16")
    except UnsupportedByProvider as exc:
        assert exc.dtype == "bfloat16" and exc.op
    else:
        assert report.dtype == "bfloat16" and report.outputs.n == 8


# -- module scopes from node metadata and names --------------------------------------------------------


def test_module_scope_resolves_torchscript_and_dynamo_names() -> None:
    names = {"", "layers", "layers.0", "layers.0.self_attn", "layers.0.self_attn.seq", "layers.0.self_attn.seq.1", "layers.0.self_attn.seq.1.0", "shared", "2", "2.0"}

    def node(name: str, **meta: str) -> onnx.NodeProto:
        n = oh.make_node("Relu", ["x"], ["y"], name=name)
        for k, v in meta.items():
            n.metadata_props.add(key=k, value=v)
        return n

    # TorchScript names each segment relative to an enclosing module and numbers repeated calls
    assert module_scope(node("/layers.0/self_attn/seq/seq.1/seq.1.0/Relu"), names) == "layers.0.self_attn.seq.1.0"
    assert module_scope(node("/2/2.0/Gemm"), names) == "2.0"
    assert module_scope(node("/shared_1/MatMul"), names) == "shared"
    assert module_scope(node("/layers.0/Add"), names) == "layers.0"
    assert module_scope(node("Identity_0"), names) == ""
    # dynamo: the qualified names are in the metadata
    meta = {"pkg.torch.onnx.name_scopes": "['', 'layers.0', 'layers.0.self_attn', 'relu']"}
    assert module_scope(node("node_relu", **meta), names) == "layers.0.self_attn"


# -- the fixture ---------------------------------------------------------------------------------------


def test_fixture_passes_fails_and_reports_export_failures(pytester: pytest.Pytester) -> None:
    _report("planted", "torchscript")  # the exporter's modules imported in this process before pytester runs
    pytester.makepyfile(
        test_export="""
        import torch
        from torch import nn

        class Planted(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return torch.relu(x)

            @staticmethod
            def symbolic(g, x):
                return g.op("LeakyRelu", x, alpha_f=0.5)

        class Act(nn.Module):
            def forward(self, x):
                return Planted.apply(x)

        class Net(nn.Module):
            def __init__(self, planted):
                super().__init__()
                torch.manual_seed(0)
                self.fc1, self.act, self.fc2 = nn.Linear(4, 8), Act() if planted else nn.ReLU(), nn.Linear(8, 2)

            def forward(self, x):
                return self.fc2(self.act(self.fc1(x)))

        class Airy(nn.Module):
            def forward(self, x):
                return torch.special.airy_ai(x)

        X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

        def test_pass(ortdiff):
            report = ortdiff.check_export(Net(False).eval(), (X,), exporter="torchscript")
            assert report.passed

        def test_fail(ortdiff):
            ortdiff.check_export(Net(True).eval(), (X,), exporter="torchscript")

        def test_export_fails(ortdiff):
            ortdiff.check_export(Airy(), (X,), exporter="torchscript")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*OrtDiffFailure: ortdiff: export parity of Net (torchscript exporter, opset *) on onnxruntime CPU float32: tolerance broken*",
            "*first diverging scope: act (Act), ONNX value /act/LeakyRelu_output_0: max abs *",
            "*scope * module * onnx value * max abs * mean abs * differ * verdict",
            "*fc1 * Linear * ok",
            "*act * Act * first divergence",
            "*fc2 * Linear * diverges",
        ]
    )
    result.stdout.fnmatch_lines(["*ExportFailed: torch.onnx.export(dynamo=False) cannot export Airy:*", "*UnsupportedOperatorError: Exporting the operator 'aten::special_airy_ai'*"])
    result.stdout.fnmatch_lines(
        [
            "*= ortdiff summary =*",
            "test_export.py::test_pass[[]CPU-float32[]] * CPU * float32 * passed",
            "test_export.py::test_fail[[]CPU-float32[]] * CPU * float32 * failed",
            "test_export.py::test_export_fails[[]CPU-float32[]] * CPU * float32 * export failed: UnsupportedOperatorError*failed",
        ]
    )
