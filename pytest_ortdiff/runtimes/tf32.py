"""IEEE float32 for the torch evaluator: TF32 (and oneDNN's reduced precisions) off while it runs.

torch lets cuDNN convolutions use TF32 by default, and cuBLAS matmuls when the user allowed it; a float32
test's expected side must be IEEE float32, so the evaluator's runs turn both off and restore them after.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ieee_float32", "precision_settings"]

# On CUDA, torch's own switches: cuBLAS matmuls and cuDNN convolutions/RNNs. torch >= 2.9 also says it per
# backend and op ("ieee", "tf32"; "none": the parent's) and keeps the old flags in step with the new ones only
# when they are set through the old flags: set through the new ones, reading an old flag raises (torch.export
# reads them). So CUDA goes through the old flags, the new ones only where the user's state is already mixed.
# On CPU (oneDNN's reduced-precision float32 on CPUs with AMX) there are only the new ones.
_NEW_API = hasattr(torch.backends, "fp32_precision") and hasattr(torch.backends.cuda.matmul, "fp32_precision")
_ROOT: Any = torch.backends  # (the root setting, `fp32_precision`, is not in torch's stubs)


def _backends(device_type: str) -> list[tuple[str, Any]]:
    """(name, settings object) whose `fp32_precision` decides float32 math on this device type (torch >= 2.9)."""
    if not _NEW_API:
        return []
    if device_type == "cuda":
        cudnn: Any = torch.backends.cudnn  # (its conv/rnn settings objects are not in torch's stubs)
        return [("cuda.matmul", torch.backends.cuda.matmul), ("cudnn.conv", cudnn.conv), ("cudnn.rnn", cudnn.rnn)]
    mkldnn = getattr(torch.backends, "mkldnn", None)
    found = [(f"mkldnn.{name}", getattr(mkldnn, name, None)) for name in ("matmul", "conv", "rnn")] if mkldnn is not None else []
    return [(name, b) for name, b in found if b is not None and hasattr(b, "fp32_precision")]


def _legacy_cuda() -> tuple[bool, bool] | None:
    """(cuBLAS TF32, cuDNN TF32) by the old flags; None where torch refuses to say (a mixed state)."""
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        return None


def precision_settings(device_type: str) -> dict[str, Any]:
    """The float32 math settings that matter on `device_type` ("cuda", "cpu"), by name, as they are now."""
    out: dict[str, Any] = {}
    if device_type == "cuda":
        legacy = _legacy_cuda()
        if legacy is not None:
            out["cuda.matmul.allow_tf32"], out["cudnn.allow_tf32"] = legacy
    else:
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    out.update((f"{name}.fp32_precision", b.fp32_precision) for name, b in _backends(device_type))
    return out


def _is_ieee(device_type: str) -> bool:
    if _NEW_API:
        root = _ROOT.fp32_precision
        return all((b.fp32_precision if b.fp32_precision != "none" else root) in ("ieee", "none") for _, b in _backends(device_type))
    if device_type != "cuda":
        return torch.get_float32_matmul_precision() == "highest"
    return _legacy_cuda() == (False, False)


def _save(device_type: str) -> list[tuple[Any, str, Any]]:
    if device_type == "cuda":
        legacy = _legacy_cuda()
        if legacy is not None:
            return [(torch.backends.cuda.matmul, "allow_tf32", legacy[0]), (torch.backends.cudnn, "allow_tf32", legacy[1])]
    elif not _NEW_API:
        return [(None, "float32_matmul_precision", torch.get_float32_matmul_precision())]
    return [(b, "fp32_precision", b.fp32_precision) for _, b in _backends(device_type)]


def _restore(saved: list[tuple[Any, str, Any]]) -> None:
    for obj, name, value in saved:
        if obj is None:
            torch.set_float32_matmul_precision(value)
        else:
            setattr(obj, name, value)


def _set_ieee(device_type: str) -> None:
    if device_type == "cuda" and _legacy_cuda() is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    elif _NEW_API:
        for _, b in _backends(device_type):
            b.fp32_precision = "ieee"
    else:
        torch.set_float32_matmul_precision("highest")


# These settings are process-wide in torch, not per thread: runs that overlap in several threads share one
# change, made by the first to enter and undone by the last to leave (a count under a lock), so that one
# thread's exit never turns TF32 back on under another's run.
_LOCK = threading.Lock()
_DEPTH = 0
_SAVED: dict[str, list[tuple[Any, str, Any]]] = {}


@contextlib.contextmanager
def ieee_float32(device: torch.device | str) -> Iterator[None]:
    """float32 matmuls and convolutions in IEEE float32 on `device` for the duration (torch's TF32 on CUDA,
    oneDNN's bf16/TF32 modes on CPU), restored after. Nothing is touched where they are IEEE already."""
    global _DEPTH
    device_type = "cuda" if torch.device(device).type == "cuda" else "cpu"
    with _LOCK:
        entered = _DEPTH > 0 or not _is_ieee(device_type)
        if entered:
            if device_type not in _SAVED:  # (the first run on this device type since the last restore)
                _SAVED[device_type] = _save(device_type)
            _set_ieee(device_type)
            _DEPTH += 1
    try:
        yield
    finally:
        if entered:
            with _LOCK:
                _DEPTH -= 1
                if _DEPTH == 0:
                    for saved in _SAVED.values():
                        _restore(saved)
                    _SAVED.clear()
