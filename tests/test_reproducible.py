"""Reproducibility: the seed-000 graph run repeatedly, with 1 vs 2 threads and graph optimizations on
vs off, compared bit for bit; a deliberately nondeterministic runtime is caught; the marker form."""

from __future__ import annotations

import json

import pytest
import torch

from pytest_ortdiff import models
from pytest_ortdiff.engine.reproducible import ReproducibilityReport, check_reproducible
from pytest_ortdiff.runtimes.ort import OrtRunner

SEED_DIMS = {"a": 2, "b": 256, "c": 1152}


def _cuda_usable() -> bool:
    from pytest_ortdiff.runtimes.providers import unavailable_reason

    return unavailable_reason("CUDA") is None


@pytest.fixture
def noisy_ort(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime made nondeterministic: from the second call on, ~1 % of the elements move by a few
    1e-6, differently each call (what a reduction whose order depends on scheduling does)."""
    original = OrtRunner.run
    calls = [0]

    def run(self: OrtRunner, output_names, feeds):  # type: ignore[no-untyped-def]
        outs = original(self, output_names, feeds)
        calls[0] += 1
        if calls[0] == 1:
            return outs
        g = torch.Generator().manual_seed(calls[0])
        noisy = []
        for t in outs:
            mask = torch.rand(t.shape, generator=g) < 0.01
            noisy.append(torch.where(mask, t + 4e-6 * torch.randint(1, 4, t.shape, generator=g).to(t.dtype), t))
        return noisy

    monkeypatch.setattr(OrtRunner, "run", run)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_seed_000_graph_on_cpu_threads_and_graph_optimizations(dtype: str) -> None:
    model = models.layer_norm_matmul_add(dtype=dtype)
    feeds = models.random_feeds(model, dims=SEED_DIMS, seed=0)
    rep = check_reproducible(model, feeds, threads=(1, 2), runs=3)
    print(rep.render())  # the figures for the record (pytest -s)
    n = 2 * 256 * 1152
    assert (rep.model, rep.provider, rep.dtype, rep.runs) == ("layer_norm_matmul_add", "CPU", dtype, 3)
    assert [(v.kind, v.against, v.got.split(" (")[0]) for v in rep.variations] == [
        ("repeat", "run 1 (default options)", "runs 2-3" if rep.variations[0].identical else rep.variations[0].got.split(" (")[0]),
        ("threads", "intra_op_num_threads=1", "intra_op_num_threads=2"),
        ("graph_optimization", "graph_optimization_level=all", "graph_optimization_level=disable"),
        ("graph_optimization", "graph_optimization_level=all", "graph_optimization_level=basic"),
        ("graph_optimization", "graph_optimization_level=all", "graph_optimization_level=extended"),
    ]
    for v in rep.variations:
        assert v.n == n and v.report is not None and v.report.n == n and v.report.dtype == dtype
        assert not v.error
        assert v.identical == (v.bit_mismatches == 0)
        # a value difference is a bit difference; bits may differ with equal values (-0.0, NaN payloads)
        assert v.report.mismatches <= v.bit_mismatches
        assert v.outputs_differ == (("Z",) if v.bit_mismatches else ())
    # one session, same inputs: onnxruntime's CPU kernels partition work statically, so run to run is exact
    assert rep.variations[0].identical
    assert rep.reproducible == all(v.identical for v in rep.variations)
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["reproducible"] == rep.reproducible and len(data["variations"]) == 5
    assert data["variations"][1]["report"]["n"] == n
    assert rep.render().splitlines()[0] == f"ortdiff.check_reproducible: layer_norm_matmul_add on CPU ({dtype}): {rep.summary()}"


@pytest.mark.usefixtures("noisy_ort")
def test_nondeterministic_runtime_is_not_reproducible() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 2, "b": 32, "c": 64}, seed=0)
    rep = check_reproducible(model, feeds, runs=5, vary=("threads",), threads=(1, 2))
    assert not rep.reproducible
    repeat, threads = rep.variations
    assert repeat.kind == "repeat" and repeat.note == "4 of 4 runs differ" and repeat.got.endswith("(worst)")
    assert 0 < repeat.bit_mismatches < repeat.n == 4096 and repeat.outputs_differ == ("Z",)
    assert repeat.report is not None and 4e-6 * 0.9 < repeat.report.max_abs < 2e-5
    assert repeat.report.counts[1e-5] <= repeat.report.counts[1e-6] == repeat.report.mismatches
    assert not threads.identical
    text = rep.render()
    print(text)
    assert text.splitlines()[0] == "ortdiff.check_reproducible: layer_norm_matmul_add on CPU (float32): NOT reproducible: 2 of 2 variation(s) differ"
    assert f"repeat: run 1 (default options) vs {repeat.got}: {repeat.bit_mismatches:,} of 4,096 elements differ in their bits (4 of 4 runs differ)" in text
    assert "  |diff| >   elements   share" in text
    assert rep.worst() in (repeat.report, threads.report)


def test_torch_deterministic_algorithms_side_by_side_and_restored() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 8, "c": 16}, seed=0)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    rep = check_reproducible(model, feeds, runs=2, vary=(), torch_deterministic=True)
    assert (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) == before
    rows = [(v.kind, v.against, v.got) for v in rep.variations]
    assert rows == [
        ("repeat", "run 1 (default options)", "run 2"),
        ("torch_deterministic", "torch cpu deterministic_algorithms=True: run 1", "run 2"),
        ("torch_deterministic", "torch cpu deterministic_algorithms=False: run 1", "run 2"),
        ("torch_deterministic", "torch cpu deterministic_algorithms=True", "deterministic_algorithms=False"),
    ]
    assert rep.reproducible and all(v.n == 128 for v in rep.variations)
    # by default the torch part runs on CUDA providers only
    assert [v.kind for v in check_reproducible(model, feeds, runs=2, vary=()).variations] == ["repeat"]


def test_torch_side_takes_kernel_overrides_for_ops_without_a_kernel() -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Hardmax", ["x"], ["y"], axis=-1, name="hm")],
        "hardmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    feeds = {"x": torch.randn(4, 8, generator=torch.Generator().manual_seed(0))}
    rep = check_reproducible(model, feeds, runs=2, vary=(), torch_deterministic=True, kernels={("", "Hardmax"): "ort"})
    assert rep.reproducible
    assert [v.kind for v in rep.variations] == ["repeat", *["torch_deterministic"] * 3]


def test_torch_deterministic_that_cannot_run_is_named_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_ortdiff.runtimes.evaluator import TorchEvaluator

    original = TorchEvaluator.run

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if torch.are_deterministic_algorithms_enabled():
            raise RuntimeError("Deterministic behavior was enabled ... set CUBLAS_WORKSPACE_CONFIG=:4096:8\nmore")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TorchEvaluator, "run", run)
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 4, "c": 8}, seed=0)
    rep = check_reproducible(model, feeds, runs=2, vary=(), torch_deterministic=True)
    assert not torch.are_deterministic_algorithms_enabled()
    det_on = rep.variations[1]
    assert det_on.error == "Deterministic behavior was enabled ... set CUBLAS_WORKSPACE_CONFIG=:4096:8" and not det_on.identical
    assert len(rep.variations) == 3  # no on-vs-off row without an "on" run
    assert rep.reproducible  # what ran is reproducible; what did not run is listed as such
    assert "not run" in rep.render() and "CUBLAS_WORKSPACE_CONFIG" in rep.render()


def test_arguments_are_validated() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
    with pytest.raises(ValueError, match=r"vary: unknown variation\(s\) \['thread'\]; valid: threads, graph_optimization, deterministic_compute"):
        check_reproducible(model, feeds, vary=("thread",))
    with pytest.raises(ValueError, match="runs must be an integer >= 2"):
        check_reproducible(model, feeds, runs=1)
    with pytest.raises(ValueError, match="at least two thread counts"):
        check_reproducible(model, feeds, threads=(1,))


def test_deterministic_compute_variation() -> None:
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 4, "c": 8}, seed=0)
    rep = check_reproducible(model, feeds, runs=2, vary="deterministic_compute")
    (v,) = rep.variations[1:]
    assert (v.kind, v.against, v.got) == ("deterministic_compute", "use_deterministic_compute=False", "use_deterministic_compute=True")
    assert v.identical


@pytest.mark.skipif(not _cuda_usable(), reason="needs onnxruntime CUDAExecutionProvider and a CUDA device")
def test_cuda_runs_torch_with_deterministic_algorithms_on_and_off() -> None:
    model = models.layer_norm_matmul_add(dtype="float16")
    feeds = models.random_feeds(model, dims={"a": 4, "b": 256, "c": 1152}, seed=0, device="cuda")
    rep = check_reproducible(model, feeds, provider="CUDA", runs=3)
    print(rep.render())
    kinds = [v.kind for v in rep.variations]
    assert kinds.count("torch_deterministic") in (2, 3)  # "on" may not run without CUBLAS_WORKSPACE_CONFIG
    assert all(v.n == 4 * 256 * 1152 for v in rep.variations if not v.error)
    assert isinstance(rep, ReproducibilityReport)


# -- through pytest ------------------------------------------------------------------------------

MARKED = """
import pytest
from pytest_ortdiff import models
from pytest_ortdiff.runtimes.ort import OrtRunner

@pytest.mark.ortdiff(reproducible={marker})
def test_lnmm(ortdiff, monkeypatch):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={{"a": 2, "b": 16, "c": 32}}, seed=0)
    if {noisy}:
        original = OrtRunner.run
        calls = [0]
        def run(self, names, feeds):
            calls[0] += 1
            outs = original(self, names, feeds)
            return outs if calls[0] < 3 else [o + 1e-6 * (calls[0] % 3) for o in outs]
        monkeypatch.setattr(OrtRunner, "run", run)
    ortdiff.check(model, feeds)
