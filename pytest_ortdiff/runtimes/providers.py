"""Execution providers: short names (CPU, CUDA, ...) <-> onnxruntime EP names, availability, torch device,
and their options (`CUDA:use_tf32=0`): parsed, checked, and in force where sessions are made.

Parsing names imports nothing heavy; `available()` imports onnxruntime on first call only.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "KNOWN",
    "TF32_OPS",
    "ProviderOptions",
    "available",
    "ep_name",
    "normalize_provider_options",
    "options_in_force",
    "parse_provider",
    "parse_provider_options",
    "provider_options_in_force",
    "short_name",
    "tf32_in_play",
    "tf32_line",
    "torch_device",
]

#: short name -> onnxruntime execution provider name
KNOWN: dict[str, str] = {
    "CPU": "CPUExecutionProvider",
    "CUDA": "CUDAExecutionProvider",
    "TensorRT": "TensorrtExecutionProvider",
    "ROCm": "ROCMExecutionProvider",
    "MIGraphX": "MIGraphXExecutionProvider",
    "DirectML": "DmlExecutionProvider",
    "OpenVINO": "OpenVINOExecutionProvider",
    "CoreML": "CoreMLExecutionProvider",
    "XNNPACK": "XnnpackExecutionProvider",
    "QNN": "QNNExecutionProvider",
    "WebGPU": "WebGpuExecutionProvider",
}
_BY_LOWER = {k.lower(): k for k in KNOWN} | {v.lower(): k for k, v in KNOWN.items()}
_BY_LOWER["dml"] = "DirectML"
_BY_LOWER["trt"] = "TensorRT"


def parse_provider(name: str) -> str:
    """The short name for a user's spelling (`cuda`, `CUDAExecutionProvider`); ValueError lists the valid ones."""
    key = name.strip().lower()
    if key in _BY_LOWER:
        return _BY_LOWER[key]
    raise ValueError(f"unknown provider {name!r}; valid: {', '.join(KNOWN)}, 'available' (all that onnxruntime has here), or a full EP name such as CUDAExecutionProvider")


def ep_name(provider: str) -> str:
    return KNOWN[parse_provider(provider)]


def short_name(ep: str) -> str:
    for k, v in KNOWN.items():
        if v == ep:
            return k
    return ep


@functools.lru_cache(maxsize=1)
def available() -> tuple[str, ...]:
    """Short names of the providers this onnxruntime build offers (CPU first)."""
    try:
        import onnxruntime
    except ImportError:
        return ()
    # the Azure EP calls remote endpoints; it computes nothing locally to compare
    names = [short_name(ep) for ep in onnxruntime.get_available_providers() if ep != "AzureExecutionProvider"]
    return tuple(sorted(names, key=lambda n: (n != "CPU", list(KNOWN).index(n) if n in KNOWN else 99)))


def unavailable_reason(provider: str) -> str | None:
    """None when `provider` can run here, else a sentence saying why not and what is available."""
    have = available()
    if not have:
        return "onnxruntime is not installed; install pytest-ortdiff[cpu] (or [gpu] for CUDA)"
    if provider in have:
        if provider in ("CUDA", "TensorRT") and not _cuda_device_present():
            return f"{KNOWN[provider]} is built into onnxruntime but no CUDA device is visible"
        return None
    hint = ""
    if provider in ("CUDA", "TensorRT") and "CUDA" not in have:
        # the CPU wheel has no CUDA provider at all: the GPU one replaces it (never both installed)
        hint = " (this onnxruntime is the CPU build: for CUDA, pip uninstall onnxruntime && pip install pytest-ortdiff[gpu], i.e. onnxruntime-gpu)"
    return f"{KNOWN[provider]} not available; available: {', '.join(have)}{hint}"


@functools.lru_cache(maxsize=1)
def _cuda_device_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def torch_device(provider: str) -> str:
    """The torch device the torch evaluator uses next to `provider`."""
    p = parse_provider(provider)
    if p in ("CUDA", "TensorRT"):
        return "cuda"
    if p == "ROCm" or p == "MIGraphX":
        return "cuda"  # ROCm torch builds expose HIP devices as "cuda"
    return "cpu"


# ------------------------------------------------------------------------------------------------
# provider options: how onnxruntime runs a provider, as the user deploys it (CUDA's use_tf32 above all)

#: the options of the command line, the ini file, a marker or a Checker: provider -> {option: value}
ProviderOptions = dict[str, dict[str, str]]

# CUDA options whose values are checked here (the others are onnxruntime's to judge: a key its provider
# does not know is refused when the session is made, see OrtRunner)
_BOOLEAN = {"use_tf32", "do_copy_in_default_stream", "cudnn_conv_use_max_workspace", "cudnn_conv1d_pad_to_nc1d", "enable_cuda_graph", "prefer_nhwc"}
_INTEGER = {"device_id", "gpu_mem_limit"}
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def parse_provider_options(spec: str, source: str = "--ort-provider-options") -> ProviderOptions:
    """`"CUDA:use_tf32=0,cudnn_conv_algo_search=DEFAULT"` -> `{"CUDA": {"use_tf32": "0", ...}}`; ValueError
    naming the problem and the form otherwise."""
    form = f"{source}: expected PROVIDER:key=value[,key=value...], e.g. CUDA:use_tf32=0"
    provider, sep, rest = spec.partition(":")
    if not sep or not provider.strip():
        raise ValueError(f"{form}; got {spec!r}")
    options: dict[str, Any] = {}
    for item in rest.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{form}; {item.strip()!r} has no '='")
        options[key.strip()] = value.strip()
    if not options:
        raise ValueError(f"{form}; no option given for {provider.strip()}")
    return normalize_provider_options({provider: options}, source)


