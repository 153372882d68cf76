"""Stored baselines: the outputs a test produced, per test id × provider × dtype × name, written
atomically (safe under pytest-xdist), compared bitwise (or with a tolerance), rewritten only on request.

One baseline is one `.npz` (the outputs' bits, compressed; bfloat16 as its uint16 bits) holding its own
metadata as JSON (`__meta__`: dtypes, shapes, sha256 of every array's bits, environment, the DiffReport
against the reference when it was written), plus a `.json` sidecar: a readable copy of that metadata for
code review. The `.npz` alone is authoritative. Outputs above `max_elements` elements are stored as a
summary (sha256 of the bits, quantiles, a strided sample) that still detects drift.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import io
import json
import math
import os
import platform
import re
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..numerics.diff import DEFAULT_THRESHOLDS, DiffReport, compare
from ..numerics.dtypes import DType, dtype_of
from ..numerics.formatting import g
from ..numerics.results import BaselineRow, module_version, write_atomically
from ..numerics.tolerance import Tolerance

__all__ = [
    "DEFAULT_MAX_ELEMENTS",
    "Baseline",
    "BaselineComparison",
    "BaselineOutcome",
    "CorruptBaselineError",
    "OutputDrift",
    "baseline_path",
    "check_baseline",
    "check_outputs",
    "clean_stale_temp_files",
    "compare_baseline",
    "environment",
    "load_baseline",
    "read_meta",
    "write_baseline",
]

FORMAT = 1
#: outputs with more elements than this are stored as a summary (ini `ortdiff_baseline_max_elements`)
DEFAULT_MAX_ELEMENTS = 1 << 16
#: elements in the strided sample of a summarized output
SAMPLE_SIZE = 4096
QUANTILES = (0.0, 0.01, 0.25, 0.5, 0.75, 0.99, 1.0)
_META = "__meta__"
_UPDATE_FLAG = "--ortdiff-update-baselines"


class CorruptBaselineError(RuntimeError):
    """A baseline file exists but cannot be trusted (truncated, damaged, edited, or of another test)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"baseline file {self.path} is corrupted: {reason}")


# ------------------------------------------------------------------------------------------------
# environment


def environment(provider: str = "CPU") -> dict[str, str]:
    """What produced the numbers: library versions, provider, device and CPU model, platform."""
    import onnx

    from ..runtimes.providers import KNOWN, parse_provider

    short = parse_provider(provider)
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "not installed"
    env = {
        "onnxruntime": ort_version,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "provider": KNOWN[short],
        "device": _device_name(short),
        "cpu": _cpu_model(),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    if short in ("CUDA", "TensorRT") and torch.version.cuda:
        env["cuda"] = str(torch.version.cuda)
    return env


def _device_name(provider: str) -> str:
    if provider in ("CUDA", "TensorRT") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return _cpu_model()


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def environment_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, old, new) for every key whose value differs, in a stable order."""
    keys = list(old) + [k for k in new if k not in old]
    return [(k, str(old.get(k, "(none)")), str(new.get(k, "(none)"))) for k in keys if old.get(k) != new.get(k)]


# ------------------------------------------------------------------------------------------------
# names and paths

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-\[\]=+,]")
#: the name part of a file name has no dots: the last dot before ".npz" then separates test and name
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_\-\[\]=+,]")


def _safe(name: str, limit: int = 120, unsafe: re.Pattern[str] = _UNSAFE) -> str:
    """`name` made safe for a file name, injectively: a name that needs no change is kept as it is (so the
    usual ids stay readable, and keep the names older versions gave them); a changed or too long one gets
    `~` and a hash of the original, and `~` is never kept, so no kept name equals a changed one."""
    out = unsafe.sub("_", name).strip(".") or "_"
    if out != name or len(out) > limit:
        out = out[: limit - 11] + "~" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return out


def _legacy_safe(name: str, limit: int = 120) -> str:
    """The names earlier versions gave, which mapped `a/b` and `a_b` to one file: read as a fallback only."""
    out = _UNSAFE.sub("_", name).strip(".") or "_"
    if len(out) > limit:
        out = out[: limit - 11] + "~" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return out


def baseline_test_name(nodeid: str) -> str:
    """`test_x.py::TestA::test_b[CPU-float32]` -> `TestA.test_b[CPU-float32]`."""
    return nodeid.split("::", 1)[1].replace("::", ".") if "::" in nodeid else nodeid


def baseline_path(directory: str | Path, test: str, name: str) -> Path:
    """`<directory>/<test>.<name>.npz`, both parts made safe for file names, one file per (test, name).

    A baseline stored under the name older versions gave it (which sanitized `a/b` and `a_b` alike) is
    still found: when the file of the current name does not exist and the old one does and its own
    metadata says it belongs to this test and name, that file is used (and rewritten in place by
    --ortdiff-update-baselines); a file of the old name that names another test is never used."""
    path = Path(directory) / f"{_safe(test)}.{_safe(name, 60, _UNSAFE_NAME)}.npz"
    legacy = Path(directory) / f"{_legacy_safe(test)}.{_legacy_safe(name, 60)}.npz"
    if legacy == path or path.exists() or not legacy.is_file():
        return path
    meta = read_meta(legacy)
    if meta is not None and baseline_test_name(str(meta.get("test", ""))) == test and meta.get("name") == name:
        return legacy
    return path


def sidecar_path(path: Path) -> Path:
    return path.with_suffix(".json")


@dataclass(frozen=True)
class BaselineSettings:
    """Where one test's baselines live, and whether this run may write them."""

    directory: Path
    test_name: str
    update: bool = False
    max_elements: int = DEFAULT_MAX_ELEMENTS


