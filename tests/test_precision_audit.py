"""precision.audit: each fp16 hazard is flagged at the node that causes it, with the reason and the
consumers it feeds, its shares equal to numpy's count on the same feeds; a clean graph flags nothing;
bfloat16 flags only its own range; a hazard planted deep in a 500-node graph is found."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from pytest_ortdiff import OrtRunner, models
from pytest_ortdiff.analyses.precision import AuditReport, NodeAudit, audit

DIMS = {"batch": 4, "n": 64}
SEEDS = (0, 1)
F16_OVERFLOW = 65520.0  # 65504 + half an ulp: from here float16 rounds to inf
F16_UNDERFLOW = 2.0**-25  # half float16's smallest subnormal: up to here it rounds to 0
F16_TINY = 2.0**-14  # float16's smallest normal


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    # the audit computes between the graph's ops; two torch threads on a machine shared by many processes
    # then wait on each other in every small matmul (ms instead of µs): one thread, as test_blame does
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hazard_audits() -> dict[str, tuple[AuditReport, np.ndarray]]:
    """Per fp16_hazards kind: its float16 audit over two inputs, and those inputs' X stacked (float64)."""
    out = {}
    for kind in models.fp16_hazards.kinds:  # type: ignore[attr-defined]
        model = models.fp16_hazards(kind, dtype="float32")
        feeds = [models.random_feeds(model, dims=DIMS, seed=s) for s in SEEDS]
        out[kind] = (audit(model, iter(feeds)), np.stack([f["X"].double().numpy() for f in feeds]))
    return out


def _share(mask: np.ndarray) -> float:
    return float(mask.mean())


# -- the hazards ---------------------------------------------------------------------------------------------


def test_overflow_hazards_are_flagged_where_they_overflow(
    hazard_audits: dict[str, tuple[AuditReport, np.ndarray]],
) -> None:
    # pow and reduce_mean: Pow 'square' overflows first; softmax: Exp 'exp'. The reductions after them
    # overflow on their own in pow and softmax (a sum of in-range squares passes 65504 too)
    expected = {
        "pow": ["square", "sum_squares"],
        "reduce_mean": ["square"],
        "softmax": ["exp", "sum_exp"],
    }
    for kind, names in expected.items():
        report, x = hazard_audits[kind]
        assert [n.name for n in report.flagged] == names, kind
        first = report.flagged[0]
        assert first.reasons[0].startswith("overflows float16: ") and len(first.reasons) == 1
        # the shares and the range, against numpy on the same feeds
        y = np.exp(x) if kind == "softmax" else x**2
        assert first.overflow == pytest.approx(_share(y >= F16_OVERFLOW), abs=1e-12)
        assert first.max == pytest.approx(y.max(), rel=1e-6) and first.min == pytest.approx(
            y.min(), rel=1e-5
        )
        assert first.absmax == pytest.approx(y.max(), rel=1e-6) and first.headroom == pytest.approx(
            65504 / y.max(), rel=1e-6
        )
        assert (
            f"{100 * first.overflow:.2f} % of elements round to ±inf (|x| ≥ 65520)"
            in first.reasons[0]
        )
    report, x = hazard_audits["pow"]
    sums = (x**2).sum(-1)
    assert report.node("sum_squares").overflow == pytest.approx(
        _share(sums >= F16_OVERFLOW), abs=1e-12
    )
    assert report.node("square").consumers == (("ReduceSum", "sum_squares"),)
    assert report.node("square").reasons[0].endswith("→ feeds ReduceSum 'sum_squares'")
    assert report.node("sum_squares").reasons[0].endswith("→ feeds Sqrt 'magnitude'")
    exp = hazard_audits["softmax"][0].node("exp")
    assert exp.consumers == (("ReduceSum", "sum_exp"), ("Div", "normalize"))
    # its underflows (exp(x) ≤ 2.98e-8 for x < -17.3) go to Div's numerator and a sum: no harm, no flag
    assert exp.underflow_zero == pytest.approx(
        _share(np.exp(hazard_audits["softmax"][1]) <= F16_UNDERFLOW), abs=1e-12
    )
    assert exp.underflow_zero > 0 and exp.reaches == ()


