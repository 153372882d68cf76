"""Torch kernels for onnxruntime's layout contrib ops: the NCHWc ops (com.microsoft.nchwc) of a model saved at ORT_ENABLE_ALL."""

from __future__ import annotations
