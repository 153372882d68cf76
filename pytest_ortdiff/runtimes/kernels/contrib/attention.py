"""Torch kernels for onnxruntime's attention contrib ops: Attention, MultiHeadAttention, GroupQueryAttention, RotaryEmbedding, DecoderMaskedMultiHeadAttention, SparseAttention, QAttention."""

from __future__ import annotations