"""


def test_marker_makes_check_run_the_reproducibility_check(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_m=MARKED.format(marker="True", noisy=False))
    result = pytester.runpytest("--ortdiff-reports")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "test_m.py::test_lnmm[[]CPU-float32[]]  *passed",
            "test_m.py::test_lnmm[[]CPU-float32[]] [[]reproducible[]]  *exact*passed",
        ]
    )
    result.stdout.fnmatch_lines(["test_m.py::test_lnmm[[]CPU-float32[]] [[]reproducible[]] (passed; tolerance bitwise)"])


def test_marker_reports_a_nondeterministic_runtime(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_m=MARKED.format(marker="True", noisy=True))
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*OrtDiffFailure: ortdiff.check_reproducible: layer_norm_matmul_add on CPU (float32): NOT reproducible: * variation(s) differ",
            "*repeat  *run 1 (default options)  *run * (worst) (* of 4 runs differ)*of 1,024*Z",
            "*|diff| >   elements   share*",
        ]
    )
    result.stdout.fnmatch_lines(["test_m.py::test_lnmm[[]CPU-float32[]] [[]reproducible[]]  *failed"])


def test_marker_dict_passes_arguments(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import pytest
        import pytest_ortdiff.engine.reproducible as r

        SEEN = []

        @pytest.fixture(autouse=True)
        def spy(monkeypatch):
            original = r.check_reproducible
            def check(*args, **kwargs):
                SEEN.append(kwargs)
                return original(*args, **kwargs)
            monkeypatch.setattr(r, "check_reproducible", check)
            yield
            assert SEEN and SEEN[-1]["runs"] == 2 and SEEN[-1]["vary"] == ["threads"]
        """
    )
    pytester.makepyfile(test_m=MARKED.format(marker="{'runs': 2, 'vary': ['threads']}", noisy=False))
    pytester.runpytest().assert_outcomes(passed=1)