def test_log_of_underflowed_squares_is_flagged_at_the_square(
    hazard_audits: dict[str, tuple[AuditReport, np.ndarray]],
) -> None:
    report, x = hazard_audits["log"]
    (power,) = report.flagged
    sq = (x.astype(np.float32) * x.astype(np.float32)).astype(np.float64)
    assert (power.op_type, power.name) == ("Mul", "power")
    assert (
        power.underflow_zero
        == pytest.approx(_share((sq > 0) & (sq <= F16_UNDERFLOW)), abs=1e-12)
        == 1.0
    )
    assert power.min_nonzero == pytest.approx(sq[sq > 0].min(), rel=1e-6)
    assert power.consumers == power.reaches == (("Log", "log"),)
    assert power.reasons == (
        f"underflows to 0 in float16: 100.00 % of elements (0 < |x| ≤ 2.98e-08), min |x|>0 {power.min_nonzero:.3g} → reaches Log 'log'",
    )


def test_div_by_an_underflowed_norm_is_flagged_along_the_path(
    hazard_audits: dict[str, tuple[AuditReport, np.ndarray]],
) -> None:
    report, x = hazard_audits["div"]
    assert [n.name for n in report.flagged] == ["square", "sum_squares"]
    square, sums = report.flagged
    # the squares all round to 0; their sum is no longer 0 in float32 but falls to float16's subnormals
    assert square.underflow_zero == 1.0 and square.reaches == (("Div", "normalize"),)
    assert (
        "→ reaches Div 'normalize' (divisor) via ReduceSum 'sum_squares', Sqrt 'norm'"
        in square.reasons[0]
    )
    expected = (x**2).sum(-1)
    assert (
        sums.subnormal
        == pytest.approx(_share((expected > F16_UNDERFLOW) & (expected < F16_TINY)), abs=1e-12)
        == 1.0
    )
    assert sums.reasons[0].startswith(
        "falls to float16 subnormals: 100.00 % of elements with |x| < 6.1e-05"
    )
    assert sums.reasons[0].endswith("→ reaches Div 'normalize' (divisor) via Sqrt 'norm'")
    # the divisor itself is a normal float16 number: the cause is upstream, where the audit points
    assert report.node("norm").flagged is False and report.node("norm").min == pytest.approx(
        np.sqrt(expected.min()), rel=1e-5
    )


def test_render_lists_the_flagged_nodes_first(
    hazard_audits: dict[str, tuple[AuditReport, np.ndarray]],
) -> None:
    text = hazard_audits["div"][0].render()
    lines = text.splitlines()
    assert lines[0] == "float16 range audit of 'fp16_hazard_div'" and lines[2] == "flagged:"
    assert lines[3].split()[:6] == ["op", "name", "min", "max", "min|x|>0", "overflow"]
    assert lines[4].split()[:2] == ["Pow", "square"] and lines[5].startswith(
        "    ↳ underflows to 0 in float16"
    )
    assert "least headroom, not flagged" in text
    assert (
        lines[-1]
        == "float16 audit of 'fp16_hazard_div': 6 nodes (5 with float32 outputs) over 2 inputs: 2 flagged (underflow 2)"
    )


def test_to_dict_is_json(hazard_audits: dict[str, tuple[AuditReport, np.ndarray]]) -> None:
    report = hazard_audits["softmax"][0]
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert (
        data["flagged"] == ["exp", "sum_exp"] and data["inputs"] == 2 and data["dtype"] == "float16"
    )
    exp = next(n for n in data["nodes"] if n["name"] == "exp")
    assert (
        exp["consumers"] == [["ReduceSum", "sum_exp"], ["Div", "normalize"]]
        and exp["flagged"] is True
    )
    assert exp["overflow"] == report.node("exp").overflow
    assert set(exp) >= {
        "name",
        "op_type",
        "outputs",
        "min",
        "max",
        "absmax",
        "min_nonzero",
        "overflow",
        "underflow_zero",
        "subnormal",
        "nan_inf_produced",
        "reasons",
    }


