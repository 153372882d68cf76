"""ONNX's node test suite through the torch evaluator (pytest_ortdiff.conformance): every case whose ops
all have kernels passes or is refused by name, the totals meet the goal, and the known lists stay current."""

from __future__ import annotations

import fnmatch
import functools
import warnings
from collections import Counter
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pytest_ortdiff import conformance
from pytest_ortdiff.conformance import KNOWN_UNSUPPORTED, CaseResult
from pytest_ortdiff.conformance.contrib_cases import summary as contrib_summary

#: kernel bugs the suite finds: xfail(strict=True) until fixed, so that the fix fails this file (XPASS)
#: and its entry goes. A variant the evaluator cannot compute on purpose goes to KNOWN_UNSUPPORTED instead.
KNOWN_BUGS: dict[str, str] = {}

#: the coverage goal (issue 10: at least 1,450 passing; onnxruntime's CPU provider passes 1,323 and
#: onnx.reference 1,661 with the same counting). The wrong ones are all in KNOWN_UNSUPPORTED with why: 6
#: Attention cases where onnx.reference rounds step by step in 16 bits, 2 inverse DFTs whose expected
#: values carry numpy's round-off.
GOAL_PASS = 1800
GOAL_MAX_WRONG = 8


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The suite is generated at collection, once per process (each xdist worker collects on its own),
    # and pickled into pytest's cache for the next run. One test per op rather than per case: 1,300
    # items cost more in xdist's bookkeeping than the cases take to run.
    if "op" in metafunc.fixturenames:
        cache = getattr(metafunc.config, "cache", None)
        conformance.load_cases(cache.mkdir("ortdiff-conformance") if cache is not None else None)
        metafunc.parametrize("op", sorted(_suite()[1]))


