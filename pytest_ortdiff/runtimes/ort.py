"""OrtRunner: onnxruntime sessions cached per (model, provider, options), torch tensors in and out.

Values cross through IO binding and DLPack, so CUDA outputs stay on the GPU and CPU ones are not copied.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import onnx
import torch

from ..numerics.dtypes import parse_dtype
from ..numerics.tensors import to_numpy, to_torch
from .model_io import (
    EXTERNAL_DATA_FOLDER,
    InputSpec,
    check_feeds,
    load_model,
    serialized,
    session_input_specs,
    too_large,
)
from .providers import (
    KNOWN,
    option_values,
    options_in_force,
    parse_provider,
    tf32_in_play,
    unavailable_reason,
)
from .selection import ResidentGrowth, charge, trim_cache

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "THREADS_ENV",
    "IrVersionError",
    "ModelSource",
    "OrtRunner",
    "ProviderUnavailableError",
    "SessionOptionsLike",
    "UnsupportedByProviderError",
    "load_model",
    "model_bytes",
    "threads_from_env",
]

#: what a runner (and every entry point) takes as a model: a proto, a file, or its serialized bytes
ModelSource: TypeAlias = "onnx.ModelProto | str | Path | bytes | bytearray"
#: session options: a dict of SessionOptions attributes and config entries, or onnxruntime's own object
SessionOptionsLike: TypeAlias = "Mapping[str, Any] | onnxruntime.SessionOptions"


class UnsupportedByProviderError(RuntimeError):
    """onnxruntime has no kernel for an op at this dtype on this provider (NOT_IMPLEMENTED)."""

    def __init__(self, provider: str, op: str, message: str) -> None:
        self.provider = provider
        self.op = op
        super().__init__(f"onnxruntime {KNOWN.get(provider, provider)} has no kernel for {op}: {message}")


class IrVersionError(ValueError):
    """The model needs an IR version this onnxruntime cannot read: the message names what and the fix."""


class ProviderUnavailableError(RuntimeError):
    """The provider cannot run here (not built in, no device, or fell back to another one)."""


def model_bytes(model: ModelSource) -> bytes:
    """The serialized model (for a file: its own bytes, without any external data)."""
    if isinstance(model, bytes | bytearray):
        return bytes(model)
    if isinstance(model, str | Path):
        if not Path(model).exists():
            raise FileNotFoundError(f"model file {str(model)!r} does not exist")
        return Path(model).read_bytes()
    proto = load_model(model)
    data = serialized(proto)
    if data is None:  # (its weights loaded into memory: above protobuf's 2 GB)
        raise too_large("the model", proto)
    return data


def _external_data(data: bytes, what: str = "the model's bytes") -> list[tuple[str, str]]:
    """(tensor name, file) of every tensor whose data the serialized model keeps in another file."""
    if b"location" not in data:  # every external-data entry is keyed "location": most models skip the parse
        return []
    from onnx.external_data_helper import uses_external_data

    from .model_io import parse_model

    proto = parse_model(data, what)  # not ONNX: one error naming it, never protobuf's DecodeError
    out = []
    for tensor in _tensors(proto.graph):
        if uses_external_data(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            out.append((tensor.name, location))
    return out


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of a graph: initializers (sparse ones too) and node attributes, subgraphs included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for g in attr.graphs:
                yield from _tensors(g)


def _check_external_data(folder: Path, subject: str, external: list[tuple[str, str]]) -> None:
    """The files a model's external data lives in exist, inside `folder` (the model's directory)."""
    folder = folder.resolve()
    for name, location in external:
        target = (folder / location).resolve()  # (symlinks followed: a link out of the folder is refused)
        if not target.is_relative_to(folder):
            raise ValueError(
                f"{subject}: the data of tensor {name!r} is in {location!r}, outside the model's "
                "directory; external data must sit next to the model (onnx.save(..., location='name.data'))"
            )
        if not target.is_file():
            raise FileNotFoundError(
                f"{subject}: the data of tensor {name!r} is in {location!r}, which does not exist; "
                f"copy it next to the model (into {str(folder)!r})"
            )


_IR_TOO_NEW = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")
_NOT_IMPL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")

# one process-wide cache: tests build the same tiny models again and again. key -> ((session, its notes),
# bytes of the model and its external data), bounded by bytes (selection.cache_bytes: $ORTDIFF_CACHE_MB, ini
# ortdiff_cache_mb): a session holds its model's weights
_SESSIONS: OrderedDict[tuple[Any, ...], tuple[Any, int]] = OrderedDict()
_LOCK = threading.Lock()


def _options_key(options: Any) -> Any:
    if options is None:
        return None
    if isinstance(options, Mapping):
        return tuple(sorted((k, repr(v)) for k, v in options.items()))
    return ("id", id(options))


def _make_options(options: Any) -> Any:
    import onnxruntime

    if isinstance(options, onnxruntime.SessionOptions):
        return options  # the user's own object, as given
    so = onnxruntime.SessionOptions()
    # onnxruntime's worker threads spin after a run by default: a torch kernel that runs right after
    # competes with them (a seed-000 MatMul took 100 ms instead of 68 ms on 2 cores). Tests alternate
    # runtimes, so the threads sleep unless the caller asks otherwise.
    config = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
    threads = threads_from_env()
    if threads is not None and "intra_op_num_threads" not in (options or {}):
        so.intra_op_num_threads = threads  # (CI runs the examples at 1, 2 and 16 threads: $ORTDIFF_THREADS)
    for key, value in (options or {}).items():
        if "." in key:  # a session config entry, e.g. "session.intra_op.allow_spinning": "1"
            config[key] = str(value)
            continue
        if key == "graph_optimization_level" and isinstance(value, str | int):
            value = _opt_level(value)
        if not hasattr(so, key):
            raise ValueError(
                f"unknown session option {key!r}; e.g. intra_op_num_threads, graph_optimization_level, "
                "use_deterministic_compute, or a config entry such as 'session.intra_op.allow_spinning'"
            )
        setattr(so, key, value)
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    return so


#: the environment variable fixing the thread counts of a run: onnxruntime's intra-op threads in every session
#: whose options do not set them, and torch's (the pytest plugin calls torch.set_num_threads at start-up)
THREADS_ENV = "ORTDIFF_THREADS"


def threads_from_env() -> int | None:
    """$ORTDIFF_THREADS as a positive thread count (None when unset); ValueError naming it otherwise."""
    import os

    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"${THREADS_ENV}={raw!r}: give a positive number of threads such as 2, or unset it")
    return int(raw)


def _opt_level(value: str | int) -> Any:
    import onnxruntime

    levels = {
        "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    if isinstance(value, int):
        return onnxruntime.GraphOptimizationLevel(value)
    try:
        return levels[value.lower()]
    except KeyError:
        raise ValueError(f"graph_optimization_level {value!r}; valid: {', '.join(levels)}") from None


class OrtRunner:
    """Runs a model with onnxruntime on one provider.

    `run(output_names, feeds)`: feeds are torch tensors or numpy arrays (dict name -> value); outputs come
    back as torch tensors, on the GPU for CUDA-like providers. Every argument after the model is
    keyword-only. A model file with external data is opened from its path, so that onnxruntime finds
    the data next to it.
    """

    def __init__(
        self,
        model: ModelSource,
        *,
        provider: str = "CPU",
        session_options: SessionOptionsLike | None = None,
        provider_options: Mapping[str, Any] | None = None,
        cache: bool = True,
    ) -> None:
        self.provider = parse_provider(provider)
        #: sessions are shared through the process-wide cache; False: this runner's own, made for one use
        #: (nothing hashed, nothing kept once the runner is gone)
        self.cache = cache
        self.model_bytes = model_bytes(model)
        # the proto given, if one was (what it declares of its inputs, where onnxruntime cannot say)
        self._proto: onnx.ModelProto | None = model if isinstance(model, onnx.ModelProto) else None
        self.session_options = session_options
        #: this provider's options: those in force (a test's, a Checker's: providers.provider_options_in_force)
        #: with `provider_options`' over them
        self.provider_options = {**options_in_force(self.provider), **option_values(self.provider, provider_options or {})}
        #: the file onnxruntime opens (a model with external data), else None: it takes the bytes
        self.model_path: str | None = None
        self._external_bytes = 0
        #: the cache key of the session this runner created and cached, until its first run is charged
        self._uncharged: tuple[Any, ...] | None = None
        external = _external_data(self.model_bytes)
        if external:
            # the folder onnxruntime reads the data from: the model file's, or for bytes the one the session
            # options name (blame's copy of a model above 2 GB with every value exposed)
            named = session_options.get(EXTERNAL_DATA_FOLDER) if isinstance(session_options, Mapping) else None
            if isinstance(model, str | Path):
                self.model_path = str(Path(model).resolve())
                folder, subject = Path(self.model_path).parent, f"model file {str(model)!r}"
            elif named:
                folder, subject = Path(named).resolve(), f"the model's bytes (external data in {str(named)!r})"
            else:
                files = sorted({location for _, location in external})
                raise ValueError(
                    f"the model keeps the data of {len(external)} tensor(s) in other files ({', '.join(map(repr, files))}): "
                    "pass the model's path, OrtRunner(path), so that onnxruntime finds them, or load them "
                    f"into the model first (onnx.load(path) does), or name their folder in session_options={{{EXTERNAL_DATA_FOLDER!r}: folder}}"
                )
            _check_external_data(folder, subject, external)
            self._external_bytes = sum((folder / location).stat().st_size for location in {loc for _, loc in external})
        self._session: Any = None
        #: what a report should say about how onnxruntime ran the model (an IR version read as an older one)
        self.notes: tuple[str, ...] = ()
        self._input_dtypes: dict[str, torch.dtype | None] | None = None
        self._output_dtypes: dict[str, torch.dtype | None] | None = None
        self._specs: dict[str, InputSpec] | None = None
        self.device = torch.device("cuda", int(self.provider_options.get("device_id", 0))) if self.provider in ("CUDA", "TensorRT") else torch.device("cpu")

    @property
    def session(self) -> Any:
        if self._session is None:
            self._session = self._get_session()
        return self._session

    def _get_session(self) -> Any:
        if not self.cache:
            return self._create()
        digest = hashlib.sha1(self.model_bytes).hexdigest()
        # (the path too where the data is outside the bytes: two folders may hold different weights)
        key = (digest, self.model_path, self.provider, _options_key(self.session_options), tuple(sorted(self.provider_options.items())))
        with _LOCK:
            cached = _SESSIONS.get(key)
            if cached is not None:
                _SESSIONS.move_to_end(key)
                sess, self.notes = cached[0]
                return sess
        grown = ResidentGrowth()
        sess = self._create()
        # charged what it holds: the model's bytes (onnxruntime's Python session keeps them), and what creating it
        # made resident (onnxruntime's own copy of the weights, external data included, and prepacked weights);
        # its first run adds its arena (`run`)
        cost = len(self.model_bytes) + max(self._external_bytes, grown.stop())
        with _LOCK:
            _SESSIONS[key] = ((sess, self.notes), cost)
            trim_cache(_SESSIONS)
        self._uncharged = key
        return sess

    def _create(self) -> Any:
        import onnxruntime

        reason = unavailable_reason(self.provider)
        if reason:
            raise ProviderUnavailableError(reason)
        ep = KNOWN[self.provider]
        providers: list[Any] = [(ep, self.provider_options) if self.provider_options else ep]
        if ep != "CPUExecutionProvider":
            providers.append("CPUExecutionProvider")  # nodes the EP lacks fall back, as in production
        try:
            try:
                sess = onnxruntime.InferenceSession(
                    self.model_path or self.model_bytes, sess_options=_make_options(self.session_options), providers=providers
                )
            except Exception as exc:
                m = _IR_TOO_NEW.search(str(exc))
                if not m:
                    raise
                # a model written by a newer onnx (onnx 1.23 writes IR 14; onnxruntime 1.31 reads <= 13)
                sess = self._create_at_ir(int(m.group(1)), int(m.group(2)), providers)
        except Exception as exc:  # onnxruntime raises its own exception classes per status code
            m = _NOT_IMPL.search(str(exc))
            if m:
                raise UnsupportedByProviderError(self.provider, f"{m.group(1)}({m.group(2)})", str(exc).strip()) from None
            raise
        if ep not in sess.get_providers():
            raise ProviderUnavailableError(f"onnxruntime fell back from {ep} to {sess.get_providers()}: the EP failed to load here")
        if self.provider_options:
            # onnxruntime ignores an option its provider does not know: refused here, naming what it knows
            known = sess.get_provider_options().get(ep, {})
            unknown = sorted(set(self.provider_options) - set(known))
            if unknown:
                raise ValueError(
                    f"onnxruntime's {ep} has no option {', '.join(map(repr, unknown))}; "
                    + (f"its options: {', '.join(sorted(known))}" if known else "it takes no options")
                )
        return sess

    def tf32(self, dtype: str) -> bool:
        """Whether onnxruntime may compute `dtype` in TF32 here (CUDA, float32, use_tf32 not 0)."""
        return tf32_in_play(self.provider, dtype, self.provider_options)

    def _create_at_ir(self, ir: int, max_ir: int, providers: list[Any]) -> Any:
        """The session of the model with its IR version lowered to `max_ir` (what this onnxruntime reads),
        when the model uses nothing of the versions above; else one line naming the fix."""
        import onnxruntime

        from .model_io import parse_model, required_ir_version

        proto = parse_model(self.model_bytes)
        needed, why = required_ir_version(proto)
        if needed > max_ir:
            raise IrVersionError(
                f"the model needs IR version {needed} ({why}) and onnxruntime {onnxruntime.__version__} reads IR <= {max_ir}: "
                f"install an onnxruntime that reads IR {needed}, or build the model without {why}"
            )
        proto.ir_version = max_ir
        options = self.session_options
        if self.model_path is not None:  # its external data stays where it is: the folder named
            if options is not None and not isinstance(options, Mapping):
                raise IrVersionError(
                    f"the model file has IR version {ir} and onnxruntime {onnxruntime.__version__} reads IR <= {max_ir}; "
                    f"save it with ir_version={max_ir} (it uses nothing newer), or pass session options as a dict"
                )
            options = {**(options or {}), EXTERNAL_DATA_FOLDER: str(Path(self.model_path).parent)}
        sess = onnxruntime.InferenceSession(proto.SerializeToString(), sess_options=_make_options(options), providers=providers)
        self.notes = (
            *self.notes,
            f"IR version {ir} read as {max_ir}: onnxruntime {onnxruntime.__version__} reads IR <= {max_ir}, and the model "
            f"uses nothing newer (it needs IR {needed}); onnx.helper.make_model(..., ir_version={max_ir}) writes it so",
        )
        return sess

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    @property
    def input_dtypes(self) -> dict[str, torch.dtype | None]:
        """Input name -> the torch dtype the model declares (None for a type torch lacks)."""
        if self._input_dtypes is None:
            out: dict[str, torch.dtype | None] = {}
            for i in self.session.get_inputs():
                inner = i.type[len("tensor(") : -1] if i.type.startswith("tensor(") else i.type
                try:
                    out[i.name] = parse_dtype(inner).torch
                except (ValueError, KeyError):
                    out[i.name] = None
            self._input_dtypes = out
        return self._input_dtypes

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[torch.Tensor]:
        sess = self.session
        names = list(output_names) if output_names else self.output_names
        if self._specs is None:
            specs = session_input_specs(sess.get_inputs())
            if any(spec.dims == () for spec in specs.values()):
                specs = self._shapeless_inputs(specs)
            self._specs = specs
        check_feeds(self._specs, feeds)  # the one feed check (names, dtypes, ranks, fixed dims) everyone uses
        import onnxruntime

        # a graph may list one output twice (onnx.checker allows it); a binding holds each name once
        unique = list(dict.fromkeys(names))
        first, self._uncharged = self._uncharged, None
        grown = ResidentGrowth() if first is not None else None
        if hasattr(onnxruntime.OrtValue, "from_dlpack"):
            outs = self._run_bound(sess, unique, feeds)
        else:
            outs = self._run_numpy(sess, unique, feeds)
        if first is not None and grown is not None:  # a cached session's first run: its arena stays with it (the outputs go to the caller)
            with _LOCK:
                charge(_SESSIONS, first, grown.stop() - sum(t.numel() * t.element_size() for t in outs if t.device.type == "cpu"))
        if len(unique) == len(names):
            return outs
        by_name = dict(zip(unique, outs, strict=True))
        return [by_name[name] for name in names]

    def _shapeless_inputs(self, specs: dict[str, InputSpec]) -> dict[str, InputSpec]:
        """onnxruntime reports an input declared without a shape as [], as it does a scalar: the model's own
        declaration tells them apart (read only for a model with such an input), and an input of any rank
        is not checked as a scalar."""
        from .model_io import parse_model

        proto = self._proto
        if proto is None:
            proto = onnx.load_model(self.model_path, load_external_data=False) if self.model_path else parse_model(self.model_bytes)
        shapeless = {i.name for i in proto.graph.input if i.type.HasField("tensor_type") and not i.type.tensor_type.HasField("shape")}
        return {name: replace(spec, dims=None) if name in shapeless and spec.dims == () else spec for name, spec in specs.items()}

    @property
    def output_dtypes(self) -> dict[str, torch.dtype | None]:
        """Output name -> the torch dtype the model declares (None for a type torch lacks, or no tensor)."""
        if self._output_dtypes is None:
            self._output_dtypes = {o.name: _declared_torch_dtype(o.type) for o in self.session.get_outputs()}
        return self._output_dtypes

    def _run_bound(self, sess: Any, names: list[str], feeds: Mapping[str, Any]) -> list[torch.Tensor]:
        cuda = self.device.type == "cuda"
        # (torch exports through DLPack only a tensor of the current device: the runner's, for a device_id > 0)
        with torch.cuda.device(self.device) if cuda else contextlib.nullcontext():
            binding = sess.io_binding()
            keep = []  # the inputs, alive until the run is done (the OrtValues share their memory)
            dev = "cuda" if cuda else "cpu"
            index = self.device.index or 0
            for name, value in feeds.items():
                t = to_torch(value).detach()  # (DLPack refuses a tensor that requires grad)
                if cuda and t.device != self.device:
                    t = t.to(self.device)
                t = t.contiguous()
                keep.append(t)
                binding.bind_ortvalue_input(name, _ortvalue(t, dev, index))
            for name in names:
                binding.bind_output(name, dev, index)
            if cuda:
                # onnxruntime's CUDA provider runs on a stream of its own that waits for no other (created
                # non-blocking) and its IO binding does not synchronize inputs: torch's queued writes of the inputs
                # (and its queued reads of earlier outputs, whose memory onnxruntime's arena may hand out again)
                # must be done first. Its run synchronizes its own stream before returning, so the outputs are
                # complete when torch reads them.
                torch.cuda.synchronize(self.device)
            sess.run_with_iobinding(binding)
            declared = self.output_dtypes
            return [self._to_torch(o, declared.get(n)) for n, o in zip(names, binding.get_outputs(), strict=True)]

    def _to_torch(self, value: Any, declared: torch.dtype | None = None) -> torch.Tensor:
        # zero copy where this onnxruntime's OrtValue speaks DLPack; a host round trip otherwise
        if hasattr(value, "__dlpack__") and (declared is None or declared not in _DLPACK_REFUSED_OUT):
            try:
                t = torch.from_dlpack(value)
            except Exception:  # (1.31 exports no float8: "GetDlpackDataType ... Unexpected data type of 17")
                if declared is not None:
                    _DLPACK_REFUSED_OUT.add(declared)
            else:
                if declared is None or t.dtype == declared:
                    return t
                if _same_bits(t, declared):
                    return t.view(declared)  # (1.31 exports bool as uint8: the model's dtype, no copy)
                _DLPACK_REFUSED_OUT.add(declared)  # any other change of dtype: the host copy, from now on
        t = to_torch(value.numpy(), self.device if self.device.type == "cuda" else None)
        # (1.31 hands float8 back as its uint8 bits, bool as uint8)
        return t.view(declared) if declared is not None and t.dtype != declared and _same_bits(t, declared) else t

    def _run_numpy(self, sess: Any, names: list[str], feeds: Mapping[str, Any]) -> list[torch.Tensor]:
        np_feeds = {k: to_numpy(v) for k, v in feeds.items()}
        outs = sess.run(names, np_feeds)
        return [to_torch(o, self.device if self.device.type == "cuda" else None) for o in outs]


# (torch dtype, device type) of feeds this onnxruntime's `OrtValue.from_dlpack` refused (1.31: bool), and
# declared output dtypes its DLPack export changed: those go through a host array, every other tensor of
# the run still through DLPack
_DLPACK_REFUSED: set[tuple[torch.dtype, str]] = set()
_DLPACK_REFUSED_OUT: set[torch.dtype] = set()


def _ortvalue(t: torch.Tensor, dev: str, index: int) -> Any:
    """An OrtValue holding `t` (contiguous, on the runner's device): through DLPack without a copy where this
    onnxruntime takes the dtype, else from a host array (copied back to the GPU for CUDA)."""
    import onnxruntime

    key = (t.dtype, t.device.type)
    if key not in _DLPACK_REFUSED:
        try:
            value = onnxruntime.OrtValue.from_dlpack(t)
        except Exception:  # onnxruntime raises a plain RuntimeError ("Unsupported code 6") for a dtype it lacks
            _DLPACK_REFUSED.add(key)
        else:
            if _ORT_TYPE.get(t.dtype) in (None, value.data_type()):
                return value
            _DLPACK_REFUSED.add(key)  # taken as another element type: not this tensor
    return onnxruntime.OrtValue.ortvalue_from_numpy(to_numpy(t), dev, index)


def _same_bits(t: torch.Tensor, declared: torch.dtype) -> bool:
    """`t` holds `declared`'s values as the bits of an integer type of its size (uint8 for bool or a float8)."""
    if declared == torch.bool:
        return t.dtype == torch.uint8
    return declared.is_floating_point and not t.is_floating_point() and t.dtype != torch.bool and t.element_size() == declared.itemsize


def _declared_torch_dtype(type_str: str) -> torch.dtype | None:
    """The torch dtype of onnxruntime's type string "tensor(float16)" (None for other types)."""
    if not type_str.startswith("tensor("):
        return None
    name = type_str[len("tensor(") : -1]
    try:
        return parse_dtype(name).torch
    except (ValueError, KeyError):
        # onnxruntime's "float8e4m3fn" is torch's float8_e4m3fn (where this torch has it)
        found = getattr(torch, name.replace("float8", "float8_"), None) if name.startswith("float8") else None
        return found if isinstance(found, torch.dtype) else None


# onnxruntime's type strings of the dtypes whose DLPack import is checked (a wrong element type is caught)
_ORT_TYPE: dict[torch.dtype, str] = {
    torch.bool: "tensor(bool)",
    torch.uint8: "tensor(uint8)",
    torch.int8: "tensor(int8)",
    torch.float16: "tensor(float16)",
    torch.bfloat16: "tensor(bfloat16)",
    torch.float32: "tensor(float)",
    torch.float64: "tensor(double)",
    torch.int32: "tensor(int32)",
    torch.int64: "tensor(int64)",
}


