"""Execution providers: short names (CPU, CUDA, ...) <-> onnxruntime EP names, availability, torch device.

Parsing names imports nothing heavy; `available()` imports onnxruntime on first call only.
"""

from __future__ import annotations

import functools

__all__ = ["KNOWN", "available", "ep_name", "parse_provider", "short_name", "torch_device"]

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
    return f"{KNOWN[provider]} not available; available: {', '.join(have)}"


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