@functools.cache
def _suite() -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The cases by name, and per op its cases whose every node has a kernel (an `_expanded` case counts
    for its function's op)."""
    cases = conformance.load_cases()
    by_name = {case.name: case for case in cases}
    ops: dict[str, list[str]] = {}
    for case in cases:
        if conformance.has_kernels(case):
            ops.setdefault(conformance.op_under_test(case, by_name), []).append(case.name)
    return by_name, ops


@functools.cache
def _result(name: str) -> CaseResult:
    by_name = _suite()[0]
    with warnings.catch_warnings():  # as the report runs them: the generators' own warnings are not ours
        warnings.simplefilter("ignore")
        return conformance.run_case(by_name[name], conformance.op_under_test(by_name[name], by_name))


_ADVICE = {
    "wrong": "a kernel computes something other than ONNX expects: fix it, or, if the expected values are "
    "what is off, list the case in conformance.KNOWN_UNSUPPORTED with why",
    "error": "a variant a kernel cannot compute must raise UnsupportedVariantError (refused by name); any "
    "other exception is a bug",
}


def _problem(r: CaseResult) -> str | None:
    """What is wrong with a case's outcome, or None: it passes, is refused with a reason, is a known
    difference, or (every node having a kernel) misses one in a subgraph."""
    if r.status in ("pass", "no kernel"):
        return None
    if r.status == "unsupported":
        return None if r.detail.strip() else f"{r.name} [{r.op}] is unsupported without a reason"
    if r.status == "wrong" and conformance.known_reason(r.name):
        return None
    return (
        f"{r.name} [{r.op}] is {r.status}: {r.detail}\n"
        f"    graph ops: {', '.join(r.ops)}; {_ADVICE[r.status]}\n"
        f"    report: python -m pytest_ortdiff conformance -k {r.name} -v"
    )


def test_op_cases_pass_or_are_refused_by_name(op: str) -> None:
    names = [name for name in _suite()[1][op] if name not in KNOWN_BUGS]  # test_known_bug runs those
    problems = [p for p in (_problem(_result(name)) for name in names) if p]
    if problems:
        pytest.fail(f"{len(problems)} of {len(names)} {op} cases fail:\n" + "\n".join(problems), pytrace=False)


def test_known_bugs_still_fail() -> None:
    # a fixed bug must leave KNOWN_BUGS, so that the op's own test covers its cases again
    fixed = [name for name in KNOWN_BUGS if not _problem(_result(name))]
    assert not fixed, f"these KNOWN_BUGS cases pass now; remove them from KNOWN_BUGS: {fixed}"


def test_totals_meet_the_goal() -> None:
    results = [_result(name) for name in _suite()[0]]
    total = Counter(r.status for r in results)
    if total["pass"] < GOAL_PASS or total["wrong"] > GOAL_MAX_WRONG:
        pytest.fail(
            f"the goal is at least {GOAL_PASS} cases passing and at most {GOAL_MAX_WRONG} wrong; now "
            f"{conformance.summary(results)}",
            pytrace=False,
        )


@pytest.mark.parametrize("pattern", sorted(KNOWN_UNSUPPORTED))
def test_known_unsupported_entry_is_current(pattern: str) -> None:
    assert KNOWN_UNSUPPORTED[pattern].strip(), f"KNOWN_UNSUPPORTED[{pattern!r}] gives no reason"
    names = [name for name in _suite()[0] if fnmatch.fnmatchcase(name, pattern)]
    if not names:
        pytest.fail(
            f"KNOWN_UNSUPPORTED[{pattern!r}] matches no case of onnx {onnx.__version__}'s suite: a typo, "
            "or the case is gone; fix or remove the entry",
            pytrace=False,
        )
    passing = [name for name in names if _result(name).status == "pass"]
    if passing:
        pytest.fail(
            f"KNOWN_UNSUPPORTED[{pattern!r}] is stale: {', '.join(passing)} now pass; remove the entry "
            "or narrow its pattern",
            pytrace=False,
        )


def test_known_bugs_are_cases_run_here_and_not_excused() -> None:
    gone = sorted(set(KNOWN_BUGS) - {name for names in _suite()[1].values() for name in names})
    assert not gone, f"KNOWN_BUGS names cases this file no longer runs (renamed, or an op lost its kernel): {gone}"
    excused = [name for name in KNOWN_BUGS if conformance.known_reason(name)]
    assert not excused, f"bugs must fail until fixed, not be listed in KNOWN_UNSUPPORTED: {excused}"


# -- the runner's messages, on small made-up cases ----------------------------------------------------


def _case(name: str, node: onnx.NodeProto, x: np.ndarray, expected: np.ndarray, *initializers: TensorProto) -> Any:
    """A stand-in for onnx's TestCase: one node from x to y, one data set."""
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(expected.dtype), list(expected.shape))],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return SimpleNamespace(name=name, model=model, data_sets=[([x], [expected])], rtol=1e-3, atol=1e-7)


def test_wrong_value_message_points_at_the_first_difference() -> None:
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], dtype=np.float32)
    expected = np.maximum(x, 0)
    expected[1, 2] = 6.5
    r = conformance.run_case(_case("test_made_up_relu", helper.make_node("Relu", ["x"], ["y"]), x, expected))
    assert (r.status, r.op, r.ops) == ("wrong", "Relu", ("Relu",))
    assert r.detail == (
        "output 'y': 1 of 6 values off by more than rtol=0.001, atol=1e-07 (first at [1, 2]: got 6.0, "
        "expected 6.5); worst 1.05e+06 ulp of float32"
    )


def test_error_message_and_known_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.zeros((2, 3), dtype=np.float32)
    reshape = helper.make_node("Reshape", ["x", "shape"], ["y"])  # 6 values into [5, 7]
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [5, 7])
    case = _case("test_made_up_reshape", reshape, x, np.zeros((5, 7), np.float32), shape)
    r = conformance.run_case(case)
    assert r.status == "error"
    assert r.detail.startswith("run: RuntimeError: torch kernel ")
    assert "on node '?' (Reshape) with inputs x: float32[2, 3], shape: int64[2]" in r.detail
    monkeypatch.setitem(KNOWN_UNSUPPORTED, "test_made_up_re*", "made up to test the report")
    r = conformance.run_case(case)
    assert (r.status, r.detail) == ("unsupported", "known: made up to test the report")


