"""Torch kernels for onnxruntime's activation contrib ops: Gelu, FastGelu, BiasGelu, QuickGelu, BiasAdd, BiasSplitGelu, BiasSoftmax."""

from __future__ import annotations