def test_the_reductions_count_what_numpy_counts_in_chunks_and_on_the_torch_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """_Acc's counts and extremes against numpy on one tensor holding every case (NaN, ±inf, zeros,
    underflows, subnormals, overflows, mask values), transposed (not contiguous), reduced in chunks of 64,
    through the numpy path (CPU) and the torch path (what a CUDA tensor takes), which must agree."""
    mod = importlib.import_module("pytest_ortdiff.analyses.precision.audit")
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.normal(0, 1, 300), rng.normal(0, 1e-6, 100), rng.uniform(-1e-8, 1e-8, 100), np.zeros(50),
        rng.uniform(6e4, 1e6, 40) * rng.choice([-1, 1], 40), np.full(10, np.finfo(np.float32).min),
        [np.nan] * 3, [np.inf, -np.inf], [2.0**-25, 2.0**-24, 65519.0, 65520.0, 1.0],
    ]).astype(np.float32)  # fmt: skip
    x = torch.from_numpy(rng.permutation(values).reshape(2, -1)).t()  # 2 columns: not contiguous
    assert not x.is_contiguous()
    monkeypatch.setattr(mod, "_CHUNK", 64)
    monkeypatch.setattr(mod, "_CHUNK_GPU", 64)
    lim = mod._Limits.of("float16")
    cpu = mod._Acc()
    assert cpu.add(x, lim, mod._Backend.of(lim, torch.device("cpu"))) == 5
    on_torch = mod._Acc()
    be = mod._Backend.of(lim, torch.device("cpu"))._replace(xp=torch, int32=torch.int32)
    be = be._replace(
        **{
            k: torch.tensor(float(getattr(be, k)))
            for k in ("zero", "overflow", "sentinel", "tiny", "underflow")
        }
    )
    assert on_torch.add(x, lim, be) == 5
    assert cpu == on_torch
    v = values[np.isfinite(values)].astype(np.float64)
    a = np.abs(v)
    assert (cpu.n, cpu.nan, cpu.inf) == (len(values), 3, 2)
    assert (cpu.min, cpu.max, cpu.absmax) == (v.min(), v.max(), a.max())
    assert cpu.min_nonzero == a[a > 0].min()
    assert cpu.overflow == np.count_nonzero(a >= 65520) and cpu.sentinel == 10
    assert cpu.underflow_zero == np.count_nonzero((a > 0) & (a <= 2.0**-25))
    assert cpu.subnormal == np.count_nonzero((a > 2.0**-25) & (a < 2.0**-14))


# -- what is not flagged ----------------------------------------------------------------------------------------


def test_a_clean_graph_flags_nothing_and_its_ranges_are_onnxruntimes() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = [models.random_feeds(model, dims={"a": 2, "b": 16, "c": 32}, seed=s) for s in SEEDS]
    report = audit(model, feeds)
    assert report.flagged == [] and report.noted == []
    assert all(n.audited and n.overflow == n.underflow_zero == n.nan_inf == 0 for n in report.nodes)
    # the last node's range is that of the model's output, as onnxruntime computes it
    runner = OrtRunner(model)
    ys = np.stack([np.asarray(runner.run(None, f)[0]) for f in feeds])
    last = report.nodes[-1]
    assert last.min == pytest.approx(ys.min(), rel=1e-4) and last.max == pytest.approx(
        ys.max(), rel=1e-4
    )
    assert last.subnormal == pytest.approx(
        _share((np.abs(ys) > F16_UNDERFLOW) & (np.abs(ys) < F16_TINY)), abs=1e-12
    )


