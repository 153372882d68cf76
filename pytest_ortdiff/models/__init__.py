"""Tiny graph builders (onnx.helper) with their torch.nn.Module twins, and random feeds for them."""

from __future__ import annotations

from .feeds import random_feeds, set_feed_range, transformer_feeds
from .hazards import FP16Hazard, fp16_hazards
from .layer_norm import LayerNormMatMulAdd, layer_norm_matmul_add
from .llama import LlamaAttention, LlamaDecoderLayer, llama_attention, llama_decoder_layer
from .mlp import MLP, GeluMLP, OnnxTwin, builder_info, gelu_mlp, mlp, torch_twin

__all__ = [
    "MLP",
    "FP16Hazard",
    "GeluMLP",
    "LayerNormMatMulAdd",
    "LlamaAttention",
    "LlamaDecoderLayer",
    "OnnxTwin",
    "builder_info",
    "fp16_hazards",
    "gelu_mlp",
    "layer_norm_matmul_add",
    "llama_attention",
    "llama_decoder_layer",
    "mlp",
    "random_feeds",
    "set_feed_range",
    "torch_twin",
    "transformer_feeds",
]
