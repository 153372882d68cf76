"""TF32, named and chosen: the torch evaluator computes float32 in IEEE float32 (torch's TF32 switches off for
its runs, restored after, across threads), onnxruntime takes the user's provider options (`use_tf32=0`) from
the Checker, the command line, the ini file or the marker, and a failing CUDA float32 report says when TF32
was in play. What only a GPU shows (what each switch changes in the numbers) is in benchmarks/gpu_check.sh."""

from __future__ import annotations

import importlib
import threading
from typing import Any

import onnx
import onnx.helper as oh
import pytest
import torch

from pytest_ortdiff import Checker, OrtRunner, TorchEvaluator, models
from pytest_ortdiff.engine.check import CheckResult, Judgement
from pytest_ortdiff.numerics.diff import compare
from pytest_ortdiff.numerics.tolerance import Tolerance
from pytest_ortdiff.runtimes import tf32
from pytest_ortdiff.runtimes.providers import (
    normalize_provider_options,
    options_in_force,
    parse_provider_options,
    provider_options_in_force,
    tf32_in_play,
    tf32_line,
)
from pytest_ortdiff.runtimes.tf32 import ieee_float32, precision_settings

# -- the evaluator's IEEE float32 ------------------------------------------------------------------------


@pytest.fixture
def tf32_allowed() -> object:
    """torch's own CUDA default for convolutions, and TF32 matmuls allowed as a user may have them."""
    saved = tf32._save("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    yield
    tf32._restore(saved)


def _ieee(settings: dict[str, object]) -> bool:
    """CUDA's float32 is IEEE by torch's own flags (which, on torch >= 2.9, read the per-backend ones too and
    raise when the two disagree: they must stay readable)."""
    return settings["cuda.matmul.allow_tf32"] is False and settings["cudnn.allow_tf32"] is False


def test_ieee_float32_turns_tf32_off_on_cuda_and_restores_it(tf32_allowed: object) -> None:
    before = precision_settings("cuda")
    assert not _ieee(before)
    with ieee_float32("cuda"):
        assert _ieee(precision_settings("cuda")), precision_settings("cuda")
        with ieee_float32("cuda"):  # nested: still IEEE, and the outer exit restores
            assert _ieee(precision_settings("cuda"))
        assert _ieee(precision_settings("cuda"))
    assert precision_settings("cuda") == before
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


@pytest.mark.skipif(not tf32._NEW_API, reason="torch < 2.9 has only the allow_tf32 flags")
def test_torchs_own_flags_stay_readable_inside_and_after() -> None:
    """torch >= 2.9 raises on reading torch.backends.cudnn.allow_tf32 when its per-op flags were set apart from
    it (torch.export reads it): the switch keeps both in step, from torch's default state and back to it."""
    cudnn: Any = torch.backends.cudnn
    before = (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision, cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    with ieee_float32("cuda"):
        assert (cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
        assert cudnn.conv.fp32_precision != "tf32" and cudnn.rnn.fp32_precision != "tf32"
    assert (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision, cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before


def test_overlapping_runs_in_threads_restore_only_when_the_last_one_leaves(tf32_allowed: object) -> None:
    """torch's switches are process-wide: a thread leaving first must not turn TF32 back on under another."""
    before = precision_settings("cuda")
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, dict[str, object]] = {}

    def a() -> None:
        with ieee_float32("cuda"):
            a_in.set()
            b_in.wait()
        a_out.set()

    def b() -> None:
        a_in.wait()
        with ieee_float32("cuda"):
            b_in.set()
            a_out.wait()
            seen["b after a left"] = precision_settings("cuda")

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _ieee(seen["b after a left"])
    assert precision_settings("cuda") == before


def test_nothing_is_touched_where_float32_is_ieee_already() -> None:
    saved = tf32._save("cuda")
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        with ieee_float32("cuda"):
            assert tf32._DEPTH == 0  # no change made, none to undo
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    finally:
        tf32._restore(saved)


@pytest.mark.skipif(not hasattr(getattr(torch.backends, "mkldnn", None), "matmul"), reason="this torch has no per-backend float32 precision")
def test_the_evaluator_runs_in_ieee_float32_and_restores_the_users_setting() -> None:
    """On CPU the same switch covers oneDNN's reduced-precision float32 (bf16/TF32 on CPUs with AMX): a kernel
    override sees IEEE during the run, the user's setting is back after it, also when a kernel raises."""
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0)
    seen: list[dict[str, object]] = []

    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(precision_settings("cpu"))
        return a @ b

    mkldnn = torch.backends.mkldnn.matmul  # type: ignore[attr-defined]
    saved = mkldnn.fp32_precision
    try:
        mkldnn.fp32_precision = "bf16"
        (z,) = TorchEvaluator(model, kernels={("", "MatMul"): matmul}).run(None, feeds)
        assert seen and seen[0]["mkldnn.matmul.fp32_precision"] == "ieee"
        assert mkldnn.fp32_precision == "bf16"
        (plain,) = TorchEvaluator(model).run(None, feeds)
        assert torch.equal(z, plain)

        def failing(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            TorchEvaluator(model, kernels={("", "MatMul"): failing}).run(None, feeds)
        assert mkldnn.fp32_precision == "bf16"
    finally:
        mkldnn.fp32_precision = saved


# -- provider options ------------------------------------------------------------------------------------


def test_provider_options_parse_and_normalize() -> None:
    assert parse_provider_options("cuda:use_tf32=0, cudnn_conv_algo_search=DEFAULT") == {
        "CUDA": {"use_tf32": "0", "cudnn_conv_algo_search": "DEFAULT"}
    }
    assert normalize_provider_options({"CUDAExecutionProvider": {"use_tf32": False, "device_id": 1}}) == {"CUDA": {"use_tf32": "0", "device_id": "1"}}
    assert normalize_provider_options({"CUDA": {"use_tf32": "true"}}) == {"CUDA": {"use_tf32": "1"}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("use_tf32=0", r"expected PROVIDER:key=value\[,key=value...\], e.g. CUDA:use_tf32=0; got 'use_tf32=0'"),
        ("CUDA:use_tf32", r"'use_tf32' has no '='"),
        ("CUDA:", "no option given for CUDA"),
        ("GPU:use_tf32=0", r"unknown provider 'GPU'; valid: CPU, CUDA"),
        ("CUDA:use_tf32=maybe", r"CUDA option use_tf32='maybe': give 0 or 1 \(or True/False\)"),
        ("CUDA:device_id=first", r"CUDA option device_id='first': give a non-negative integer"),
        ("CUDA:bad key=1", r"CUDA option name 'bad key' is not a name"),
    ],
)
def test_bad_provider_options_name_the_problem_and_the_form(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_provider_options(spec)


def test_options_in_force_reach_every_runner_made_inside_and_go_after() -> None:
    assert options_in_force("CUDA") == {}
    with provider_options_in_force({"CUDA": {"use_tf32": "0"}}):
        with provider_options_in_force({"CUDA": {"device_id": "0"}}):
            assert options_in_force("CUDA") == {"use_tf32": "0", "device_id": "0"}
        assert options_in_force("CUDA") == {"use_tf32": "0"}
        assert OrtRunner(models.layer_norm_matmul_add(dtype="float32"), provider="CUDA").provider_options == {"use_tf32": "0"}
        # the runner's own options win over those in force
        own = OrtRunner(models.layer_norm_matmul_add(dtype="float32"), provider="CUDA", provider_options={"use_tf32": 1})
        assert own.provider_options == {"use_tf32": "1"}
    assert options_in_force("CUDA") == {}


def test_an_option_onnxruntime_does_not_know_for_the_provider_is_refused_naming_it() -> None:
    """onnxruntime ignores an unknown provider option silently: the runner checks what the session took."""
    model = models.layer_norm_matmul_add(dtype="float32")
    with pytest.raises(ValueError, match=r"onnxruntime's CPUExecutionProvider has no option 'use_tf32'; it takes no options"):
        OrtRunner(model, provider="CPU", provider_options={"use_tf32": 0}, cache=False).run(None, models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}))


def test_tf32_is_in_play_for_cuda_float32_unless_turned_off() -> None:
    assert tf32_in_play("CUDA", "float32", {})
    assert tf32_in_play("CUDA", "float32", {"use_tf32": "1"})
    assert not tf32_in_play("CUDA", "float32", {"use_tf32": "0"})
    assert not tf32_in_play("CUDA", "float16", {})
    assert not tf32_in_play("CPU", "float32", {})
    assert OrtRunner(models.layer_norm_matmul_add(dtype="float32"), provider="CUDA").tf32("float32")
    assert not OrtRunner(models.layer_norm_matmul_add(dtype="float32"), provider="CUDA", provider_options={"use_tf32": 0}).tf32("float32")


def test_checker_takes_provider_options_and_validates_them() -> None:
    checker = Checker("CUDA", "float32", provider_options={"use_tf32": False})
    assert checker.provider_options == {"use_tf32": "0"}
    assert "provider_options={'use_tf32': '0'}" in repr(checker)
    with checker.options_in_force():
        assert options_in_force("CUDA") == {"use_tf32": "0"}
    with pytest.raises(ValueError, match=r"Checker\(provider_options=...\): CUDA option use_tf32=2: give 0 or 1"):
        Checker("CUDA", "float32", provider_options={"use_tf32": 2})


def test_a_failing_cuda_float32_report_says_tf32_was_in_play_in_one_line_with_the_fix() -> None:
    line = tf32_line({})
    assert "\n" not in line
    assert line.startswith("onnxruntime's CUDA provider ran with use_tf32=1 (its default): its float32 MatMul/Gemm may round inputs to TF32")
    assert "--ort-provider-options=CUDA:use_tf32=0" in line
    assert "(as asked)" in tf32_line({"use_tf32": "1"})
    e = torch.linspace(-1, 1, 100)
    report = compare(e, e + 1e-3, tolerance=(1e-5, 0.0))
    tol = Tolerance(atol=1e-5, rtol=0.0)
    result = CheckResult("CUDA", "float32", tol, "torch", (Judgement("torch evaluator vs onnxruntime", report, tuple(tol.check(report))),), notes=(line,))
    rendered = result.render().splitlines()
    assert rendered[0] == "ortdiff: torch evaluator vs onnxruntime CUDA float32: tolerance broken (atol=1e-05 rtol=0)"
    assert rendered[-1] == f"note: {line}"


def test_a_check_notes_an_ir_version_read_as_an_older_one() -> None:
    model = oh.make_model(
        oh.make_graph(
            [oh.make_node("Relu", ["x"], ["y"])], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])], [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])]
        ),
        opset_imports=[oh.make_opsetid("", 18)],
        ir_version=9,
    )
    result = Checker("CPU", "float32").check(model, {"x": torch.tensor([1.0, -1.0, 0.5])})
    assert result.notes == ()
    newer = onnx.ModelProto()
    newer.CopyFrom(model)
    newer.ir_version = onnx.IR_VERSION + 1
    runner = OrtRunner(newer)
    runner.run(None, {"x": torch.zeros(3)})
    assert runner.notes and runner.notes[0].startswith(f"IR version {onnx.IR_VERSION + 1} read as ")


