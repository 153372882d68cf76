"""Tiny graph builders (onnx.helper) with their torch.nn.Module twins, and random feeds for them."""

from __future__ import annotations

from .feeds import random_feeds, set_feed_range
from .layer_norm import LayerNormMatMulAdd, layer_norm_matmul_add

__all__ = ["LayerNormMatMulAdd", "layer_norm_matmul_add", "random_feeds", "set_feed_range"]
