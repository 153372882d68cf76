"""Conformance of the torch evaluator against ONNX's own node test suite (`onnx.backend.test.case.node`).

Each case runs through `TorchEvaluator` and is classified pass / wrong / unsupported / no kernel / error;
`python -m pytest_ortdiff conformance` prints the table, tests/test_conformance.py holds the line.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import os
import re
import struct
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DESCRIPTION",
    "KNOWN_UNSUPPORTED",
    "STATUSES",
    "CaseResult",
    "add_arguments",
    "has_kernels",
    "known_reason",
    "load_cases",
    "main",
    "op_under_test",
    "render",
    "run_case",
    "run_cases",
    "run_from_args",
    "summary",
]

#: the outcomes, in report order. "wrong" is a value, shape or dtype that differs from ONNX's expected
#: output; "unsupported" a variant the evaluator refuses by name (UnsupportedVariantError, a value torch
#: cannot hold, or an entry of KNOWN_UNSUPPORTED); "no kernel" an op without a kernel (MissingKernelError).
STATUSES = ("pass", "wrong", "unsupported", "no kernel", "error")

_SOFTMAX_ROUNDING = (
    "the expected Y comes from onnx.reference, whose Softmax runs step by step in the 16-bit type (exp "
    "rounded to it, a bfloat16 sum accumulated in bfloat16, the quotient rounded: up to 3 ulp from the "
    "exact softmax); the evaluator's Softmax (torch.softmax) computes in float32 and rounds once (within "
    "0.5 ulp), as onnxruntime's float16 Softmax does, and the suite's rtol=1e-3 is below one bfloat16 ulp"
)

#: Cases the evaluator knowingly does not reproduce, and why: fnmatch patterns on the case name. An
#: error in a listed case counts as "unsupported"; a listed case that computes a different value still
#: counts as "wrong" (the report marks it known). Bugs do not belong here: tests/test_conformance.py
#: marks those xfail(strict=True) so that the fix shows. An entry that matches no case, or a passing
#: case, is stale (tests/test_conformance.py fails on it).
KNOWN_UNSUPPORTED: dict[str, str] = {
    # the Attention function body's Softmax in bfloat16/float16 (the unexpanded cases use the Attention kernel)
    "test_attention_*_bf16_expanded": _SOFTMAX_ROUNDING,
    "test_attention_4d_causal_fp16_expanded": _SOFTMAX_ROUNDING,
    # the inverse DFT of a real signal's spectrum: numpy's complex64 ifft leaves imaginary parts of
    # ~1.9e-7 (0.05 ulp at the output's scale of 54) where the exact value, and torch.fft's, is 0; the
    # case's atol of 1e-7 is below numpy's own round-off
    "test_dft_inverse*": "the expected imaginary parts are numpy's round-off (~1.9e-7 where the exact "
    "value is 0, 0.05 ulp at the output's scale); torch.fft gives the exact 0, which the case's atol=1e-7 rejects",
}

#: ops whose values are random draws: a case using one is checked for output shapes and dtypes only and
#: counted "unsupported" (values from torch's generator can never equal numpy's), never "pass" or "wrong"
RANDOM_OPS = frozenset(
    {"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike"}
)

_TORCHLESS_DTYPES = ("float4_", "float6_")  # float8 and 2/4-bit values are torch tensors (kernels/quantization.py)


@dataclass(frozen=True)
class CaseResult:
    name: str
    op: str
    status: str
    detail: str = ""
    #: every op of the case's graph (an `_expanded` case runs its op's function body)
    ops: tuple[str, ...] = ()


_loaded: list[tuple[Any, ...]] = []  # the cases, once this process has them


def load_cases(cache_dir: str | os.PathLike[str] | None = None) -> tuple[Any, ...]:
    """Every node test case of the installed onnx package, generated once per process: seconds, most of
    them onnx computing 3-D pooling outputs in pure Python. With `cache_dir` (tests/test_conformance.py
    passes pytest's cache) they are also stored there, keyed by the onnx, numpy and Python versions, and
    read back by the next process instead — as JSON and ONNX protobufs, a format that cannot run code
    when read (a pickle in a shared cache directory could)."""
    if not _loaded:
        path = None
        if cache_dir is not None:
            import onnx

            version = f"onnx{onnx.__version__}-numpy{np.__version__}-py{sys.version_info[0]}.{sys.version_info[1]}"
            path = Path(cache_dir) / f"node-cases-{version}.onnxcases"
        cases = _read_cache(path) if path else None
        if cases is None:
            cases = _generate_cases()
            if path:
                _write_cache(path, cases)
        _loaded.append(cases)
    return _loaded[0]


def _generate_cases() -> tuple[Any, ...]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        # the generators divide by zero on purpose to produce their infinities
        warnings.simplefilter("ignore")
        return tuple(collect_testcases())


_MAGIC = b"ortdiff-node-cases-1\n"


def _encode_value(v: Any, chunks: list[bytes]) -> Any:
    """A case's input or output as a JSON descriptor, its tensors appended to `chunks` as TensorProtos."""
    import onnx.numpy_helper

    if v is None:
        return {"t": "none"}
    if isinstance(v, list):
        return {"t": "list", "items": [_encode_value(x, chunks) for x in v]}
    if isinstance(v, onnx.TensorProto):
        chunks.append(v.SerializeToString())
        return {"t": "proto"}
    kind = "scalar" if isinstance(v, np.generic) else "nd"
    if not isinstance(v, np.ndarray | np.generic):
        raise TypeError(f"a value of type {type(v).__name__}")
    chunks.append(onnx.numpy_helper.from_array(np.asarray(v)).SerializeToString())
    return {"t": kind}


def _decode_value(desc: Any, chunks: Any) -> Any:
    import onnx.numpy_helper

    t = desc["t"]
    if t == "none":
        return None
    if t == "list":
        return [_decode_value(d, chunks) for d in desc["items"]]
    proto = onnx.TensorProto()
    proto.ParseFromString(next(chunks))
    if t == "proto":
        return proto
    arr = onnx.numpy_helper.to_array(proto)
    return arr[()] if t == "scalar" else arr


def _frames(data: bytes) -> Any:
    """The length-prefixed chunks of a cache file."""
    pos = len(_MAGIC)
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += 8
        if pos + n > len(data):
            raise ValueError("truncated")
        yield data[pos : pos + n]
        pos += n


def _read_cache(path: Path) -> tuple[Any, ...] | None:
    import onnx
    from onnx.backend.test.case.test_case import TestCase

    try:
        data = path.read_bytes()
        if not data.startswith(_MAGIC):
            return None
        chunks = _frames(data)
        cases = []
        for header in chunks:
            meta = json.loads(header)
            model = onnx.ModelProto()
            model.ParseFromString(next(chunks))
            data_sets = [
                (
                    [_decode_value(d, chunks) for d in ins],
                    [_decode_value(d, chunks) for d in outs],
                )
                for ins, outs in meta["data_sets"]
            ]
            fields = {k: meta[k] for k in ("name", "model_name", "url", "model_dir", "kind", "rtol", "atol")}
            cases.append(TestCase(model=model, data_sets=data_sets, **fields))
        return tuple(cases)
    except Exception:  # missing, half-written by a killed run, from another onnx build: generate again
        return None


def _write_cache(path: Path, cases: tuple[Any, ...]) -> None:
    from ..numerics.results import write_atomically

    # written aside and renamed into place, so that a concurrent reader (an xdist worker) never sees half a
    # file; the temporary is created exclusively under a random name, so a link planted at a predictable
    # one (`<cache>.<pid>.tmp`) is never written through
    try:
        out = [_MAGIC]
        for case in cases:
            chunks: list[bytes] = []
            sets = [
                ([_encode_value(v, chunks) for v in ins], [_encode_value(v, chunks) for v in outs])
                for ins, outs in case.data_sets
            ]
            meta = {k: getattr(case, k) for k in ("name", "model_name", "url", "model_dir", "kind", "rtol", "atol")}
            meta["data_sets"] = sets
            for chunk in (json.dumps(meta).encode(), case.model.SerializeToString(), *chunks):
                out += [struct.pack("<Q", len(chunk)), chunk]
        write_atomically(path, b"".join(out))
    except Exception:  # a cache that cannot be written costs time, not correctness
        pass


def _op_name(node: Any) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain and node.domain != "ai.onnx" else node.op_type


def op_under_test(case: Any, cases_by_name: dict[str, Any] | None = None) -> str:
    """The op a case tests: its single node's op, or for `*_expanded*` the op of its unexpanded twin."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return _op_name(nodes[0])
    stem = re.sub(r"_expanded.*$", "", case.name)
    twin = (cases_by_name or {}).get(stem)
    if twin is not None and len(twin.model.graph.node) == 1:
        return _op_name(twin.model.graph.node[0])
    return "+".join(sorted({_op_name(n) for n in nodes}))


def has_kernels(case: Any) -> bool:
    """Whether every node of the case's graph has a registered torch kernel at the case's opset."""
    from ..runtimes.kernels import lookup

    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in case.model.opset_import}
    for node in case.model.graph.node:
        domain = node.domain if node.domain != "ai.onnx" else ""
        if lookup(domain, node.op_type, opsets.get(domain, 1)) is None:
            return False
    return True


def known_reason(name: str) -> str | None:
    """Why KNOWN_UNSUPPORTED lists the case `name`, or None."""
    for pattern, reason in KNOWN_UNSUPPORTED.items():
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def _as_array(value: Any) -> Any:
    """Data sets hold numpy arrays, or TensorProtos for types numpy lacks (bfloat16, float8, ...)."""
    import onnx
    import onnx.numpy_helper

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _untensorable(value: Any, what: str) -> str | None:
    """Why `value` cannot be a torch value (a tensor, a list of tensors, None for an empty optional), or None."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            why = _untensorable(v, f"{what}[{i}]")
            if why:
                return why
        return None
    arr = np.asarray(value)
    if arr.dtype == object or arr.dtype.kind in "SU":
        return f"{what} is a string tensor"
    name = arr.dtype.name
    if name.startswith(_TORCHLESS_DTYPES):
        return f"{what} has dtype {name}, which these kernels do not compute in"
    return None


def _type_refusal(model: Any) -> str | None:
    """Why the model's inputs/outputs are not values the evaluator holds (tensors, sequences of tensors,
    optionals of either), or None."""

    def holdable(t: Any) -> bool:
        kind = t.WhichOneof("value")
        if kind == "tensor_type":
            return True
        if kind == "sequence_type":
            return holdable(t.sequence_type.elem_type)
        if kind == "optional_type":
            return holdable(t.optional_type.elem_type)
        return False

    for vi in list(model.graph.input) + list(model.graph.output):
        if not holdable(vi.type):
            kind = vi.type.WhichOneof("value")
            return f"{vi.name!r} is of {kind.removesuffix('_type') if kind else 'no'} type, not a tensor, sequence or optional"
    return None


def _to_feed(value: Any) -> Any:
    from ..numerics.tensors import to_torch

    if value is None:
        return None
    if isinstance(value, list | tuple):
        return [_to_feed(v) for v in value]
    return to_torch(np.asarray(value))


def _mismatch(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """Why `got` (a torch tensor, a list of them, or None) is not `expected` within the case's tolerance, or None."""
    from ..numerics.tensors import to_numpy

    if expected is None or got is None:
        return None if expected is None and got is None else f"{'an empty optional' if got is None else 'a value'} instead of {'an empty optional' if expected is None else 'a value'}"
    if isinstance(expected, list | tuple) or isinstance(got, list | tuple):
        if not (isinstance(expected, list | tuple) and isinstance(got, list | tuple)):
            return f"{'a sequence' if isinstance(got, list | tuple) else 'a tensor'} instead of {'a sequence' if isinstance(expected, list | tuple) else 'a tensor'}"
        if len(expected) != len(got):
            return f"a sequence of {len(got)} instead of {len(expected)}"
        for i, (e_i, g_i) in enumerate(zip(expected, got, strict=True)):
            why = _mismatch(e_i, g_i, rtol, atol)
            if why:
                return f"element {i}: {why}"
        return None
    g = to_numpy(got)
    e = np.asarray(expected)
    if g.dtype != e.dtype:
        return f"dtype {g.dtype} instead of {e.dtype}"
    if g.shape != e.shape:
        return f"shape {g.shape} instead of {e.shape}"
    if e.dtype.kind in "biu":
        if not np.array_equal(g, e):
            bad = np.flatnonzero(g != e)
            i = int(bad[0])
            return f"{bad.size} of {e.size} values differ (first at {_index(e, i)}: got {g.flat[i]}, expected {e.flat[i]})"
        return None
    g64, e64 = g.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close = np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    bad = np.flatnonzero(~close)
    i = int(bad[0])
    return (
        f"{bad.size} of {e.size} values off by more than rtol={rtol:g}, atol={atol:g} (first at "
        f"{_index(e, i)}: got {float(g64.flat[i])!r}, expected {float(e64.flat[i])!r}){_worst_ulps(g64, e64, e.dtype)}"
    )


def _index(a: np.ndarray, flat: int) -> str:
    return "[" + ", ".join(str(int(j)) for j in np.unravel_index(flat, a.shape)) + "]"


def _worst_ulps(got: np.ndarray, expected: np.ndarray, dtype: np.dtype) -> str:
    """"; worst N ulp of DTYPE": the largest finite difference in units of `dtype`'s last place at the expected value."""
    try:
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    except (ImportError, ValueError, TypeError):
        return ""
    finite = np.isfinite(got) & np.isfinite(expected)
    if not finite.any():
        return ""
    e = expected[finite]
    with np.errstate(divide="ignore"):
        exponent = np.maximum(np.floor(np.log2(np.abs(e))), info.minexp)
    ulp = np.exp2(exponent - info.nmant)
    worst = float(np.max(np.abs(got[finite] - e) / ulp))
    return f"; worst {worst:.3g} ulp of {dtype.name}" if worst else ""


def run_case(case: Any, op: str | None = None) -> CaseResult:
    """Run every data set of `case` through TorchEvaluator and classify the outcome."""
    from ..runtimes.evaluator import MissingKernelError, TorchEvaluator
    from ..runtimes.kernels import UnsupportedVariantError

    model = case.model
    op = op or op_under_test(case)
    ops = tuple(sorted({_op_name(n) for n in model.graph.node}))

    def result(status: str, detail: str = "") -> CaseResult:
        return CaseResult(case.name, op, status, detail, ops)

    refusal = _type_refusal(model)
    if refusal:
        return result("unsupported", refusal)
    init_names = {i.name for i in model.graph.initializer}
    input_names = [vi.name for vi in model.graph.input if vi.name not in init_names]
    output_names = [vi.name for vi in model.graph.output]
    data_sets = [
        ([_as_array(v) for v in inputs], [_as_array(v) for v in outputs])
        for inputs, outputs in case.data_sets
    ]
    for inputs, outputs in data_sets:
        for what, values, names in (("input", inputs, input_names), ("output", outputs, output_names)):
            for name, value in zip(names, values, strict=False):
                why = _untensorable(value, f"{what} {name!r}")
                if why:
                    return result("unsupported", why)

    try:
        ev = TorchEvaluator(model)
    except MissingKernelError as exc:
        missing = str(exc).split(";")[0].removeprefix("no torch kernel for ")
        return result("no kernel", missing)
    except UnsupportedVariantError as exc:
        return result("unsupported", str(exc))
    except Exception as exc:
        return _failed(result, case.name, f"construction: {type(exc).__name__}: {exc}")

    for k, (inputs, outputs) in enumerate(data_sets):
        feeds = {n: _to_feed(v) for n, v in zip(input_names, inputs, strict=False)}
        try:
            got = ev.run(output_names, feeds)
        except Exception as exc:
            cause: BaseException = exc
            while cause.__cause__ is not None:
                cause = cause.__cause__
            if isinstance(cause, UnsupportedVariantError):
                return result("unsupported", str(cause))
            return _failed(result, case.name, f"run: {type(exc).__name__}: {exc}")
        random = RANDOM_OPS.intersection(ops)
        for name, e, g in zip(output_names, outputs, got, strict=True):
            if random:
                why = _mismatch(e, g, case.rtol, case.atol)
                if why and (why.startswith("dtype") or why.startswith("shape")):
                    return result("wrong", f"output {name!r}: {why}")
                continue
            why = _mismatch(e, g, case.rtol, case.atol)
            if why:
                where = f"data set {k}, output {name!r}" if len(data_sets) > 1 else f"output {name!r}"
                return result("wrong", f"{where}: {why}")
        if random:
            return result(
                "unsupported",
                f"random values ({', '.join(sorted(random))}): output shapes and dtypes match; the values, "
                "drawn by torch's generator, cannot equal the suite's numpy draws",
            )
    return result("pass")


def _failed(result: Any, name: str, detail: str) -> CaseResult:
    reason = known_reason(name)
    if reason:
        return result("unsupported", f"known: {reason}")
    return result("error", detail.splitlines()[0][:400])


def run_cases(
    cases: Sequence[Any] | None = None, *, ops: Sequence[str] | None = None, pattern: str | None = None
) -> list[CaseResult]:
    """Run the (selected) node test cases; `ops` keeps cases testing those ops, `pattern` matches names."""
    cases = load_cases() if cases is None else cases
    from .. import progress

    by_name = {c.name: c for c in cases}
    chosen = []
    for case in cases:
        if pattern and not fnmatch.fnmatchcase(case.name, pattern):
            continue
        op = op_under_test(case, by_name)
        if ops and op not in ops:
            continue
        chosen.append((case, op))
    results = []
    # the whole suite takes a minute or two: a bar on a terminal (silent in CI and when piped)
    with progress.bar(len(chosen), "conformance", unit="case", min_total=50) as shown:
        for case, op in chosen:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(run_case(case, op))
            shown.update()
    return results


def _by_op(results: Sequence[CaseResult]) -> tuple[dict[str, Counter[str]], list[str], list[str]]:
    """Status counts per op, the ops some kernel ran a case of, and the others."""
    by_op: dict[str, Counter[str]] = {}
    for r in results:
        by_op.setdefault(r.op, Counter())[r.status] += 1
    covered = sorted(op for op, c in by_op.items() if c["no kernel"] < sum(c.values()))
    return by_op, covered, sorted(op for op in by_op if op not in covered)


def summary(results: Sequence[CaseResult]) -> str:
    """The totals line: '1187 of 1884 cases pass, 6 wrong (6 known), ...; 147 ops with a kernel, 50 without'."""
    _, covered, uncovered = _by_op(results)
    total = Counter(r.status for r in results)
    known = sum(1 for r in results if r.status == "wrong" and known_reason(r.name))
    return (
        f"{total['pass']} of {len(results)} cases pass, {total['wrong']} wrong{f' ({known} known)' if known else ''}, "
        f"{total['unsupported']} unsupported, {total['no kernel']} without a kernel, "
        f"{total['error']} error{'' if total['error'] == 1 else 's'}; "
        f"{len(covered)} op{'' if len(covered) == 1 else 's'} with a kernel, {len(uncovered)} without"
    )


def render(results: Sequence[CaseResult], *, verbose: bool = False) -> str:
    """A table of counts by op (ops with no case run by a kernel last), the totals line, and with `verbose`
    every case that does not pass, with why: unsupported first, the failures last, where a terminal ends."""
    by_op, covered, uncovered = _by_op(results)
    width = max([len(op) for op in by_op] + [10])
    head = f"{'op':<{width}} {'cases':>5} " + " ".join(f"{s:>11}" for s in STATUSES)
    lines = [head, "-" * len(head)]

    def row(name: str, counts: Counter[str]) -> str:
        total = sum(counts.values())
        return f"{name:<{width}} {total:>5} " + " ".join(f"{counts.get(s, 0):>11}" for s in STATUSES)

    lines.extend(row(op, by_op[op]) for op in covered)
    if uncovered:
        lines.append("-" * len(head))
        lines.extend(row(op, by_op[op]) for op in uncovered)
    lines += ["-" * len(head), row("total", Counter(r.status for r in results)), "", summary(results)]
    if verbose:
        unsupported = [r for r in results if r.status == "unsupported"]
        known: dict[str, list[CaseResult]] = {}
        wrong = []
        for r in results:
            if r.status == "wrong":
                reason = known_reason(r.name)
                if reason:
                    known.setdefault(reason, []).append(r)
                else:
                    wrong.append(r)
        errors = [r for r in results if r.status == "error"]
        if unsupported:
            lines.append("\nunsupported (refused by name):")
            lines.extend(f"  {r.name} [{r.op}]: {r.detail}" for r in unsupported)
        if known:
            lines.append("\nwrong, known (conformance.KNOWN_UNSUPPORTED):")
            for reason, chosen in known.items():
                lines.append(f"  because {reason}:")
                lines.extend(f"    {r.name} [{r.op}]: {r.detail}" for r in chosen)
        for title, chosen in (("wrong", wrong), ("error", errors)):
            if chosen:
                lines.append(f"\n{title}:")
                lines.extend(f"  {r.name} [{r.op}]: {r.detail}" for r in chosen)
    return "\n".join(lines)


#: what `python -m pytest_ortdiff conformance --help` says the command does
DESCRIPTION = (
    "Run ONNX's node test suite (onnx.backend.test.case.node, from the installed onnx) through the torch "
    "evaluator and print per op how many cases pass, compute a wrong value, are refused as unsupported, "
    "have no kernel or raise; then onnxruntime's contrib ops (com.microsoft and its default-domain internal "
    "ops: one-node cases across their attributes, our kernels against onnxruntime). Exit status 1 when a case "
    "is wrong (and not in conformance.KNOWN_UNSUPPORTED) or raises, 2 when no case is selected."
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_ortdiff.conformance", description=DESCRIPTION)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", action="append", help="only cases testing this op, e.g. Relu or ai.onnx.ml::LabelEncoder (repeat)")
    parser.add_argument("-k", "--pattern", help="only cases whose name matches this fnmatch pattern, e.g. 'test_clip_*'")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case that does not pass, with why")
    parser.add_argument(
        "--suite",
        choices=("all", "onnx", "contrib"),
        default="all",
        help="onnx: ONNX's node test suite; contrib: onnxruntime's contrib ops against onnxruntime; all (default): both",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when a case is wrong (not listed in KNOWN_UNSUPPORTED) or errors, 2 when
    none is selected or an --op names no op of the suite."""
    t0 = time.perf_counter()
    suite = getattr(args, "suite", "all")
    if suite == "contrib":
        return _run_contrib(args, t0)
    if suite == "all" and args.op and not args.pattern:
        # an op of the contrib cases only: run those alone (the ONNX suite would call it unknown)
        from .contrib_cases import all_cases

        contrib_ops = {c.op for c in all_cases()}
        if set(args.op) <= contrib_ops:
            return _run_contrib(args, t0)
    unknown: list[str] = []
    if args.op:
        cases = load_cases()
        by_name = {c.name: c for c in cases}
        ops = sorted({op_under_test(c, by_name) for c in cases})
        unknown = [op for op in dict.fromkeys(args.op) if op not in ops]
    results = [] if unknown else run_cases(ops=args.op, pattern=args.pattern)
    if not results:
        if not args.op:
            print(f"error: no case matches -k {args.pattern}", file=sys.stderr)
            return 2
        # an unknown op is an error even beside known ones: a typo must not shrink the run unnoticed
        chosen = [f"--op {op}" for op in unknown or args.op] + ([f"-k {args.pattern}"] if args.pattern and not unknown else [])
        hints = []
        for op in unknown:
            close = _suggestions(op, ops)
            hints.append(f"{op} is not an op of the suite" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        print(f"error: no case matches {' '.join(chosen)}" + "".join(f"; {h}" for h in hints), file=sys.stderr)
        return 2
    print(render(results, verbose=args.verbose))
    failed = any(r.status == "error" or (r.status == "wrong" and not known_reason(r.name)) for r in results)
    if suite == "all":
        print()
        return max(int(failed), _run_contrib(args, t0, missing_ok=True))
    print(f"\n({time.perf_counter() - t0:.1f} s, case generation included)")
    return 1 if failed else 0


def _run_contrib(args: argparse.Namespace, t0: float, *, missing_ok: bool = False) -> int:
    """The contrib ops' table (see pytest_ortdiff.conformance.contrib_cases); 1 when a case is wrong or errors, 2 when
    none is selected (unless `missing_ok`: the ONNX suite ran)."""
    from .. import progress
    from . import contrib_cases

    cases = contrib_cases.all_cases()
    if args.op:
        cases = [c for c in cases if c.op in args.op or c.op.split("::")[-1] in args.op]
    if args.pattern:
        cases = [c for c in cases if fnmatch.fnmatchcase(c.name, args.pattern)]
    if not cases:
        if missing_ok:
            print(f"\n({time.perf_counter() - t0:.1f} s, case generation included)")
            return 0
        known = sorted({c.op for c in contrib_cases.all_cases()})
        print(f"error: no contrib case matches; contrib ops: {', '.join(known) or 'none'}", file=sys.stderr)
        return 2
    results = []
    with progress.bar(sum(len(c.providers) for c in cases), "contrib ops", unit="case", min_total=50) as shown:
        for case in cases:
            for provider in case.providers:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    results.append(contrib_cases.run_case(case, provider))
                shown.update()
    print(contrib_cases.render(results, verbose=args.verbose))
    print(f"\n({time.perf_counter() - t0:.1f} s, case generation included)")
    return 1 if any(r.status in ("wrong", "error") for r in results) else 0


def _suggestions(name: str, ops: Sequence[str], n: int = 3) -> list[str]:
    """Ops close to `name`, closest first; one that differs only in case comes before all others."""
    same = [op for op in ops if op.lower() == name.lower()]
    close = difflib.get_close_matches(name, ops, n=n + len(same))
    return (same + [op for op in close if op not in same])[:n]

