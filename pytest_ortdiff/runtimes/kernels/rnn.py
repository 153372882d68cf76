"""Recurrent kernels (ONNX's rnn family): RNN, GRU and LSTM.
"""

from __future__ import annotations

__all__: list[str] = []