# -- provider options through the plugin: ini < command line < marker --------------------------------

OPTIONS_TEST = """
import pytest
from pytest_ortdiff import models
from pytest_ortdiff.runtimes.providers import options_in_force

@pytest.mark.ortdiff(providers=["CPU"], provider_options={"CPU": {"b": 5}, "CUDA": {"use_tf32": True}})
def test_options(ortdiff):
    assert ortdiff.provider_options == {"a": "1", "b": "5", "c": "3"}
    assert options_in_force("CPU") == {"a": "1", "b": "5", "c": "3"}
    model = models.layer_norm_matmul_add(dtype="float32")
    ortdiff.check(model, models.random_feeds(model, dims={"a": 1, "b": 2, "c": 4}, seed=0))

def test_after():
    assert options_in_force("CPU") == {}
"""


def test_provider_options_from_ini_command_line_and_marker_reach_onnxruntime(pytester: pytest.Pytester) -> None:
    """The marker's options win over the command line's, which win over the ini file's; onnxruntime gets them
    (its CPU provider knows none of these: the session refuses them by name)."""
    pytester.makeini("[pytest]\nortdiff_provider_options =\n    CPU: a=0, c=3\n")
    pytester.makepyfile(test_opts=OPTIONS_TEST)
    result = pytester.runpytest("--ort-provider-options=CPU:a=1,b=2")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*onnxruntime's CPUExecutionProvider has no option 'a', 'b', 'c'; it takes no options*"])


