"""Torch kernels for onnxruntime's normalization contrib ops: SimplifiedLayerNormalization, (Skip)(Simplified)LayerNormalization, EmbedLayerNormalization, GroupNorm, SkipGroupNorm."""

from __future__ import annotations