def _graph(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], outputs: list[str], shape: list[int]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _f32(name: str, value: object) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def test_consumers_unnamed_nodes_and_where_zeros_stop() -> None:
    # sq = X*X feeds a Log directly, a Div's divisor through Add(eps) + Sqrt, and a Div's numerator
    nodes = [
        helper.make_node("Mul", ["X", "X"], ["sq"]),
        helper.make_node("Log", ["sq"], ["log"]),
        helper.make_node("Add", ["sq", "eps"], ["sq_eps"]),
        helper.make_node("Sqrt", ["sq_eps"], ["rms"]),
        helper.make_node("Div", ["X", "rms"], ["y"]),
        helper.make_node("Div", ["sq", "rms"], ["z"]),
    ]
    model = _graph(nodes, [_f32("eps", 1e-3)], ["log", "y", "z"], [2, 8])
    x = torch.linspace(-1e-4, 1e-4, 16).reshape(2, 8)
    report = audit(model, {"X": x})
    assert [n.name for n in report.nodes] == ["Mul_0", "Log_1", "Add_2", "Sqrt_3", "Div_4", "Div_5"]
    sq = report.node("Mul_0")
    assert sq.node_name == "" and sq.index == 0 and sq.outputs == ("sq",)
    assert sq.consumers == (("Log", "Log_1"), ("Add", "Add_2"), ("Div", "Div_5"))
    # eps keeps the divisor away from 0: only the Log is harmed
    assert sq.reaches == (("Log", "Log_1"),)
    assert [n.name for n in report.flagged] == ["Mul_0"]


def test_what_float32_does_itself_makes_notes_not_flags() -> None:
    # NaN/Inf the float32 model makes (log(0)), passes on, or takes from a literal; float32's mask value
    mask_min = float(np.finfo(np.float32).min)
    nodes = [
        helper.make_node("Relu", ["X"], ["r"], name="relu"),
        helper.make_node("Log", ["r"], ["l"], name="log"),  # log(0) = -inf: made here
        helper.make_node("Neg", ["l"], ["n"], name="neg"),  # +inf: passed on
        helper.make_node("Constant", [], ["ninf"], name="ninf", value=_f32("v", -np.inf)),
        helper.make_node("Less", ["X", "zero"], ["m"], name="less"),
        helper.make_node("Where", ["m", "ninf", "X"], ["w"], name="where"),  # -inf: from a literal
        helper.make_node("Cast", ["m"], ["mf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mf", "fmin"], ["mask"], name="mask"),  # finfo.min: a mask value
    ]
    model = _graph(nodes, [_f32("zero", 0.0), _f32("fmin", mask_min)], ["n", "w", "mask"], [2, 8])
    x = torch.linspace(-1, 1, 16).reshape(2, 8)
    report = audit(model, [{"X": x}, {"X": x + 2}])  # the second input has no x <= 0
    assert report.flagged == []
    assert [n.name for n in report.noted] == ["log", "mask"]
    share = int((x <= 0).sum()) / 32
    log = report.node("log")
    assert log.nan_inf_produced == log.nan_inf == share
    assert log.notes == ("makes NaN/Inf from finite inputs, in float32 already (see NaN/Inf new)",)
    assert report.node("neg").nan_inf == share and report.node("neg").nan_inf_produced == 0
    assert report.node("where").nan_inf_produced == 0 and report.node("ninf").notes == ()
    mask = report.node("mask")
    assert mask.sentinel == mask.overflow == share
    note = "float32's ±3.4e+38 mask value: ±inf in float16, unless it comes from a literal, which converters clip to ±6.55e+04"
    assert mask.notes == (note,)
    text = report.render()
    assert f"notes (not flagged):\n  {log.notes[0]}: Log 'log'\n  {note}: Mul 'mask'" in text
    assert text.endswith("over 2 inputs: 0 flagged, 2 with notes")


# -- bfloat16 ------------------------------------------------------------------------------------------------------