def normalize_provider_options(options: Mapping[str, Mapping[str, Any]] | None, source: str = "provider_options") -> ProviderOptions:
    """`{provider: {option: value}}` with short provider names and onnxruntime's string values (True/False
    -> "1"/"0"); ValueError naming the provider, the option and what is valid."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"{source} must be a dict {{provider: {{option: value}}}}, e.g. {{'CUDA': {{'use_tf32': 0}}}}; got {options!r}")
    out: ProviderOptions = {}
    for provider, opts in options.items():
        try:
            p = parse_provider(str(provider))
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
        if not isinstance(opts, Mapping):
            raise ValueError(f"{source}[{provider!r}] must be a dict {{option: value}}, e.g. {{'use_tf32': 0}}; got {opts!r}")
        out.setdefault(p, {}).update(option_values(p, opts, source))
    return out


def option_values(provider: str, options: Mapping[str, Any], source: str = "provider_options") -> dict[str, str]:
    """One provider's options as onnxruntime takes them: string keys and values, the known ones checked."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or not _KEY.match(key):
            raise ValueError(f"{source}: {provider} option name {key!r} is not a name such as use_tf32")
        if isinstance(value, bool):
            text = "1" if value else "0"
        elif isinstance(value, int | float | str):
            text = str(value).strip()
        else:
            raise ValueError(f"{source}: {provider} option {key}={value!r}: give a string, a number or a bool")
        if key in _BOOLEAN:
            flag = {"1": "1", "0": "0", "true": "1", "false": "0"}.get(text.lower())
            if flag is None:
                raise ValueError(f"{source}: {provider} option {key}={value!r}: give 0 or 1 (or True/False)")
            text = flag
        elif key in _INTEGER and not text.isdigit():
            raise ValueError(f"{source}: {provider} option {key}={value!r}: give a non-negative integer")
        out[key] = text
    return out


# the options in force where a runner is made without its own (a test's, a Checker's): provider -> options
_IN_FORCE: ProviderOptions = {}
_IN_FORCE_LOCK = threading.Lock()


def options_in_force(provider: str) -> dict[str, str]:
    """The options a runner for `provider` made now takes when it is given none of its own."""
    with _IN_FORCE_LOCK:
        return dict(_IN_FORCE.get(provider, {}))


@contextlib.contextmanager
def provider_options_in_force(options: ProviderOptions) -> Iterator[None]:
    """Every onnxruntime session made inside takes `options` for its provider (blame's, reproducible's,
    the evaluator's "ort" kernels' alike, wherever they are made), over those already in force. Process-wide
    for its duration: threads that make sessions meanwhile take them too."""
    with _IN_FORCE_LOCK:
        saved = {p: dict(o) for p, o in _IN_FORCE.items()}
        for p, o in options.items():
            _IN_FORCE[p] = {**_IN_FORCE.get(p, {}), **o}
    try:
        yield
    finally:
        with _IN_FORCE_LOCK:
            _IN_FORCE.clear()
            _IN_FORCE.update(saved)


#: ops onnxruntime's CUDA provider may compute in TF32 (10 mantissa bits) for float32 while `use_tf32` is 1 (its
#: default): the cuBLAS GEMMs, and the cuDNN convolutions, to which onnxruntime applies the option too (its PRs
#: #19357 and #19426); a user saw `use_tf32=0` change nothing for a MatMul (#23792): benchmarks/gpu_check.sh measures
TF32_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Einsum", "Attention", "MultiHeadAttention", "Conv", "ConvTranspose", "FusedConv"})


def tf32_in_play(provider: str, dtype: str, options: Mapping[str, str]) -> bool:
    """Whether onnxruntime may compute float32 in TF32: CUDA, float32, and use_tf32 not turned off."""
    return provider == "CUDA" and dtype == "float32" and options.get("use_tf32", "1") != "0"


def tf32_line(options: Mapping[str, str]) -> str:
    """The one line a failing CUDA float32 report adds when onnxruntime ran with TF32 allowed, with the fix."""
    how = "as asked" if "use_tf32" in options else "its default"
    return (
        f"onnxruntime's CUDA provider ran with use_tf32=1 ({how}): its float32 MatMul/Gemm may round inputs to TF32 "
        "(10 mantissa bits, ~1e-3 relative per product) while the torch evaluator computes IEEE float32; for IEEE "
        "float32 on both sides pass --ort-provider-options=CUDA:use_tf32=0 (marker: provider_options={'CUDA': {'use_tf32': 0}}), "
        "or keep TF32 and give the test a tolerance that fits it"
    )