def settings_for(node: Any) -> BaselineSettings:
    """Settings of a pytest item: `--ortdiff-baseline-dir` (relative to the invocation directory) or ini
    `ortdiff_baseline_dir` (relative to the ini file) holds `<module path>/`; default
    `<test dir>/<module stem>_ortdiff_baselines/`."""
    config = node.config
    module = Path(node.path)
    cli = config.getoption("ortdiff_baseline_dir", None)
    ini = _getini(config, "ortdiff_baseline_dir")
    root: Path | None = None
    if cli:
        root = Path(config.invocation_params.dir) / cli
    elif ini:
        root = (Path(config.inipath).parent if config.inipath else Path(config.rootpath)) / ini
    if root is not None:
        try:
            rel = module.relative_to(config.rootpath)
        except ValueError:
            rel = Path(module.name)
        directory = root / rel.with_suffix("")
    else:
        directory = module.parent / f"{module.stem}_ortdiff_baselines"
    raw = _getini(config, "ortdiff_baseline_max_elements")
    return BaselineSettings(
        directory=directory,
        test_name=baseline_test_name(node.nodeid),
        update=bool(config.getoption("ortdiff_update_baselines", False)),
        max_elements=int(raw) if raw else DEFAULT_MAX_ELEMENTS,
    )


def _getini(config: Any, name: str) -> str:
    try:
        return str(config.getini(name) or "").strip()
    except ValueError:  # the option is not registered (plugin not loaded)
        return ""


# ------------------------------------------------------------------------------------------------
# tensors <-> stored bits

# integer views used for bit comparisons and for storage of dtypes numpy lacks
_BIT_VIEW = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.bool: torch.uint8,
}