def test_bfloat16_flags_only_its_own_range(
    hazard_audits: dict[str, tuple[AuditReport, np.ndarray]],
) -> None:
    for kind in models.fp16_hazards.kinds:  # type: ignore[attr-defined]
        model = models.fp16_hazards(kind, dtype="float32")
        report = audit(model, models.random_feeds(model, dims=DIMS, seed=0), dtype="bfloat16")
        assert report.flagged == [], kind
        assert report.node(hazard_audits[kind][0].flagged[0].name).overflow == 0
    assert (
        report.render()
        .splitlines()[1]
        .startswith("bfloat16 keeps float32's range (max 3.4e+38, smallest normal 1.2e-38)")
    )
    assert "What bfloat16 changes is rounding (8 significant bits" in report.render()
    # below bfloat16's smallest subnormal (2**-133) a float32 subnormal rounds to 0: log(x*x) for x ~ 1e-21
    nodes = [
        helper.make_node("Mul", ["X", "X"], ["sq"], name="sq"),
        helper.make_node("Log", ["sq"], ["y"], name="log"),
    ]
    x = torch.linspace(1e-21, 2e-21, 8).reshape(1, 8)
    report = audit(_graph(nodes, [], ["y"], [1, 8]), {"X": x}, dtype="bfloat16")
    (sq,) = report.flagged
    x32 = x.numpy().astype(np.float32)
    assert sq.underflow_zero == _share((x32 * x32) <= 2.0**-134) > 0
    assert sq.reasons[0].startswith("underflows to 0 in bfloat16: ") and sq.reaches == (
        ("Log", "log"),
    )


# -- deep in a 500-node graph --------------------------------------------------------------------------------------

BLOCKS, WIDTH, PLANT_EXP, PLANT_LOG = 50, 32, 41, 27


def _deep_graph() -> onnx.ModelProto:
    """50 transformer-MLP blocks of 10 nodes (MatMul, Add, GELU as Mul/Erf/Add/Mul/Mul, MatMul, residual
    Add, LayerNormalization): 500 nodes that stay in range, plus two hazards planted deep in it:
    Log(Exp(12 x)) / 12 in block 41 (Exp overflows and underflows before a Log), and the Log of squares of
    1e-6 x, projected and added back, in block 27."""
    rng = np.random.default_rng(0)
    inits = [
        _f32("w1", rng.normal(0, WIDTH**-0.5, (WIDTH, 2 * WIDTH))),
        _f32("b1", rng.normal(0, 0.1, 2 * WIDTH)),
        _f32("w2", rng.normal(0, (2 * WIDTH) ** -0.5, (2 * WIDTH, WIDTH))),
        _f32("gamma", np.ones(WIDTH)),
        _f32("beta", np.zeros(WIDTH)),
        *(
            _f32(n, v)
            for n, v in [
                ("one", 1.0),
                ("half", 0.5),
                ("inv_sqrt2", 2**-0.5),
                ("k", 12.0),
                ("inv_k", 1 / 12),
                ("small", 1e-6),
                ("milli", 1e-3),
            ]
        ),
    ]
    nodes, h = [], "X"
    for b in range(BLOCKS):
        p = f"b{b}/"

        def op(kind: str, *ins: str, out: str, p: str = p, **attrs: Any) -> str:
            nodes.append(helper.make_node(kind, list(ins), [p + out], name=p + out, **attrs))
            return p + out

        t = op("Add", op("MatMul", h, "w1", out="up"), "b1", out="bias")
        if b == PLANT_EXP:
            t = op(
                "Mul",
                op("Log", op("Exp", op("Mul", t, "k", out="scale"), out="exp"), out="log"),
                "inv_k",
                out="unscale",
            )
        gelu = op(
            "Mul",
            op(
                "Mul",
                t,
                op(
                    "Add",
                    op("Erf", op("Mul", t, "inv_sqrt2", out="s"), out="erf"),
                    "one",
                    out="cdf",
                ),
                out="xcdf",
            ),
            "half",
            out="gelu",
        )
        down = op("MatMul", gelu, "w2", out="down")
        if b == PLANT_LOG:
            tiny = op("Mul", gelu, "small", out="tiny")
            logp = op("Log", op("Mul", tiny, tiny, out="tiny_sq"), out="log_power")
            feature = op("Mul", op("MatMul", logp, "w2", out="project"), "milli", out="feature")
            down = op("Add", down, feature, out="mix")
        h = op(
            "LayerNormalization",
            op("Add", down, h, out="residual"),
            "gamma",
            "beta",
            out="norm",
            axis=-1,
        )
    model = _graph(nodes, inits, [h], [4, WIDTH])
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="session")
def deep_graph() -> onnx.ModelProto:
    return _deep_graph()