def test_bad_provider_options_on_the_command_line_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(ortdiff):\n    pass\n")
    result = pytester.runpytest("--ort-provider-options=CUDA:use_tf32=yes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--ort-provider-options: CUDA option use_tf32='yes': give 0 or 1 (or True/False)*"])


def test_bad_provider_options_in_a_marker_fail_the_test_naming_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n@pytest.mark.ortdiff(provider_options={'GPU': {'use_tf32': 0}})\ndef test_a(ortdiff):\n    pass\n"
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["*@pytest.mark.ortdiff on test_*.py::test_a: provider_options: unknown provider 'GPU'*"])


def test_help_lists_the_provider_options(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--ort-provider-options=PROVIDER:KEY=VALUE*", "*ortdiff_provider_options (linelist)*"])


def test_blame_rows_of_gemms_and_convolutions_say_tf32_when_it_was_in_play(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU: CUDA, float32, use_tf32 not 0. Here the condition is granted on CPU to show what the table says."""
    blame_module = importlib.import_module("pytest_ortdiff.engine.blame")  # (the package's `blame` is the function)
    seen: list[tuple[str, str, dict[str, str]]] = []

    def in_play(provider: str, dtype: str, options: dict[str, str]) -> bool:
        seen.append((provider, dtype, options))
        return True

    monkeypatch.setattr(blame_module, "tf32_in_play", in_play)
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 2, "b": 8, "c": 64}, seed=0)
    table = blame_module.blame(model, feeds, provider="CPU")
    assert seen == [("CPU", "float32", {})]
    assert {r.op_type: r.tf32 for r in table.rows} == {"LayerNormalization": False, "MatMul": True, "Add": False}
    text = table.render(top=10)
    assert "MatMul (TF32)" in text and "Add (TF32)" not in text
    note = text[text.index("note: (TF32) rows: ") :]
    assert " ".join(note.split()).startswith("note: (TF32) rows: onnxruntime's CUDA provider ran with use_tf32=1 (its default)")
    assert "--ort-provider-options=CUDA:use_tf32=0" in note.replace("\n", "")
    assert table.to_dict()["rows"][0]["tf32"] in (True, False)