def _named_outputs(outputs: Any, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """A dict name -> contiguous CPU tensor from a tensor/array, a list of them, or a dict."""
    from ..numerics.tensors import to_torch

    if isinstance(outputs, Mapping):
        items = [(str(k), v) for k, v in outputs.items()]
    elif isinstance(outputs, list | tuple):
        keys = list(names) if names is not None else [str(i) for i in range(len(outputs))]
        if len(keys) != len(outputs):
            raise ValueError(f"{len(outputs)} outputs but {len(keys)} names: {keys}")
        items = list(zip(keys, outputs, strict=True))
    else:
        items = [(names[0] if names else "output", outputs)]
    if not items:
        raise ValueError("no outputs to store: pass a tensor, a list or a dict of tensors")
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        t = to_torch(value).detach()
        dtype_of(t.dtype)  # raises for dtypes we cannot name
        out[key] = t.cpu().contiguous() if t.device.type != "cpu" else t.contiguous()
    return out


def _to_numpy_bits(t: torch.Tensor) -> np.ndarray:
    """The array stored for a tensor: bfloat16 as uint16 bits, everything else as itself."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _from_numpy_bits(arr: np.ndarray, dtype: str) -> torch.Tensor:
    dt = dtype_of(dtype)
    if dt == DType.BFLOAT16:
        return torch.from_numpy(np.array(arr, copy=True, order="C").view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(arr, copy=True))


def _sha256(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data).hexdigest()


def bit_mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bit patterns differ (NaN payloads and signed zeros count)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare bits of {a.dtype}{tuple(a.shape)} with {b.dtype}{tuple(b.shape)}")
    if b.device != a.device:
        b = b.to(a.device)
    view = _BIT_VIEW.get(a.dtype)
    if view is not None:
        a, b = a.contiguous().view(view), b.contiguous().view(view)
    return int((a != b).sum().item())


def _strided(flat: torch.Tensor, stride: int, count: int) -> torch.Tensor:
    return flat[::stride][:count].contiguous()


def _summary(t: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
    """Quantiles, mean, NaN/Inf counts and a strided sample of a large output."""
    flat = t.reshape(-1)
    n = flat.numel()
    stride = max(1, math.ceil(n / SAMPLE_SIZE))
    sample = _strided(flat, stride, SAMPLE_SIZE)
    x = flat.to(torch.float64) if dtype_of(t.dtype) in (DType.FLOAT64, DType.INT64, DType.UINT64) else flat.to(torch.float32)
    xs = x.numpy()
    finite = np.isfinite(xs)
    vals = xs[finite]
    info: dict[str, Any] = {
        "sample_stride": stride,
        "sample_count": int(sample.numel()),
        "nan": int(np.isnan(xs).sum()),
        "posinf": int(np.isposinf(xs).sum()),
        "neginf": int(np.isneginf(xs).sum()),
        "mean": float(vals.mean(dtype=np.float64)) if vals.size else None,
        "quantiles": {repr(q): float(v) for q, v in zip(QUANTILES, np.quantile(vals, QUANTILES), strict=True)} if vals.size else {},
    }
    return info, sample


# ------------------------------------------------------------------------------------------------
# temporary files of killed writers

#: a temporary file older than this is a dead writer's: writing even a summarized baseline takes seconds
STALE_TEMP_SECONDS = 600.0
# write_atomically's temporary files: `.<file>.<random>.tmp`, next to `<file>`; a baseline's own name never
# starts with "." (`_safe` strips it), so neither can be mistaken for the other
_TEMP = re.compile(r"^\.(?P<target>.+\.(?:npz|json))\.(?P<rest>[^/]+)\.tmp$")
# a writer that names itself (`...pid<N>...`) is known dead as soon as that process is gone
_TEMP_PID = re.compile(r"(?:^|[._-])pid(?P<pid>[1-9][0-9]{0,9})(?:[._-]|$)")
_CLEANED: set[Path] = set()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # exists (another user's), or cannot tell: keep its file
    return True


def clean_stale_temp_files(directory: str | Path, *, max_age: float = STALE_TEMP_SECONDS, now: float | None = None) -> list[Path]:
    """Remove the temporary files that killed baseline writers left in `directory`: those of a writer
    whose process is gone (when the name carries its pid) or older than `max_age` seconds. A live
    writer's file is younger, and one removed under it only fails that write (its target is untouched).
    Returns the files removed."""
    removed: list[Path] = []
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP.match(entry.name)
        if m is None:
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        pid = _TEMP_PID.search(m["rest"])
        if age > max_age or (pid is not None and not _alive(int(pid["pid"]))):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _clean_once(directory: Path) -> None:
    """clean_stale_temp_files once per directory per process: one listing, however many baselines."""
    key = directory.absolute()
    if key not in _CLEANED:
        _CLEANED.add(key)
        clean_stale_temp_files(directory)


# ------------------------------------------------------------------------------------------------
# writing


def check_outputs(where: str, outputs: Any) -> None:
    """Outputs to store: tensors or arrays, or lists/tuples/dicts of them; TypeError before any file is
    touched otherwise."""
    import onnx

    def one(x: Any) -> bool:
        return isinstance(x, torch.Tensor | np.ndarray | np.generic | onnx.TensorProto)

    values = list(outputs.values()) if isinstance(outputs, Mapping) else list(outputs) if isinstance(outputs, list | tuple) else [outputs]
    bad = next((v for v in values if not one(v)), None)
    if bad is not None or not values:
        got = type(outputs).__name__ if bad is None or bad is outputs else f"a {type(outputs).__name__} holding a {type(bad).__name__}"
        raise TypeError(f"{where}: outputs must be a tensor or array, or a list/tuple/dict of them; got {got}")
    sizes = [int(np.prod(tuple(v.dims))) if isinstance(v, onnx.TensorProto) else int(np.size(v) if not isinstance(v, torch.Tensor) else v.numel()) for v in values]
    if not any(sizes):
        # a baseline of nothing compares nothing on every later run: never a pass
        names = list(outputs) if isinstance(outputs, Mapping) else [f"output {i}" for i in range(len(values))]
        shapes = ", ".join(f"{n} {list(v.dims) if isinstance(v, onnx.TensorProto) else list(v.shape)}" for n, v in zip(names, values, strict=True))
        raise ValueError(f"{where}: every output is empty ({shapes}): a baseline of 0 elements compares nothing; feed a non-empty input")


def write_baseline(
    path: str | Path,
    outputs: Any,
    *,
    test: str = "",
    provider: str = "CPU",
    dtype: str = "",
    name: str = "",
    reference_report: DiffReport | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Store `outputs` (tensor, list or dict of tensors/arrays) at `path`, atomically; returns `path`."""
    path = Path(path)
    named = _named_outputs(outputs)
    arrays: dict[str, np.ndarray] = {}
    entries: dict[str, Any] = {}
    for i, (key, t) in enumerate(named.items()):
        bits = _to_numpy_bits(t)
        entry: dict[str, Any] = {"dtype": dtype_of(t.dtype).short, "shape": list(t.shape), "numel": t.numel(), "sha256": _sha256(bits)}
        if t.numel() <= max_elements:
            entry["stored"] = "full"
            entry["key"] = f"full_{i}"
            arrays[entry["key"]] = bits
        else:
            info, sample = _summary(t)
            entry["stored"] = "summary"
            entry["key"] = f"sample_{i}"
            entry.update(info)
            arrays[entry["key"]] = _to_numpy_bits(sample)
            entry["sample_sha256"] = _sha256(arrays[entry["key"]])
        entries[key] = entry
    # (pytest_ortdiff's own, read as the other packages' are: this layer imports nothing above it)
    version = module_version("pytest_ortdiff", ("pytest-ortdiff",)) or "(version unknown)"
    meta = {
        "format": FORMAT,
        "test": test,
        "provider": provider,
        "dtype": dtype,
        "name": name,
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "written_by": f"pytest-ortdiff {version}",
        "max_elements": max_elements,
        "environment": dict(env if env is not None else environment(provider)),
        "outputs": entries,
        "reference_report": reference_report.to_dict() if reference_report is not None else None,
    }
    text = json.dumps(meta, indent=1, sort_keys=False)
    write_atomically(path, lambda f: np.savez_compressed(f, **{_META: np.array(text)}, **arrays))  # type: ignore[arg-type]
    # the readable copy, for review; nothing reads it back, so a stale one can mislead nobody's test
    write_atomically(sidecar_path(path), text + "\n")
    return path


# ------------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True)
class StoredOutput:
    """One output as stored: its bits (full) or its summary and sample."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    sha256: str
    stored: str  # "full" or "summary"
    tensor: torch.Tensor | None = None  # full
    sample: torch.Tensor | None = None  # summary
    summary: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Baseline:
    path: Path
    meta: Mapping[str, Any]
    outputs: Mapping[str, StoredOutput]

    @property
    def environment(self) -> Mapping[str, str]:
        return self.meta.get("environment", {})

    @property
    def reference_report(self) -> DiffReport | None:
        data = self.meta.get("reference_report")
        return DiffReport.from_dict(data) if data else None


#: the metadata's JSON is small (a few kB); a larger member is not one this code wrote
_META_MAX_BYTES = 64 << 20
#: an .npy header is at most a few hundred bytes (numpy itself caps it at 10,000 by default)
_NPY_HEADER_MAX = 10_000


def _read_npy(z: zipfile.ZipFile, member: str, path: Path, max_bytes: int) -> np.ndarray:
    """One `.npy` member, decompressing at most its header and `max_bytes` of data (a member larger than
    that, or whose header claims more, is refused before it is inflated): a crafted 1 MB file must not
    cost a GiB."""
    try:
        info = z.getinfo(member)
    except KeyError:
        raise CorruptBaselineError(path, f"member {member!r} named by its metadata is missing") from None
    limit = max_bytes + _NPY_HEADER_MAX
    if info.file_size > limit:
        raise CorruptBaselineError(path, f"member {member!r} holds {info.file_size:,} bytes, more than the {max_bytes:,} bytes of data its metadata gives it (file edited or crafted)")
    with z.open(info) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise CorruptBaselineError(path, f"member {member!r} inflates past the {max_bytes:,} bytes of data its metadata gives it (file edited or crafted)")
    buf = io.BytesIO(data)
    version = np.lib.format.read_magic(buf)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = header(buf, max_header_size=_NPY_HEADER_MAX)
    count = math.prod(shape)
    if dtype.hasobject or fortran or count * dtype.itemsize > max_bytes or count * dtype.itemsize != len(data) - buf.tell():
        raise CorruptBaselineError(path, f"member {member!r}: header {dtype.str}{shape} does not match its data or its metadata")
    return np.frombuffer(data, dtype=dtype, count=count, offset=buf.tell()).reshape(shape)


def _open_zip(path: Path) -> bytes:
    raw = path.read_bytes()  # an OSError (permissions, a directory) is not damage: raised as it is, the file kept
    if not raw.startswith(b"PK\x03\x04"):
        # checked first: np.load would try to unpickle anything else
        raise CorruptBaselineError(path, f"truncated or not a zip file ({len(raw):,} bytes, no zip header): emptied or overwritten with something else")
    return raw


def _meta_of(z: zipfile.ZipFile, path: Path) -> dict[str, Any]:
    if f"{_META}.npy" not in z.namelist():
        raise CorruptBaselineError(path, f"no {_META} entry: not written by pytest-ortdiff")
    text = _read_npy(z, f"{_META}.npy", path, _META_MAX_BYTES)
    if text.dtype.kind != "U" or text.shape != ():
        raise CorruptBaselineError(path, f"{_META} entry is not a string: not written by pytest-ortdiff")
    meta = json.loads(str(text[()]))
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        version = meta.get("format") if isinstance(meta, dict) else None
        raise CorruptBaselineError(path, f"format {version!r}; this pytest-ortdiff reads format {FORMAT} (written by a newer or older version?)")
    return meta


def _damage(path: Path, exc: BaseException) -> CorruptBaselineError:
    what = "truncated or not a zip file" if isinstance(exc, zipfile.BadZipFile | EOFError) else "unreadable"
    return CorruptBaselineError(path, f"{what} ({type(exc).__name__}: {exc})")


def read_meta(path: str | Path) -> dict[str, Any] | None:
    """A baseline's metadata alone (no array inflated); None when the file is absent or cannot be trusted."""
    path = Path(path)
    try:
        with zipfile.ZipFile(io.BytesIO(_open_zip(path))) as z:
            return _meta_of(z, path)
    except Exception:  # any failure on untrusted bytes means "not a usable baseline"
        return None


def load_baseline(path: str | Path) -> Baseline:
    """Read and verify a baseline; FileNotFoundError if absent, CorruptBaselineError if it cannot be
    trusted (whatever the damage: the zip, the compression, the headers, the metadata, the bits), an
    OSError as it is when the file cannot be read at all (it may be good: it is never overwritten).

    Only the members its metadata names are inflated, each capped at the size its metadata gives it
    (shape x itemsize): extra or oversized members cost nothing."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(str(path))
    raw = _open_zip(path)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            meta = _meta_of(z, path)
            return _verify(path, meta, z)
    except CorruptBaselineError:
        raise
    except (KeyError, TypeError, AttributeError) as exc:
        raise CorruptBaselineError(path, f"metadata incomplete ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # untrusted bytes: zlib.error, TokenError (an edited .npy header),
        # NotImplementedError (a compression method zipfile lacks), ValueError, MemoryError, ... all mean damage
        raise _damage(path, exc) from None


class _MetaChecker:
    """Every metadata field this module reads, checked for the type and range this module writes: an edited
    field (a stride of 0 or "x", an environment that is a list, a quantile that is no number) makes the file a
    corrupted baseline naming the field, which --ortdiff-update-baselines replaces, never a raw ValueError
    or AttributeError later in the comparison."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def bad(self, where: str, value: Any, expected: str) -> CorruptBaselineError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return CorruptBaselineError(self.path, f"metadata {where} is {shown}; expected {expected} (the file was edited or damaged)")

    def text(self, where: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.bad(where, value, "a string")
        return value

    def whole(self, where: str, value: Any, low: int = 0, high: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
            raise self.bad(where, value, f"a whole number from {low:,}" + (f" to {high:,}" if high is not None else ""))
        return value

    def number(self, where: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.bad(where, value, "a number")

    def digest(self, where: str, value: Any) -> None:
        if not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value)):
            raise self.bad(where, value, "a sha256 (64 hex digits)")

    def check(self, meta: Mapping[str, Any]) -> None:
        from ..runtimes.providers import parse_provider

        for key in ("test", "name", "written_at", "written_by"):
            if key in meta:
                self.text(key, meta[key])
        provider = self.text("provider", meta.get("provider", ""))
        if provider:
            try:
                parse_provider(provider)
            except ValueError:
                raise self.bad("provider", provider, "a provider name such as 'CPU'") from None
        dtype = self.text("dtype", meta.get("dtype", ""))
        if dtype:
            self.dtype("dtype", dtype)
        if "max_elements" in meta:
            self.whole("max_elements", meta["max_elements"])
        env = meta.get("environment", {})
        if not isinstance(env, Mapping):
            raise self.bad("environment", env, "an object of names and versions")
        for k, v in env.items():
            self.text(f"environment[{k!r}]", v)
        report = meta.get("reference_report")
        if report is not None:
            try:
                if not isinstance(report, Mapping):
                    raise TypeError
                DiffReport.from_dict(report).render()
            except Exception:  # whatever an edited report breaks in the reader
                raise self.bad("reference_report", report, "a diff report or null") from None
        outputs = meta.get("outputs")
        if not isinstance(outputs, Mapping) or not outputs:
            raise self.bad("outputs", outputs, "an object with an entry per output")
        for name, entry in outputs.items():
            self.output(f"outputs[{name!r}]", entry)

    def dtype(self, where: str, value: Any) -> None:
        try:
            dt = dtype_of(self.text(where, value))
            dt.numpy.itemsize  # noqa: B018  (a dtype a baseline can hold: numpy and torch both have it)
            dt.torch  # noqa: B018
        except (KeyError, ValueError, TypeError, AttributeError):
            raise self.bad(where, value, "a dtype name such as 'float32'") from None

    def output(self, where: str, entry: Any) -> None:
        if not isinstance(entry, Mapping):
            raise self.bad(where, entry, "an object describing the output")
        self.dtype(f"{where}.dtype", entry.get("dtype"))
        shape = entry.get("shape")
        if not isinstance(shape, list):
            raise self.bad(f"{where}.shape", shape, "a list of dims")
        for i, d in enumerate(shape):
            self.whole(f"{where}.shape[{i}]", d)
        numel = math.prod(shape)
        if "numel" in entry and entry["numel"] != numel:
            raise self.bad(f"{where}.numel", entry["numel"], f"{numel:,}, the product of its shape {shape}")
        self.digest(f"{where}.sha256", entry.get("sha256"))
        if not isinstance(entry.get("key"), str) or not entry["key"]:
            raise self.bad(f"{where}.key", entry.get("key"), "the name of its member")
        stored = entry.get("stored")
        if stored == "summary":
            stride = self.whole(f"{where}.sample_stride", entry.get("sample_stride"), 1, max(1, numel))
            self.whole(f"{where}.sample_count", entry.get("sample_count"), 0, -(-numel // stride))
            self.digest(f"{where}.sample_sha256", entry.get("sample_sha256"))
            for k in ("nan", "posinf", "neginf"):
                if k in entry:
                    self.whole(f"{where}.{k}", entry[k], 0, numel)
            if entry.get("mean") is not None:
                self.number(f"{where}.mean", entry["mean"])
            quantiles = entry.get("quantiles", {})
            if not isinstance(quantiles, Mapping):
                raise self.bad(f"{where}.quantiles", quantiles, "an object of quantile -> value")
            for q, v in quantiles.items():
                self.number(f"{where}.quantiles[{q!r}]", v)
        elif stored != "full":
            raise self.bad(f"{where}.stored", stored, "'full' or 'summary'")


def _verify(path: Path, meta: dict[str, Any], z: zipfile.ZipFile) -> Baseline:
    _MetaChecker(path).check(meta)
    outputs: dict[str, StoredOutput] = {}
    try:
        for key, entry in meta["outputs"].items():
            shape = tuple(int(s) for s in entry["shape"])
            itemsize = dtype_of(entry["dtype"]).numpy.itemsize
            count = math.prod(shape) if entry["stored"] == "full" else int(entry["sample_count"])
            if min((*shape, count), default=0) < 0:
                raise CorruptBaselineError(path, f"output {key!r}: negative size in its metadata")
            arr = _read_npy(z, f"{entry['key']}.npy", path, count * itemsize)
            if arr.dtype != dtype_of(entry["dtype"]).numpy:
                raise CorruptBaselineError(path, f"output {key!r}: stored as {arr.dtype}, its metadata says {entry['dtype']} (file edited or damaged)")
            if entry["stored"] == "full":
                if tuple(arr.shape) != shape or _sha256(arr) != entry["sha256"]:
                    raise CorruptBaselineError(path, f"output {key!r}: stored bits do not match their recorded sha256/shape (file edited or damaged)")
                outputs[key] = StoredOutput(key, entry["dtype"], shape, entry["sha256"], "full", tensor=_from_numpy_bits(arr, entry["dtype"]))
            elif entry["stored"] == "summary":
                if _sha256(arr) != entry.get("sample_sha256"):
                    raise CorruptBaselineError(path, f"output {key!r}: stored sample does not match its recorded sha256 (file edited or damaged)")
                summary = {k: v for k, v in entry.items() if k not in ("dtype", "shape", "sha256", "stored", "key")}
                outputs[key] = StoredOutput(key, entry["dtype"], shape, entry["sha256"], "summary", sample=_from_numpy_bits(arr, entry["dtype"]), summary=summary)
            else:
                raise CorruptBaselineError(path, f"output {key!r}: unknown storage {entry['stored']!r}")
    except (KeyError, TypeError, AttributeError) as exc:
        raise CorruptBaselineError(path, f"metadata incomplete ({type(exc).__name__}: {exc})") from None
    return Baseline(path, meta, outputs)


# ------------------------------------------------------------------------------------------------
# comparing


@dataclass(frozen=True)
class OutputDrift:
    """How one output moved since the baseline."""

    name: str
    status: str  # "identical", "drift", "dtype", "shape", "removed", "added"
    dtype: str = ""
    shape: tuple[int, ...] = ()
    report: DiffReport | None = None  # stored (expected) vs now (got); on the sample for summaries
    bit_mismatches: int = 0
    compared: int = 0  # elements compared bit by bit (the sample for summaries)
    stored: str = "full"
    note: str = ""
    quantiles: tuple[tuple[str, float, float], ...] = ()  # (q, baseline, now) for summaries
    violations: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        return self.status == "identical"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "stored": self.stored,
            "bit_mismatches": self.bit_mismatches,
            "compared": self.compared,
            "note": self.note,
            "quantiles": [list(q) for q in self.quantiles],
            "violations": list(self.violations),
            "report": self.report.to_dict() if self.report is not None else None,
        }


@dataclass(frozen=True)
class BaselineComparison:
    """The outputs of this run against a stored baseline: per output drift, environment changes, verdict."""

    path: Path
    name: str
    outputs: tuple[OutputDrift, ...]
    env_changes: tuple[tuple[str, str, str], ...] = ()
    tolerance: Tolerance | None = None  # None: bitwise
    written_at: str = ""
    report: DiffReport | None = None  # all comparable outputs, for the summary table

    @property
    def identical(self) -> bool:
        return all(o.identical for o in self.outputs)

    @property
    def passed(self) -> bool:
        if self.tolerance is None:
            return self.identical
        return all(o.status in ("identical", "drift") and not o.violations for o in self.outputs)

    @property
    def rule(self) -> str:
        return "bitwise" if self.tolerance is None else self.tolerance.describe()

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "name": self.name,
            "passed": self.passed,
            "identical": self.identical,
            "rule": self.rule,
            "written_at": self.written_at,
            "environment_changes": [{"key": k, "baseline": a, "now": b} for k, a, b in self.env_changes],
            "outputs": [o.to_dict() for o in self.outputs],
        }

    def render(self) -> str:
        verdict = "identical" if self.identical else ("within tolerance" if self.passed else "DRIFTED")
        lines = [f"baseline {self.name!r}: {verdict} ({self.rule}; written {self.written_at or '?'})", f"  file: {self.path}"]
        if self.env_changes:
            lines.append("  environment changed since the baseline was written:")
            lines += [f"    {k}: {a} -> {b}" for k, a, b in self.env_changes]
        else:
            lines.append("  environment unchanged since the baseline was written")
        for o in self.outputs:
            lines += _render_drift(o)
        return "\n".join(lines)


def _render_drift(o: OutputDrift) -> list[str]:
    shape = "x".join(map(str, o.shape)) or "scalar"
    if o.status == "identical":
        return [f"  - {o.name}: identical ({o.dtype}[{shape}], {o.stored})"]
    if o.status in ("dtype", "shape", "removed", "added"):
        return [f"  - {o.name}: {o.note}"]
    where = f"of the {o.compared:,} sampled elements" if o.stored == "summary" else f"of {o.compared:,} elements"
    lines = [f"  - {o.name}: {o.bit_mismatches:,} {where} differ in their bits ({o.dtype}[{shape}])" + (f"; {o.note}" if o.note else "")]
    lines += [f"    {v}" for v in o.violations]
    if o.quantiles:
        lines.append("    quantile   baseline          now               delta")
        lines += [f"    {q:<9}  {a:<16.9g}  {b:<16.9g}  {g(b - a)}" for q, a, b in o.quantiles]
    if o.report is not None:
        lines += ["    " + line for line in o.report.render().splitlines()]
    return lines


def _tolerance_for(tolerance: Tolerance | Mapping[str, Any] | None, dtype: str) -> Tolerance | None:
    if tolerance is None:
        return None
    if isinstance(tolerance, Mapping):
        tolerance = Tolerance(**tolerance)
    return tolerance.for_dtype(dtype)


def _thresholds(tol: Tolerance | None) -> list[float]:
    return sorted(set(DEFAULT_THRESHOLDS) | set(tol.thresholds if tol else ()))


def compare_baseline(
    baseline: Baseline,
    outputs: Any,
    *,
    tolerance: Tolerance | Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> BaselineComparison:
    """This run's `outputs` against `baseline`: bitwise unless `tolerance` is given (then its rules,
    summarized outputs judged on their sample)."""
    now = _named_outputs(outputs)
    drifts: list[OutputDrift] = []
    pairs_e: dict[str, torch.Tensor] = {}
    pairs_g: dict[str, torch.Tensor] = {}
    for key, stored in baseline.outputs.items():
        if key not in now:
            drifts.append(OutputDrift(key, "removed", stored.dtype, stored.shape, note=f"in the baseline but not produced now (outputs now: {sorted(now)})"))
            continue
        t = now[key]
        dt = dtype_of(t.dtype).short
        if dt != stored.dtype:
            drifts.append(OutputDrift(key, "dtype", dt, tuple(t.shape), note=f"dtype changed: {stored.dtype} -> {dt}"))
            continue
        if tuple(t.shape) != stored.shape:
            drifts.append(OutputDrift(key, "shape", dt, tuple(t.shape), note=f"shape changed: {stored.shape} -> {tuple(t.shape)}"))
            continue
        tol = _tolerance_for(tolerance, dt)
        thr = _thresholds(tol)
        pair = tol.allclose if tol is not None else None
        if stored.stored == "full":
            assert stored.tensor is not None
            expected, got = stored.tensor, t
            bits = bit_mismatches(expected, got)
            quantiles: tuple[tuple[str, float, float], ...] = ()
            note = ""
            identical = bits == 0
        else:
            assert stored.sample is not None
            info = stored.summary
            expected = stored.sample
            got = _strided(t.reshape(-1), int(info["sample_stride"]), int(info["sample_count"]))
            identical = _sha256(_to_numpy_bits(t)) == stored.sha256
            bits = bit_mismatches(expected, got)
            quantiles = ()
            note = ""
            if not identical:
                now_info, _ = _summary(t)
                quantiles = tuple((q, float(info["quantiles"][q]), float(now_info["quantiles"][q])) for q in info.get("quantiles", {}) if q in now_info["quantiles"])
                note = f"checksum of all {t.numel():,} elements differs (stored as a summary: every {int(info['sample_stride']):,}th element kept)"
                if bits == 0:
                    note += "; the sampled elements are identical: the drift is elsewhere, see the quantiles"
                for k in ("nan", "posinf", "neginf"):
                    if info.get(k) != now_info.get(k):
                        note += f"; {k} count {info.get(k)} -> {now_info.get(k)}"
        report = compare(expected, got, thresholds=thr, tolerance=pair, name=key if stored.stored == "full" else f"{key} (sample)")
        if stored.stored == "summary" and bits and report.argmax is not None:
            flat = int(report.argmax[0]) * int(stored.summary["sample_stride"])
            where = tuple(int(i) for i in np.unravel_index(flat, stored.shape)) if stored.shape else ()
            note += f"; the largest sampled difference (sample index {report.argmax[0]}) is element {where} of the output"
        pairs_e[key], pairs_g[key] = expected, got
        violations = tuple(str(v) for v in tol.check(report)) if tol is not None and not identical else ()
        drifts.append(
            OutputDrift(
                key,
                "identical" if identical else "drift",
                dt,
                tuple(t.shape),
                report=report,
                bit_mismatches=bits,
                compared=expected.numel(),
                stored=stored.stored,
                note=note,
                quantiles=quantiles,
                violations=violations,
            )
        )
    drifts += [OutputDrift(key, "added", dtype_of(t.dtype).short, tuple(t.shape), note="produced now but not in the baseline") for key, t in now.items() if key not in baseline.outputs]
    aggregate = compare(pairs_e, pairs_g, thresholds=_thresholds(None), name=baseline.meta.get("name", "")) if pairs_e else None
    current_env = env if env is not None else environment(baseline.meta.get("provider") or "CPU")
    resolved = None if tolerance is None else (Tolerance(**tolerance) if isinstance(tolerance, Mapping) else tolerance)
    return BaselineComparison(
        path=baseline.path,
        name=str(baseline.meta.get("name", "")),
        outputs=tuple(drifts),
        env_changes=tuple(environment_changes(baseline.environment, current_env)),
        tolerance=resolved,
        written_at=str(baseline.meta.get("written_at", "")),
        report=aggregate,
    )


# ------------------------------------------------------------------------------------------------
# the whole flow: missing / corrupted / drift, with and without --ortdiff-update-baselines


class _Unwritable(Exception):
    """write_baseline's OSError, carried out of check_baseline's decision to one outcome."""


@dataclass(frozen=True)
class BaselineOutcome:
    """What `check_baseline` did: compared, created, updated or refused, and whether the test passes."""

    action: str  # "unchanged", "created", "updated", "replaced corrupted", "missing", "corrupted", "drift", "within tolerance", "unwritable"
    passed: bool
    path: Path
    message: str
    comparison: BaselineComparison | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "passed": self.passed,
            "path": str(self.path),
            "message": self.message,
            "comparison": self.comparison.to_dict() if self.comparison is not None else None,
        }

    def row(self, name: str) -> BaselineRow:
        """What happened to the file, for the run's summary of baselines and the reports: with the drift's
        largest absolute change and the environment changes when outputs were compared."""
        c = self.comparison
        drift = c.report.max_abs if c is not None and c.report is not None else None
        return BaselineRow(
            name=name,
            action=self.action,
            path=str(self.path),
            passed=self.passed,
            max_abs=float(drift) if drift is not None else None,
            env_changes=c.env_changes if c is not None else (),
            message=self.message,
        )


def check_baseline(
    path: str | Path,
    outputs: Any,
    *,
    test: str,
    provider: str = "CPU",
    dtype: str = "",
    name: str = "",
    update: bool = False,
    tolerance: Tolerance | Mapping[str, Any] | None = None,
    reference_report: DiffReport | None = None,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> BaselineOutcome:
    """Compare `outputs` with the baseline at `path`.

    Without `update`: a missing or corrupted baseline fails (nothing is written), drift fails. With
    `update`: a missing, corrupted or drifted baseline is (re)written and the check passes; a baseline
    whose bits equal this run's is left untouched, so reruns do not churn files.
    """
    path = Path(path)
    _clean_once(path.parent)
    how = f"pytest '{test}' {_UPDATE_FLAG}" if test else f"pytest {_UPDATE_FLAG}"
    label = f"baseline {name!r} of {test or '?'} ({provider} {dtype})".replace(" )", ")")

    def write() -> None:
        try:
            write_baseline(path, outputs, test=test, provider=provider, dtype=dtype, name=name, reference_report=reference_report, max_elements=max_elements)
        except OSError as exc:  # (a read-only or immutable directory, a full disk: what was there is untouched)
            raise _Unwritable(exc) from None

    def decide() -> BaselineOutcome:
        try:
            baseline = load_baseline(path)
        except FileNotFoundError:
            if update:
                write()
                return BaselineOutcome("created", True, path, f"ortdiff: created {label}: {path}")
            return BaselineOutcome(
                "missing",
                False,
                path,
                f"ortdiff: no {label}: expected at\n  {path}\n"
                f"to create it, run: {how}\n"
                "then review and commit the new file(s). A missing baseline never passes: it would check nothing.",
            )
        except CorruptBaselineError as exc:
            if update:
                write()
                return BaselineOutcome("replaced corrupted", True, path, f"ortdiff: replaced corrupted {label} ({exc.reason}): {path}")
            return BaselineOutcome(
                "corrupted",
                False,
                path,
                f"ortdiff: {label}: the baseline file is corrupted and was NOT overwritten:\n  {path}\n  reason: {exc.reason}\n"
                f"restore it from version control (git checkout -- '{path}'), or replace it with this run's numbers: {how}",
            )
        mismatch = [f"{k} {baseline.meta.get(k)!r} (this test: {v!r})" for k, v in (("provider", provider), ("dtype", dtype), ("name", name)) if v and baseline.meta.get(k) not in (None, "", v)]
        if mismatch:
            if update:
                write()
                return BaselineOutcome("replaced corrupted", True, path, f"ortdiff: replaced {label} written for {', '.join(mismatch)}: {path}")
            return BaselineOutcome(
                "corrupted",
                False,
                path,
                f"ortdiff: {label}: the baseline file {path} was written for {', '.join(mismatch)}; it was NOT overwritten. "
                f"Was it copied or renamed? Replace it with this run's numbers: {how}",
            )
        comparison = compare_baseline(baseline, outputs, tolerance=tolerance)
        if comparison.identical:
            return BaselineOutcome("unchanged", True, path, f"ortdiff: {label}: identical", comparison)
        if update:
            write()
            return BaselineOutcome("updated", True, path, f"ortdiff: updated {label}: {path}\n{comparison.render()}", comparison)
        if comparison.passed:
            return BaselineOutcome("within tolerance", True, path, f"ortdiff: {label}: within tolerance\n{comparison.render()}", comparison)
        head = f"ortdiff: {label} drifted ({comparison.rule}: {'any change is drift' if tolerance is None else 'tolerance broken'})"
        return BaselineOutcome(
            "drift",
            False,
            path,
            f"{head}\n{comparison.render()}\nif the new numbers are right, accept them: {how}",
            comparison,
        )

    try:
        return decide()
    except _Unwritable as exc:
        err = exc.args[0]
        why = err.strerror or str(err)
        where = f"{err.filename}" if getattr(err, "filename", None) else str(path)
        return BaselineOutcome(
            "unwritable",
            False,
            path,
            f"ortdiff: {label}: cannot write {path}: {why} ({where}); nothing was written and what was there is untouched. "
            f"Make the directory writable, or point --ortdiff-baseline-dir at one that is",
        )
