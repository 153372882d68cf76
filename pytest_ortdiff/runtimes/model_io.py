"""Models and feeds in: load a model (ModelProto, path or bytes), check it with onnx.checker once per
distinct model, and check feeds against its inputs (names, types, dtypes, shapes) — one message per problem."""

from __future__ import annotations

import functools
import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..numerics.dtypes import DType, dtype_of

if TYPE_CHECKING:
    import onnx

__all__ = [
    "CheckedModel",
    "InputSpec",
    "InvalidModelError",
    "ModelLoadError",
    "check_feed",
    "check_feed_names",
    "check_feeds",
    "check_model",
    "compute_dtype",
    "exposed_for_ort",
    "feed_dims",
    "has_subgraph",
    "in_topological_order",
    "input_specs",
    "iter_graphs",
    "load_external_data",
    "load_model",
    "model_path",
    "model_shell",
    "parse_model",
    "required_ir_version",
    "serialized",
    "session_input_specs",
    "with_ir_version",
]

#: protobuf's limit on one serialized message. A model above it exists only as a file whose weights sit
#: in external data files beside it: onnx.checker and onnxruntime read it from there, never from bytes
PROTOBUF_LIMIT = 2**31 - 1
#: the onnxruntime session config entry naming the folder a model given as bytes reads its external data from
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph`, then every graph nested in its nodes' attributes (If/Loop/Scan bodies), depth first."""
    import onnx

    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from iter_graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from iter_graphs(sub)


def has_subgraph(node: onnx.NodeProto) -> bool:
    """Whether `node` carries a body (a GRAPH or GRAPHS attribute): If, Loop, Scan, SequenceMap, ..."""
    import onnx

    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


class ModelLoadError(ValueError):
    """The bytes or file given are not an ONNX model."""


class InvalidModelError(ValueError):
    """The model fails onnx.checker; the message names the problem (and the file, when there is one)."""

    def __init__(self, subject: str, problem: str) -> None:
        self.subject = subject
        self.problem = problem
        super().__init__(f"{subject} fails onnx.checker: {problem}; fix the graph")


# ------------------------------------------------------------------------------------------------
# models


def load_model(model: Any) -> onnx.ModelProto:
    """A ModelProto from a ModelProto (as is), a path, or serialized bytes: the one loader of every entry
    point (TorchEvaluator, check, the compare command).

    FileNotFoundError for a path that does not exist, ModelLoadError naming the file and the problem for
    bytes that are not an ONNX model and for external data that is missing, not a regular file, or
    outside the model's directory (symlinks included: see `load_external_data`), TypeError for anything
    else."""
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes | bytearray | memoryview):
        return parse_model(bytes(model), "the model's bytes")
    if isinstance(model, str | Path):
        path = Path(model)
        if not path.exists():
            raise FileNotFoundError(f"model file {str(path)!r} does not exist")
        if path.is_dir():
            raise ModelLoadError(f"cannot load {str(path)!r}: it is a directory; pass the .onnx file in it")
        if path.suffix in (".onnxtxt", ".textproto", ".json"):  # onnx's text formats, by onnx's own rule
            try:
                proto = onnx.load_model(str(path), load_external_data=False)
            except Exception as exc:  # each format's parser has its own errors: one message, the file named
                raise ModelLoadError(f"cannot load {str(path)!r}: not an ONNX model ({type(exc).__name__}: {exc})") from None
            _require_graph(proto, repr(str(path)), path.stat().st_size)
        else:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ModelLoadError(f"cannot read model file {str(path)!r}: {exc.strerror or exc}") from None
            proto = parse_model(data, repr(str(path)))
            _remember_files(path, proto)
        load_external_data(proto, path)
        return proto
    raise TypeError(f"expected an onnx.ModelProto, a path or bytes, got {type(model).__name__}")


def model_path(model: Any) -> Path | None:
    """The file a model argument names (a str or Path), else None."""
    return Path(model) if isinstance(model, str | Path) else None


def serialized(model: onnx.ModelProto, path: str | Path | None = None) -> bytes | None:
    """The model's serialized bytes; None when they would be above protobuf's 2 GB limit (a model whose
    weights were loaded from external data files): it can then only be read from its file. `path`: the
    file `model` was loaded from, whose size with its data files' says so without trying (protobuf takes
    20 s to refuse a 2.4 GB model, half of it to count its bytes)."""
    from google.protobuf.message import EncodeError

    if path is not None and sum(f.stat().st_size for f in model_files(path)) > PROTOBUF_LIMIT:
        return None
    try:
        data = model.SerializeToString()
    except (ValueError, EncodeError):  # (pure-Python protobuf raises ValueError above 2 GB, upb EncodeError)
        if (_byte_size(model) or PROTOBUF_LIMIT + 1) <= PROTOBUF_LIMIT:
            raise  # (under the limit: another failure, not hidden)
        return None
    return data if len(data) <= PROTOBUF_LIMIT else None


def _byte_size(model: onnx.ModelProto) -> int | None:
    """`model.ByteSize()`; None where protobuf cannot count it (upb refuses above 2 GB as well)."""
    from google.protobuf.message import EncodeError

    try:
        return int(model.ByteSize())
    except (ValueError, EncodeError):
        return None


def model_files(path: str | Path) -> list[Path]:
    """The model file `path` (resolved) and the external data files it names that exist: what `load_model`
    saw when it read this version of the file, else from the file read again without its weights."""
    import onnx

    path = Path(path).resolve()
    stat = path.stat()
    hit = _FILES.get(str(path))
    if hit is not None and hit[0] == (stat.st_size, stat.st_mtime_ns):
        _FILES.move_to_end(str(path))
        return list(hit[1])
    if path.suffix in (".onnxtxt", ".textproto", ".json"):
        return [path]
    return _remember_files(path, onnx.load_model(str(path), load_external_data=False))  # (the weights stay on disk)


# resolved model file -> ((size, modification time) of that file, the files it and its external data are)
_FILES: OrderedDict[str, tuple[tuple[int, int], tuple[Path, ...]]] = OrderedDict()


def _remember_files(path: Path, proto: onnx.ModelProto) -> list[Path]:
    """The files of the model `proto` as read from `path`, before its external data is loaded into it."""
    path = path.resolve()
    locations = {e.value for t in _external_tensors(proto) for e in t.external_data if e.key == "location"}
    files = (path, *sorted(f for f in (path.parent / location for location in locations) if f.is_file()))
    stat = path.stat()
    _FILES[str(path)] = ((stat.st_size, stat.st_mtime_ns), files)
    while len(_FILES) > _CHECKED_MAX:
        _FILES.popitem(last=False)
    return list(files)


def too_large(subject: str, model: onnx.ModelProto) -> ValueError:
    """The error for a model above 2 GB given as a proto or bytes, where only its file can be read."""
    size = _byte_size(model)
    return ValueError(
        f"{subject} is larger than 2 GB{f' ({size / 2**30:.1f} GiB)' if size is not None else ''}, which protobuf cannot serialize: pass "
        "the path of its .onnx file (saved with its weights in external data files beside it: onnx.save_model(model, "
        "path, save_as_external_data=True)), so that onnx.checker and onnxruntime read it from there"
    )


def exposed_for_ort(model: onnx.ModelProto, data: bytes | None, path: str | Path | None) -> tuple[bytes, dict[str, str]]:
    """`expose_all_values(model)` serialized for onnxruntime, and the session config entries it needs to
    open it. `data`: the model's own serialized bytes (reused, see `exposed_bytes`; no entries needed), or
    None for a model above 2 GB: then its file `path` is read again without the weights, which
    onnxruntime reads from their files in the model's folder."""
    import onnx

    if data is not None or path is None:
        return exposed_bytes(model, data), {}
    skeleton = onnx.load_model(str(path), load_external_data=False)
    return exposed_bytes(skeleton), {EXTERNAL_DATA_FOLDER: str(Path(path).resolve().parent)}


def expose_all_values(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose outputs are its own plus every main-graph node's outputs, so that a runtime
    returns each intermediate value (blame's drift, the reproducibility localiser)."""
    import onnx

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for o in node.output:
            if o and o not in present:
                exposed.graph.output.append(onnx.helper.make_empty_tensor_value_info(o))
                present.add(o)
    return exposed


def exposed_bytes(model: onnx.ModelProto, data: bytes | None = None) -> bytes:
    """`expose_all_values(model)` serialized, from the model's own serialized bytes `data` when given: the
    outputs it adds follow them as a second message holding only those outputs, which protobuf parses
    into the first (a repeated field's items appended). The weights are neither copied nor serialized
    again (on a graph of thousands of nodes, that took as long as a run)."""
    import onnx

    extra = onnx.ModelProto()
    outputs = extra.graph.output
    present = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for o in node.output:
            if o and o not in present:
                outputs.add().name = o
                present.add(o)
    return (model.SerializeToString() if data is None else data) + extra.SerializeToString()


def parse_model(data: bytes, what: str = "the model's bytes") -> onnx.ModelProto:
    """Serialized bytes -> ModelProto; ModelLoadError naming `what` (a file name, quoted) when they are
    not an ONNX model (protobuf's DecodeError never escapes, nor does a message without a graph)."""
    import onnx
    from google.protobuf.message import DecodeError

    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {what}: not an ONNX model ({exc})") from None
    _require_graph(proto, what, len(data))
    return proto


def _require_graph(proto: onnx.ModelProto, what: str, size: int) -> None:
    # almost any bytes parse as some protobuf message: one without a graph is not a model
    if not proto.HasField("graph"):
        raise ModelLoadError(f"cannot load {what}: not an ONNX model ({size:,} bytes holding no graph)")


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    return [t for t in _get_all_tensors(model) if uses_external_data(t)]


def load_external_data(model: onnx.ModelProto, path: str | Path) -> None:
    """Read the external data of `model`, loaded from `path`, into it — only from regular files inside
    the model's directory reached without a symlink (onnx < 1.21 followed them out of it:
    CVE-2026-27489); ModelLoadError naming the tensor, the file and the fix otherwise."""
    import os

    tensors = _external_tensors(model)
    if not tensors:
        return
    path = Path(path)
    base = path.parent
    real_base = Path(os.path.realpath(base))
    where = f"model {str(path)!r}"
    for tensor in tensors:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        subject = f"{where}: tensor {tensor.name!r} keeps its data in {location!r}"
        rel = Path(location)
        if not location or rel.is_absolute() or rel.drive or ".." in rel.parts:
            raise ModelLoadError(f"{subject}, which is not a file inside the model's directory {str(base)!r}; external data must sit next to the model (or below it)")
        full = base / rel
        if not os.path.lexists(full):
            raise ModelLoadError(f"{subject}, which does not exist next to the model (in {str(base)!r}); copy the data file there with the model")
        # every component below the model's directory, the file included: a symlink anywhere may lead out
        step = base
        for part in rel.parts:
            step = step / part
            if step.is_symlink():
                raise ModelLoadError(f"{subject}: {str(step)!r} is a symbolic link; external data is read only from files in the model's directory: copy the file itself there")
        real = Path(os.path.realpath(full))
        if real != real_base and real_base not in real.parents:
            raise ModelLoadError(f"{subject}, which resolves outside the model's directory {str(base)!r}; copy the file into it")
        if not full.is_file():
            raise ModelLoadError(f"{subject}, which is not a regular file")
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(model, str(real_base))  # checked above; onnx >= 1.21 refuses any symlink on the way
    except Exception as exc:  # onnx's own checks and I/O (a short file, a bad offset): one message, the file named
        raise ModelLoadError(f"{where}: cannot read its external data ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class CheckedModel:
    """A model that passed the gate (see `check_model`): the proto, its serialized bytes (what onnxruntime
    takes) and their digest (the key of every cache: sessions, evaluators). A model above 2 GB has no bytes
    (b""): `path` is its file (resolved), which onnxruntime opens. `proto` is the graph as the evaluator runs
    it: where the file's nodes are out of order, a copy sorted topologically (onnxruntime, which takes the
    bytes as they are, sorts them itself), and `notes` says so."""

    proto: onnx.ModelProto
    data: bytes
    digest: str
    path: str | None = None
    #: the model's size in bytes with its weights, where `data` is empty (the files')
    file_bytes: int = 0
    #: what the gate did to accept the model, one short line each ("graph sorted topologically: ...")
    notes: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        """The model's size with its weights (what a session or an evaluator of it holds)."""
        return len(self.data) or self.file_bytes

    @property
    def source(self) -> bytes | str:
        """What onnxruntime opens: the bytes, or the file of a model above 2 GB."""
        return self.data or self.path or b""


# digest -> the gate's verdict; a model is checked once however often it is run
_CHECKED: OrderedDict[str, _Verdict] = OrderedDict()
_CHECKED_MAX = 256


@dataclass(frozen=True)
class _Verdict:
    """The gate on one model: the checker's problem (None: accepted), and whether the model's nodes must
    be sorted topologically to be run."""

    problem: str | None
    unsorted: bool = False


#: the note a report carries for a model whose nodes were out of order
SORTED_NOTE = "graph sorted topologically: its nodes were out of order (onnxruntime sorts them too)"


def check_model(model: onnx.ModelProto, *, subject: str = "the model", path: str | Path | None = None) -> CheckedModel:
    """The gate before any runtime sees `model`, once per distinct model: accept what onnx.checker or
    onnxruntime accepts (onnxruntime's own error on an invalid graph is far less clear), else
    InvalidModelError naming `subject` and one problem. Beyond onnx.checker, the gate accepts what
    onnxruntime's tools write: ops of the default (or ai.onnx.ml) domain onnx has no schema for but
    onnxruntime or the torch evaluator knows (SimplifiedLayerNormalization, LayerNormalization below opset
    17), and nodes out of topological order (the float16 converter leaves some), which the returned
    CheckedModel's proto has sorted, with a note. `path`: the file the model came from, which the checker
    (and onnxruntime) read a model above 2 GB from; without it, such a model is a ValueError saying to pass it."""
    __tracebackhide__ = True  # pytest shows the caller's line, not ours

    data = serialized(model, path)
    if data is None:  # above protobuf's 2 GB: only the file (holding the model and its data) can be checked
        if path is None:
            raise too_large(subject, model)
        return _check_large(model, Path(path), subject)
    digest = hashlib.sha1(data).hexdigest()
    verdict = _checked_once(digest, data, model, subject)  # (the bytes: given the proto, the checker would serialize it again)
    if verdict.unsorted:
        return CheckedModel(in_topological_order(model), data, digest, notes=(SORTED_NOTE,))
    return CheckedModel(model, data, digest)


def _checked_once(digest: str, what: bytes | str, model: onnx.ModelProto, subject: str) -> _Verdict:
    """The gate's verdict on `what` (a model's bytes, or its file's path; `model` its proto) unless the
    model `digest` names was checked already; InvalidModelError naming `subject` for a model it refuses,
    now or before."""
    __tracebackhide__ = True
    import onnx

    verdict = _CHECKED.get(digest)
    if verdict is not None:
        _CHECKED.move_to_end(digest)
    else:
        try:
            onnx.checker.check_model(what)
            verdict = _Verdict(None)
        except onnx.checker.ValidationError as exc:
            verdict = _second_look(model, checker_problem(exc))
        _CHECKED[digest] = verdict
        while len(_CHECKED) > _CHECKED_MAX:
            _CHECKED.popitem(last=False)
    if verdict.problem is not None:
        raise InvalidModelError(subject, verdict.problem)
    return verdict


def _check_large(model: onnx.ModelProto, path: Path, subject: str) -> CheckedModel:
    """A model above 2 GB checked from its file, once per version of its files: the digest is the
    resolved path with each file's size and modification time (new weights written there are another
    model for every cache)."""
    path = path.resolve()
    stats = [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in model_files(path)]
    digest = "path:" + hashlib.sha1(repr(stats).encode()).hexdigest()
    verdict = _checked_once(digest, str(path), model, subject)
    notes = (SORTED_NOTE,) if verdict.unsorted else ()
    proto = in_topological_order(model) if verdict.unsorted else model
    return CheckedModel(proto, b"", digest, path=str(path), file_bytes=sum(size for _, size, _ in stats), notes=notes)


# ------------------------------------------------------------------------------------------------
# accepting what onnxruntime accepts

#: onnx.checker's complaints that onnxruntime does not share: a node before the nodes it reads from (the
#: checker's own words), an op of a checked domain without an onnx schema at the model's opset, a node of a
#: domain the model does not import (onnxruntime imports the domains it knows itself, at their latest
#: version: the optimizer's in-memory model has com.microsoft nodes and no com.microsoft import)
_UNSORTED = "Nodes in a graph must be topologically sorted"
_NO_SCHEMA = "No Op registered for "
_NO_IMPORT = "No opset import for domain "
#: the domain the second look moves ops onnxruntime knows into: one onnx.checker does not check
_KNOWN_ELSEWHERE = "pytest_ortdiff.known"


def _second_look(model: onnx.ModelProto, problem: str) -> _Verdict:
    """onnx.checker refused `model` for `problem`: check again, the weights left out (the checker looks at
    initializers before nodes, so they passed), with the ops onnxruntime or the torch evaluator knows moved
    out of the checked domains and the nodes sorted topologically. Accepted then: the model is one
    onnxruntime takes. Refused: the second look's problem, the one left once those are forgiven."""
    import onnx

    if not problem.startswith((_UNSORTED, _NO_SCHEMA, _NO_IMPORT)):
        return _Verdict(problem)
    skeleton = _skeleton(model)
    moved = _import_known_domains(skeleton) | _move_known_ops(skeleton)
    orders = _orders(skeleton.graph, frozenset())
    _apply_orders(skeleton.graph, orders)
    unsorted = bool(orders)
    if not (moved or unsorted):
        return _Verdict(problem)
    try:
        onnx.checker.check_model(skeleton)
    except onnx.checker.ValidationError as exc:
        return _Verdict(checker_problem(exc))
    return _Verdict(None, unsorted)


def model_shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A new model holding what checks and shape inference read of `model`, its main graph's initializers
    left out (the caller adds what it needs of them): IR version, opsets, local functions, and the graph's
    name, nodes, inputs, outputs, value infos and sparse initializers. Nothing of the weights is copied."""
    import onnx

    graph = model.graph
    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    g = out.graph
    g.name = graph.name
    g.node.extend(graph.node)
    g.input.extend(graph.input)
    g.output.extend(graph.output)
    g.value_info.extend(graph.value_info)
    g.sparse_initializer.extend(graph.sparse_initializer)
    return out


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without its main graph's weights: each initializer a graph input of its type and shape
    instead (nothing of a node's check depends on a weight's values)."""
    from onnx import helper

    out = model_shell(model)
    listed = {i.name for i in model.graph.input}
    out.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer if t.name not in listed)
    return out


def _import_known_domains(model: onnx.ModelProto) -> bool:
    """Import, at their latest version, the domains `model`'s nodes use without importing them that
    onnxruntime (when installed) or the torch evaluator knows, as onnxruntime does; whether any was."""
    imported = {o.domain if o.domain != "ai.onnx" else "" for o in model.opset_import}
    latest = _known_domains()
    missing = sorted({n.domain for g in iter_graphs(model.graph) for n in g.node} - imported - {"ai.onnx"})
    added = False
    for domain in missing:
        if domain in latest:
            model.opset_import.add(domain=domain, version=latest[domain])
            added = True
    return added


def _known_domains() -> dict[str, int]:
    """domain -> its latest opset, of onnxruntime's schemas and the torch evaluator's kernels."""
    from .kernels import REGISTRY

    out: dict[str, int] = {}
    for (domain, _), versions in REGISTRY.items():
        out[domain] = max(out.get(domain, 1), *(since for since, _ in versions))
    for (domain, _), (_, last) in _ort_schemas().items():
        out[domain] = max(out.get(domain, 1), last)
    return out


def _move_known_ops(model: onnx.ModelProto) -> bool:
    """Move the nodes of checked domains whose op onnx has no schema for at the model's opset, but which
    onnxruntime (its schemas, when installed) or the torch evaluator (its kernels) knows, to a domain
    onnx.checker leaves alone; whether any moved."""
    import onnx.defs

    checked = ("", "ai.onnx", "ai.onnx.ml")
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    moved = False
    for graph in iter_graphs(model.graph):
        for node in graph.node:
            domain = "" if node.domain == "ai.onnx" else node.domain
            if domain not in checked or domain not in opsets:
                continue
            version = opsets[domain]
            if onnx.defs.has(node.op_type, version, domain):
                continue
            if _known_elsewhere(domain, node.op_type, version):
                node.domain = _KNOWN_ELSEWHERE
                moved = True
    if moved:
        model.opset_import.add(domain=_KNOWN_ELSEWHERE, version=1)
    return moved


def _known_elsewhere(domain: str, op: str, version: int) -> bool:
    """Whether onnxruntime has a schema for `domain::op` at opset `version` (when it is installed: the ops
    it registers beyond onnx's, e.g. its SimplifiedLayerNormalization), or the torch evaluator a kernel
    (what it can run, onnxruntime installed or not)."""
    from .kernels import lookup

    if lookup(domain, op, version) is not None:
        return True
    versions = _ort_schemas().get((domain, op))
    return versions is not None and versions[0] <= version


@functools.cache
def _ort_schemas() -> dict[tuple[str, str], tuple[int, int]]:
    """(domain, op) -> the first and the last opset onnxruntime has a schema of it for; empty without
    onnxruntime."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema
    except ImportError:
        return {}
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for schema in get_all_operator_schema():
        key = ("" if schema.domain == "ai.onnx" else schema.domain, schema.name)
        first, last = out.get(key, (schema.since_version, schema.since_version))
        out[key] = (min(first, schema.since_version), max(last, schema.since_version))
    return out


def _topological_order(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> list[int] | None:
    """The node positions of `graph` in a topological order, each node as early in the file's order as
    its inputs allow; None when the file's order is one already, or when no order exists (a cycle, an input
    nothing produces: the checker says which). `outer`: the names of enclosing graphs a body may read."""
    import heapq

    known = set(outer) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    known |= {t.values.name for t in graph.sparse_initializer}
    known.add("")
    needs = [_reads(node) for node in graph.node]
    ready_so_far = set(known)
    in_order = True
    for node, wanted in zip(graph.node, needs, strict=True):
        if not wanted <= ready_so_far:
            in_order = False
            break
        ready_so_far.update(node.output)
    if in_order:
        return None
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for o in node.output:
            if o:
                producer.setdefault(o, i)
    waits_on = [{producer[n] for n in wanted if n not in known and n in producer} - {i} for i, wanted in enumerate(needs)]
    if any(n not in known and n not in producer for wanted in needs for n in wanted):
        return None  # an input nothing produces: no order helps
    users: list[list[int]] = [[] for _ in graph.node]
    for i, deps in enumerate(waits_on):
        for d in deps:
            users[d].append(i)
    pending = [len(d) for d in waits_on]
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == len(graph.node) else None


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values `node` reads: its inputs, and the outer-scope names its bodies read."""
    import onnx

    names = set(node.input)
    for a in node.attribute:
        bodies = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
        for body in bodies:
            names |= _outer_reads(body)
    return names


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names a body reads that it does not define itself (its enclosing graphs' values)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        defined.update(node.output)
    reads: set[str] = set()
    for node in graph.node:
        reads |= _reads(node)
    return reads - defined - {""}


def in_topological_order(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself when every graph's nodes are in topological order (or cannot be put in one), else a
    copy with them sorted (each node as early in the file's order as its inputs allow): the evaluator runs
    nodes in the order they come."""
    import onnx

    orders = _orders(model.graph, frozenset())
    if not orders:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _apply_orders(out.graph, orders)
    return out


def _orders(graph: onnx.GraphProto, outer: frozenset[str], where: tuple[int, ...] = ()) -> dict[tuple[int, ...], list[int]]:
    """The new node orders of `graph` and of the bodies inside it, by the body's position (the node's
    index, then the body's index among the node's bodies, recursively); a graph already in order is absent."""
    out: dict[tuple[int, ...], list[int]] = {}
    order = _topological_order(graph, outer)
    if order is not None:
        out[where] = order
    scope = outer | {i.name for i in graph.input} | {t.name for t in graph.initializer} | {n for node in graph.node for n in node.output}
    for i, node in enumerate(graph.node):
        for j, body in enumerate(_bodies(node)):
            out.update(_orders(body, frozenset(scope), (*where, i, j)))
    return out


def _apply_orders(graph: onnx.GraphProto, orders: Mapping[tuple[int, ...], list[int]], where: tuple[int, ...] = ()) -> None:
    """`_orders`' orders applied to `graph` and its bodies, in place."""
    # the bodies first, by their nodes' positions in the file (which the graph's own reordering changes)
    for i, node in enumerate(graph.node):
        for j, body in enumerate(_bodies(node)):
            _apply_orders(body, orders, (*where, i, j))
    order = orders.get(where)
    if order is not None:
        nodes = [graph.node[i] for i in order]
        graph.ClearField("node")
        graph.node.extend(nodes)


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    import onnx

    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def checker_problem(exc: BaseException) -> str:
    """onnx.checker's message on one line: the problem, then its context in parentheses."""
    head, _, context = str(exc).partition("==> Context:")
    problem = " ".join(head.split()).rstrip(".")
    if context.strip():
        problem += f" ({' '.join(context.split())})"
    return problem if len(problem) <= 500 else problem[:497] + "..."


# ------------------------------------------------------------------------------------------------
# feeds


@dataclass(frozen=True)
class InputSpec:
    """What a feed must be: the declared element type and dims (an int: fixed; a str: symbolic; None:
    unnamed; `dims` None: any rank)."""

    name: str
    elem_type: int
    dims: tuple[int | str | None, ...] | None

    @functools.cached_property
    def dtype(self) -> DType | None:
        """The declared dtype, None for a type the checks cannot name (strings, ...)."""
        try:
            return DType(self.elem_type) if self.elem_type else None
        except ValueError:
            return None

    @functools.cached_property
    def torch_dtype(self) -> Any:
        """The declared dtype as torch's (None when torch has none): the fast path of `check_feed`."""
        dt = self.dtype
        try:
            return dt.torch if dt is not None else None
        except (KeyError, ValueError, TypeError):
            return None

    def describe(self) -> str:
        """"float16[a, b, c]"."""
        dt = self.dtype
        name = dt.short if dt is not None else _type_name(self.elem_type)
        if self.dims is None:
            return name
        return f"{name}[{', '.join('?' if d is None else str(d) for d in self.dims)}]"


def _type_name(elem_type: int) -> str:
    """onnx's name of an element type no DType covers ("string"), else "type N"."""
    import onnx

    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "type 0"
    except ValueError:
        return f"type {elem_type}"


def input_specs(model: onnx.ModelProto) -> dict[str, InputSpec]:
    """The model's inputs that take feeds (initializers excluded), in order."""
    init = {i.name for i in model.graph.initializer}
    out: dict[str, InputSpec] = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        dims: tuple[int | str | None, ...] | None = None
        if tt.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        out[vi.name] = InputSpec(vi.name, tt.elem_type, dims)
    return out


def session_input_specs(inputs: Sequence[Any]) -> dict[str, InputSpec]:
    """InputSpecs from an onnxruntime session's `get_inputs()` (name, type "tensor(float16)", shape), for a
    runner that holds the session rather than the ModelProto: the same checks, the same messages."""
    from ..numerics.dtypes import parse_dtype

    out: dict[str, InputSpec] = {}
    for i in inputs:
        inner = i.type[len("tensor(") : -1] if i.type.startswith("tensor(") else i.type
        try:
            elem = parse_dtype(inner).value
        except ValueError:
            elem = 0  # a type the checks cannot name: any dtype passes here, onnxruntime judges
        dims = None if i.shape is None else tuple(d if isinstance(d, int | str) else None for d in i.shape)
        out[i.name] = InputSpec(i.name, elem, dims)
    return out


_TENSOR_TYPES: list[tuple[Any, ...]] = []  # (torch.Tensor, np.ndarray, np.generic, onnx.TensorProto), once imported


def _tensor_types() -> tuple[Any, ...]:
    if not _TENSOR_TYPES:
        import numpy as np
        import onnx
        import torch

        _TENSOR_TYPES.append((torch.Tensor, np.ndarray, np.generic, onnx.TensorProto))
    return _TENSOR_TYPES[0]


def _is_tensor(value: Any) -> bool:
    return isinstance(value, _tensor_types())


def _dtype_and_shape(value: Any) -> tuple[DType | None, tuple[int, ...]]:
    import onnx

    if isinstance(value, onnx.TensorProto):
        try:
            return DType(value.data_type), tuple(int(d) for d in value.dims)
        except ValueError:
            return None, tuple(int(d) for d in value.dims)
    try:
        dt: DType | None = dtype_of(value.dtype)
    except (ValueError, KeyError, TypeError):
        dt = None
    return dt, tuple(int(d) for d in value.shape)


def check_feed_names(specs: Mapping[str, InputSpec], feeds: Mapping[str, Any]) -> None:
    """Every input fed, nothing else: ValueError listing what is missing, what is unknown, and the inputs."""
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    if len(feeds) == len(specs) and all(n in specs for n in feeds):
        return
    missing = [n for n in specs if n not in feeds]
    extra = [n for n in feeds if n not in specs]
    raise ValueError(
        f"feeds do not match the model's inputs: missing {missing}, unknown {extra}; inputs are "
        + ", ".join(f"{n}: {s.describe()}" for n, s in specs.items())
    )


def check_feed(spec: InputSpec, value: Any) -> None:
    """One feed against its input: a tensor or array (TypeError naming what it is), of the declared dtype
    (TypeError suggesting the cast), of the declared rank and fixed dims (ValueError naming the axis)."""
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    name = spec.name
    types = _TENSOR_TYPES[0] if _TENSOR_TYPES else _tensor_types()
    if isinstance(value, types[0]):  # a torch tensor, the common case: no DType lookup
        want_torch = spec.torch_dtype
        if want_torch is None or value.dtype is want_torch:
            _check_shape(spec, tuple(value.shape))
            return
    if not isinstance(value, types):
        if value is None:
            raise TypeError(f"feed {name!r} is None; pass a torch tensor or numpy array")
        kind = type(value).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        want = spec.dtype
        example = ""
        if want is not None:
            try:
                example = f" (e.g. torch.tensor(value, dtype={want.torch}))"
            except (KeyError, ValueError, TypeError):  # a dtype torch has no name for
                example = ""
        raise TypeError(f"feed {name!r} is {article} {kind}; pass a torch tensor or numpy array{example}")
    have, shape = _dtype_and_shape(value)
    want = spec.dtype
    if want is not None and have is not None and have != want:
        import numpy as np

        cast = f".astype(numpy.{want.short})" if isinstance(value, np.ndarray | np.generic) and want != DType.BFLOAT16 else f".to(torch.{want.short})"
        raise TypeError(f"feed {name!r} has dtype {have.short}, the model declares {spec.describe()}; cast it (e.g. {cast})")
    _check_shape(spec, shape)


def _check_shape(spec: InputSpec, shape: tuple[int, ...]) -> None:
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    dims = spec.dims
    if dims is None:
        return
    if len(dims) != len(shape):
        raise ValueError(f"feed {spec.name!r} has shape {shape} (rank {len(shape)}), the model declares {spec.describe()}")
    for axis, (d, s) in enumerate(zip(dims, shape, strict=True)):
        if isinstance(d, int) and d != s:
            raise ValueError(f"feed {spec.name!r} has shape {shape}, the model declares {spec.describe()} (axis {axis} must be {d})")


def check_feeds(model: onnx.ModelProto | Mapping[str, InputSpec], feeds: Any) -> None:
    """Feeds for `model` (or its `input_specs`): a dict {input name: tensor or array}, each a tensor or
    array (checked first: a None or a list would otherwise become an obscure error inside a runtime), the
    names exactly the inputs, each feed of the declared dtype, rank and fixed dims."""
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    if not isinstance(feeds, Mapping):
        raise TypeError(f"feeds must be a dict {{input name: tensor}}, got {type(feeds).__name__}")
    specs = model if isinstance(model, Mapping) else input_specs(model)
    for name, value in feeds.items():
        if not _is_tensor(value):
            check_feed(specs.get(name) or InputSpec(name, 0, None), value)
    check_feed_names(specs, feeds)
    for name, value in feeds.items():
        check_feed(specs[name], value)


def feed_dims(specs: Mapping[str, InputSpec], feeds: Mapping[str, Any]) -> dict[str, int]:
    """The symbolic dims that `feeds` (some of the inputs) fix, by name; ValueError when two feeds give
    one dim different sizes."""
    sizes: dict[str, tuple[int, str, int]] = {}
    for name, value in feeds.items():
        spec = specs.get(name)
        if spec is None or spec.dims is None:
            continue
        _, shape = _dtype_and_shape(value)
        for axis, (d, s) in enumerate(zip(spec.dims, shape, strict=False)):
            if not isinstance(d, str):
                continue
            if d in sizes and sizes[d][0] != s:
                size, other, other_axis = sizes[d]
                raise ValueError(f"feed {name!r} has {d}={s} (axis {axis}), but feed {other!r} has {d}={size} (axis {other_axis}); the model declares both {d}")
            sizes.setdefault(d, (s, name, axis))
    return {d: v[0] for d, v in sizes.items()}


# -- the dtype a graph computes in ---------------------------------------------------------------------

# onnx's TensorProto codes (this module does not import onnx at import time)
_HALF_TYPES = {DType.FLOAT16.value: "float16", DType.BFLOAT16.value: "bfloat16"}
_FLOAT_TYPES = {DType.FLOAT32.value: "float32", DType.FLOAT64.value: "float64", **_HALF_TYPES}


def compute_dtype(model: onnx.ModelProto) -> str | None:
    """The half-precision dtype ("float16", "bfloat16") `model` computes in behind wider floating inputs and
    outputs, None when it computes in its I/O's dtype: what onnxruntime's float16 converter writes with
    `keep_io_types=True` (its default), a Cast to float16 after each input and back to float32 before each
    output. Read off the graph: most of its floating weights' elements (initializers and Constants) are of
    that half type, or, with no floating weights, every floating input is cast to it first."""
    graph = model.graph
    io = {_FLOAT_TYPES.get(v.type.tensor_type.elem_type) for v in [*graph.input, *graph.output]} - {None}
    if not io:
        return None
    weights: dict[str, int] = {}

    def count(t: onnx.TensorProto) -> None:
        name = _FLOAT_TYPES.get(t.data_type)
        if name is not None:
            weights[name] = weights.get(name, 0) + max(1, math.prod(t.dims))

    init = {i.name for i in graph.initializer}
    for t in graph.initializer:
        count(t)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    count(a.t)
    if weights:
        top = max(weights, key=lambda k: weights[k])
        return top if top in _HALF_TYPES.values() and top not in io else None
    # no floating weights: every floating input goes through a Cast to one half type
    floating = [v.name for v in graph.input if v.name not in init and v.type.tensor_type.elem_type in _FLOAT_TYPES]
    targets: set[str | None] = set()
    for name in floating:
        readers = [n for n in graph.node if name in n.input]
        if not readers or any(n.op_type != "Cast" for n in readers):
            return None
        targets |= {_HALF_TYPES.get(next((a.i for a in n.attribute if a.name == "to"), 0)) for n in readers}
    half = targets.pop() if len(targets) == 1 else None
    return half if half is not None and half not in io else None


# ------------------------------------------------------------------------------------------------
# IR version: onnx writes its newest (onnx 1.23: IR 14) whatever the model uses; an onnxruntime that
# reads only older ones (1.31: IR <= 13) refuses it. A model that uses nothing of the newer versions is
# the same model at the version it needs.

# element types -> the IR version that added them (onnx.proto's IR version history)
_TYPE_IR = {
    "BFLOAT16": 4,
    "FLOAT8E4M3FN": 9, "FLOAT8E4M3FNUZ": 9, "FLOAT8E5M2": 9, "FLOAT8E5M2FNUZ": 9,
    "UINT4": 10, "INT4": 10,
    "FLOAT4E2M1": 11,
    "FLOAT8E8M0": 12,
    "UINT2": 13, "INT2": 13,
    "FLOAT6E2M3": 14, "FLOAT6E3M2": 14,
}
# node attributes holding an element type (Cast's `to`, the generators' and EyeLike's `dtype`, ...)
_TYPE_ATTRS = frozenset({"to", "dtype", "output_dtype", "output_datatype", "stash_type"})


def required_ir_version(model: onnx.ModelProto) -> tuple[int, str]:
    """The lowest IR version that holds everything `model` uses, and what sets it ("opset ai.onnx 18",
    "element type FLOAT8E8M0", "model-local functions"): its opsets, the element types of its values,
    initializers, constants and type attributes (subgraphs and functions included), and the newer
    fields (functions: IR 8; multi-device configuration: IR 11)."""
    import onnx
    import onnx.helper

    best, why = 3, "the opset_import field"
    for opset in model.opset_import:
        if opset.domain not in ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.training", "ai.onnx.preview.training"):
            continue  # (a custom domain's versions say nothing of the IR)
        try:
            ir = onnx.helper.find_min_ir_version_for([opset], ignore_unknown=True)
        except ValueError:  # an opset newer than this onnx knows: the newest IR it knows
            ir = onnx.IR_VERSION
        if ir > best:
            best, why = ir, f"opset {opset.domain or 'ai.onnx'} {opset.version}"
    codes = {v: k for k, v in onnx.TensorProto.DataType.items()}
    found: set[int] = set()
    graphs = [g for g in iter_graphs(model.graph)]
    for fn in model.functions:
        for node in fn.node:
            for attr in node.attribute:
                if attr.HasField("g"):
                    graphs.extend(iter_graphs(attr.g))
                graphs.extend(g for sub in attr.graphs for g in iter_graphs(sub))
    for g in graphs:
        for vi in (*g.input, *g.output, *g.value_info):
            _collect_types(vi.type, found)
        found.update(t.data_type for t in g.initializer)
        found.update(s.values.data_type for s in g.sparse_initializer)
        for node in g.node:
            _node_types(node, found)
    for fn in model.functions:
        for node in fn.node:
            _node_types(node, found)
    for code in found:
        name = codes.get(code, "")
        ir = _TYPE_IR.get(name, 0)
        if ir > best:
            best, why = ir, f"element type {name}"
    if len(model.functions) and best < 8:
        best, why = 8, "model-local functions"
    if len(getattr(model, "configuration", ())) and best < 11:
        best, why = 11, "multi-device configuration"
    return best, why


def _collect_types(t: onnx.TypeProto, out: set[int]) -> None:
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        out.add(getattr(t, kind).elem_type)
    elif kind in ("sequence_type", "optional_type"):
        _collect_types(getattr(t, kind).elem_type, out)
    elif kind == "map_type":
        out.add(t.map_type.key_type)
        _collect_types(t.map_type.value_type, out)


def _node_types(node: onnx.NodeProto, out: set[int]) -> None:
    for attr in node.attribute:
        if attr.HasField("t"):
            out.add(attr.t.data_type)
        out.update(t.data_type for t in attr.tensors)
        if attr.name in _TYPE_ATTRS and attr.type == 2:  # AttributeProto.INT
            out.add(attr.i)


def with_ir_version(data: bytes, ir_version: int) -> bytes:
    """The serialized model `data` with its ir_version field set to `ir_version` (nothing else changes)."""
    proto = parse_model(data)
    proto.ir_version = ir_version
    return proto.SerializeToString()