def test_verbose_report_groups_known_wrong_cases_and_lists_failures_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KNOWN_UNSUPPORTED, "test_b", "the suite rounds differently")
    results = [
        CaseResult("test_a", "Relu", "pass", ops=("Relu",)),
        CaseResult("test_b", "Softmax", "wrong", "output 'y': 1 of 4 values off", ("Softmax",)),
        CaseResult("test_c", "Clip", "error", "run: RuntimeError: boom", ("Clip",)),
        CaseResult("test_d", "Equal", "unsupported", "input 'x' is a string tensor", ("Equal",)),
        CaseResult("test_e", "Foo", "no kernel", "Foo (opset 17)", ("Foo",)),
    ]
    lines = conformance.render(results, verbose=True).splitlines()
    assert lines[0].split() == ["op", "cases", "pass", "wrong", "unsupported", "no", "kernel", "error"]
    assert lines[2].split() == ["Clip", "1", "0", "0", "0", "0", "1"]
    assert "Foo            1           0           0           0           1           0" in lines
    assert lines[lines.index("") + 1] == (
        "1 of 5 cases pass, 1 wrong (1 known), 1 unsupported, 1 without a kernel, 1 error; "
        "4 ops with a kernel, 1 without"
    )
    tail = lines[lines.index("unsupported (refused by name):") :]
    assert tail == [
        "unsupported (refused by name):",
        "  test_d [Equal]: input 'x' is a string tensor",
        "",
        "wrong, known (conformance.KNOWN_UNSUPPORTED):",
        "  because the suite rounds differently:",
        "    test_b [Softmax]: output 'y': 1 of 4 values off",
        "",
        "error:",
        "  test_c [Clip]: run: RuntimeError: boom",
    ]


def test_case_cache_round_trips_without_pickle(tmp_path: Any) -> None:
    # the cache in .pytest_cache is JSON and ONNX protobufs: reading it cannot run code (a pickle could)
    cases = conformance.load_cases()
    some = tuple(c for c in cases if c.name in {"test_relu", "test_sequence_insert_at_back", "test_cast_FLOAT_to_FLOAT8E4M3FN"})
    assert len(some) == 3
    path = tmp_path / "cases.onnxcases"
    conformance._write_cache(path, some)
    assert b"pickle" not in path.read_bytes()[:64] and path.read_bytes().startswith(b"ortdiff-node-cases-1")
    back = conformance._read_cache(path)
    assert back is not None and [c.name for c in back] == [c.name for c in some]
    for a, b in zip(some, back, strict=True):
        assert a.model == b.model and (a.rtol, a.atol, a.kind) == (b.rtol, b.atol, b.kind)
        for (ins_a, outs_a), (ins_b, outs_b) in zip(a.data_sets, b.data_sets, strict=True):
            for x, y in zip([*ins_a, *outs_a], [*ins_b, *outs_b], strict=True):
                if isinstance(x, list):
                    assert [np.asarray(v).tobytes() for v in x] == [np.asarray(v).tobytes() for v in y]
                elif isinstance(x, TensorProto):
                    assert x == y
                else:
                    assert np.asarray(x).dtype == np.asarray(y).dtype
                    assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
    # a pickle (or any other file) where the cache should be is ignored, never loaded
    import pickle

    path.write_bytes(pickle.dumps(some[:1]))
    assert conformance._read_cache(path) is None