def test_marker_without_any_check_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ortdiff(reproducible=True)
        def test_a(ortdiff):
            pass

        @pytest.mark.ortdiff(reproducible=True)
        def test_b(ortdiff):
            pytest.skip("skipped tests are not blamed")
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.ortdiff(reproducible=...) on test_marker_without_any_check_fails.py::test_a[[]CPU-float32[]], but the test ran no reproducibility check: call ortdiff.check(model, feeds)*"])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("'yes'", "reproducible must be True, False or a dict of check_reproducible arguments (runs, vary, torch_deterministic, session_options, threads), got 'yes'"),
        ("{'run': 3}", "reproducible: unknown argument(s) ['run']; valid: runs, vary, torch_deterministic, session_options, threads"),
        ("{'threads': [4]}", "reproducible: threads must list at least two thread counts such as [1, 2, 4], got [4]"),
    ],
    ids=["not-a-bool", "unknown-key", "one-thread-count"],
)
def test_bad_marker_values_are_errors(pytester: pytest.Pytester, value: str, message: str) -> None:
    pytester.makepyfile(f"import pytest\n@pytest.mark.ortdiff(reproducible={value})\ndef test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*" + "".join({"[": "[[]", "]": "[]]"}.get(c, c) for c in message)])


def test_check_reproducible_fixture_method(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from pytest_ortdiff import models

        def test_a(ortdiff):
            model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
            feeds = models.random_feeds(model, dims={"a": 1, "b": 8, "c": 16}, seed=0)
            rep = ortdiff.check_reproducible(model, feeds, runs=2, vary=["graph_optimization"])
            assert rep.reproducible and [v.kind for v in rep.variations] == ["repeat"] + ["graph_optimization"] * 3
        """
    )
    result = pytester.runpytest("--ort-dtypes=float32,float16")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_a[[]CPU-float16[]] [[]reproducible[]]  *CPU*float16*exact*passed"])


# -- the first node that differs ---------------------------------------------------------------------


def _chain():
    import onnx.helper as oh

    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("Exp", ["r"], ["e"], name="exp"),
        oh.make_node("Tanh", ["e"], ["t"], name="tanh"),
        oh.make_node("Neg", ["t"], ["y"], name="neg"),
    ]
    graph = oh.make_graph(nodes, "chain", [oh.make_tensor_value_info("x", 1, [4, 8])], [oh.make_tensor_value_info("y", 1, [4, 8])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    return model, {"x": torch.linspace(-1, 1, 32).reshape(4, 8)}


def test_localiser_names_a_planted_nondeterministic_onnxruntime_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime's Exp made nondeterministic: every other call its output "e" moves by one ulp in one
    element (what depends on it would follow on a real runtime); the localiser names exp, not relu."""
    original = OrtRunner.run
    calls = [0]

    def run(self: OrtRunner, output_names, feeds):  # type: ignore[no-untyped-def]
        names = list(output_names) if output_names else self.output_names
        outs = original(self, output_names, feeds)
        calls[0] += 1
        if calls[0] % 2 or "e" not in names:
            return outs
        i = names.index("e")
        e = outs[i].clone()
        e.view(-1)[5] = torch.nextafter(e.view(-1)[5], torch.tensor(float("inf")))
        return [*outs[:i], e, *outs[i + 1 :]]

    monkeypatch.setattr(OrtRunner, "run", run)
    model, feeds = _chain()
    model.graph.output.extend([onnx_value("e")])  # the planted change reaches an output
    rep = check_reproducible(model, feeds, runs=2, vary=())
    (v,) = rep.variations
    assert not v.identical
    assert v.first_node == "exp (Exp): output 'e', 1 of 32 elements differ in their bits", v.first_node
    assert "first node whose output differs: exp (Exp)" in rep.render()
    assert rep.to_dict()["variations"][0]["first_node"].startswith("exp")


def onnx_value(name: str):  # type: ignore[no-untyped-def]
    import onnx.helper as oh

    return oh.make_tensor_value_info(name, 1, [4, 8])


def test_localiser_names_a_planted_nondeterministic_torch_kernel() -> None:
    """A callable kernel on tanh that adds a fresh tiny noise every call: the torch side's runs differ, and
    the first node that differs is tanh (relu and exp upstream are identical run to run)."""
    gen = torch.Generator().manual_seed(0)

    def noisy_tanh(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) + 1e-6 * torch.rand(x.shape, generator=gen, device=x.device)

    model, feeds = _chain()
    rep = check_reproducible(model, feeds, runs=2, vary=(), torch_deterministic=True, kernels={"tanh": noisy_tanh})
    torch_rows = [v for v in rep.variations if v.kind == "torch_deterministic" and not v.identical]
    assert torch_rows
    for v in torch_rows:
        assert v.first_node.startswith("tanh (Tanh): output 't'"), v.first_node
    assert rep.variations[0].identical and rep.variations[0].first_node == ""  # onnxruntime itself is fine