def test_a_hazard_planted_deep_in_a_500_node_graph_is_found(deep_graph: onnx.ModelProto) -> None:
    assert len(deep_graph.graph.node) >= 500
    gen = torch.Generator().manual_seed(0)
    # a generator: the inputs are made as the audit asks for them
    feeds = ({"X": torch.randn(4, WIDTH, generator=gen)} for _ in range(3))
    report = audit(deep_graph, feeds)
    assert report.inputs == 3 and len(report.nodes) == len(deep_graph.graph.node)
    exp, tiny, tiny_sq = (f"b{PLANT_EXP}/exp", f"b{PLANT_LOG}/tiny", f"b{PLANT_LOG}/tiny_sq")
    assert [n.name for n in report.flagged] == [tiny, tiny_sq, exp]
    e = report.node(exp)
    assert [r.split(":")[0] for r in e.reasons] == [
        "overflows float16",
        "underflows to 0 in float16",
    ]
    assert e.consumers == e.reaches == (("Log", f"b{PLANT_EXP}/log"),)
    assert report.node(tiny).reaches == (("Log", f"b{PLANT_LOG}/log_power"),)
    assert f"via Mul '{tiny_sq}'" in report.node(tiny).reasons[0]
    assert report.render().splitlines()[4].split()[:2] == ["Mul", tiny]


# -- arguments and the package -------------------------------------------------------------------------------------


def test_bad_arguments_are_named() -> None:
    model = models.fp16_hazards("log", dtype="float32")
    feeds = models.random_feeds(model, dims=DIMS)
    with pytest.raises(
        ValueError,
        match=r"audit: dtype='float32' is not a half-precision type; use 'float16' or 'bfloat16'",
    ):
        audit(model, feeds, dtype="float32")
    with pytest.raises(
        ValueError,
        match=r"audit: feeds_iter yielded no feeds; pass one dict of inputs or an iterable of them",
    ):
        audit(model, [])
    with pytest.raises(TypeError, match=r"audit: feeds_iter yields a Tensor; it must yield dicts"):
        audit(model, [feeds["X"]])  # type: ignore[list-item]
    with pytest.raises(KeyError, match="no node 'nope' in this audit"):
        audit(model, feeds).node("nope")


def test_the_package_is_lazy_and_audit_is_the_function() -> None:
    # the public path (an alias of pytest_ortdiff.analyses.precision): the same module, as lazy
    import importlib

    import pytest_ortdiff.precision as precision

    importlib.import_module("pytest_ortdiff.precision.audit")  # binds nothing over the function
    assert precision.audit is audit and callable(precision.audit)
    assert isinstance(
        audit(
            models.fp16_hazards("log", dtype="float32"),
            models.random_feeds(models.fp16_hazards("log", dtype="float32"), dims=DIMS),
        ).nodes[0],
        NodeAudit,
    )
    code = "import sys, pytest_ortdiff.precision as p; print('torch' in sys.modules, ' '.join(p.__all__))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "False" and {
        "AuditReport",
        "NodeAudit",
        "audit",
        "KeepReport",
        "keep_float32",
    } <= set(out[1:])