@pytest.mark.skipif(not hasattr(__import__("os"), "symlink"), reason="needs symlinks")
def test_case_cache_is_never_written_through_a_planted_symlink(tmp_path: Any) -> None:
    """Issue 29, item 13: someone who can create files in the cache directory plants a link at the name the
    writer used to take (`<cache>.<pid>.tmp`, and a few other guesses): the file it points to is untouched, the
    cache is written whole, and no temporary file stays behind."""
    import os

    cases = conformance.load_cases()
    some = tuple(c for c in cases if c.name == "test_relu")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "cases.onnxcases"
    planted = [f"{path.name}.{os.getpid()}.tmp", f".{path.name}.tmp", f"{path.name}.tmp"]
    for name in planted:
        os.symlink(victim, tmp_path / name)
    conformance._write_cache(path, some)
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and path.read_bytes().startswith(b"ortdiff-node-cases-1")
    back = conformance._read_cache(path)
    assert back is not None and [c.name for c in back] == ["test_relu"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*planted, path.name, victim.name])


# -- onnxruntime's contrib ops (pytest_ortdiff.conformance.contrib_cases; each case is a test in test_contrib_conformance.py)

#: the contrib ops' goal (issue 28): what onnxruntime's tool chain writes for BERT, GPT-2, Llama, Qwen2,
#: Mistral, Phi-3, T5, ViT, Whisper and CLIP has a kernel, and every case run on this machine's onnxruntime
#: matches it or departs by what it names. The CUDA-only cases count as "no onnxruntime" without a GPU.
GOAL_OPS = 52
GOAL_PASS_CPU = 326  # (on onnxruntime 1.31: 1.32's 332 less 6 cases of variants 1.31 lacks)
GOAL_MAX_DEPARTS = 10
MUST_HAVE = {
    "SimplifiedLayerNormalization", "com.microsoft::SkipSimplifiedLayerNormalization", "com.microsoft::SkipLayerNormalization",
    "com.microsoft::BiasGelu", "com.microsoft::FastGelu", "com.microsoft::MatMulNBits", "com.microsoft::Attention",
    "com.microsoft::GatherBlockQuantized", "com.microsoft::QuickGelu", "com.microsoft::GroupQueryAttention",
    "com.microsoft::Gelu", "com.microsoft::EmbedLayerNormalization", "com.microsoft::FusedMatMul",
    "com.microsoft::MultiHeadAttention", "com.microsoft::RotaryEmbedding", "com.microsoft::QAttention",
    "com.microsoft::FusedGemm", "com.microsoft::QEmbedLayerNormalization", "com.microsoft::BiasAdd",
    "com.microsoft::BiasSplitGelu", "com.microsoft::BiasSoftmax", "com.microsoft::DynamicQuantizeMatMul",
    "com.microsoft::MatMulIntegerToFloat", "com.microsoft::QGemm", "com.microsoft::SkipGroupNorm", "com.microsoft::GroupNorm",
    "com.microsoft::DecoderMaskedMultiHeadAttention", "com.microsoft::SparseAttention", "com.microsoft.nchwc::Conv",
}


def test_contrib_totals_meet_the_goal() -> None:
    """The counts: every op the tool chain writes has cases, and the totals stay where they are."""
    from test_contrib_conformance import _CASES, _result

    results = [_result(c.name, p) for c in _CASES for p in c.providers]
    total = Counter(r.status for r in results)
    ops = {c.op for c in _CASES}
    assert not MUST_HAVE - ops, f"no contrib case for {sorted(MUST_HAVE - ops)}"
    import torch

    passing = GOAL_PASS_CPU if not torch.cuda.is_available() else GOAL_PASS_CPU + 50
    if len(ops) < GOAL_OPS or total["pass"] < passing or total["departs"] > GOAL_MAX_DEPARTS or total["wrong"] or total["error"]:
        pytest.fail(
            f"the goal is {GOAL_OPS} ops, at least {passing} cases passing, at most {GOAL_MAX_DEPARTS} departing, "
            f"none wrong or in error; now {contrib_summary(results)}",
            pytrace=False,
        )
