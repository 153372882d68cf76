"""Small BERT-, GPT-2- and LLaMA-like modules exported by TorchScript and passed through onnxruntime's
transformers optimizer (and its float16 conversion), as users ship them: EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu, FastGelu, Attention, SkipSimplifiedLayerNormalization and the default
domain's SimplifiedLayerNormalization come out of it."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ARCHITECTURES", "deployed", "feeds_for"]


class _Attention(nn.Module):
    """Hand-written multi-head self-attention with an additive mask (the pattern the optimizer fuses)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        hd = d // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, hd).transpose(1, 2)

        scores = torch.matmul(split(self.q(x)), split(self.k(x)).transpose(-1, -2)) / math.sqrt(hd) + mask
        return self.o(torch.matmul(scores.softmax(-1), split(self.v(x))).transpose(1, 2).reshape(b, n, d))


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (1.0 - mask[:, None, None, :].to(dtype)) * -10000.0


class BertLike(nn.Module):
    """Embeddings (word + position + token type) and LayerNorm, two post-norm layers with an erf GELU MLP."""

    def __init__(self, vocab: int = 30, dim: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.word, self.pos, self.tok = nn.Embedding(vocab, dim), nn.Embedding(16, dim), nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.attn = nn.ModuleList(_Attention(dim, heads) for _ in range(layers))
        self.ln1 = nn.ModuleList(nn.LayerNorm(dim, eps=1e-12) for _ in range(layers))
        self.fc1 = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(layers))
        self.fc2 = nn.ModuleList(nn.Linear(4 * dim, dim) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(dim, eps=1e-12) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.ln(self.word(input_ids) + self.pos(positions) + self.tok(token_type_ids))
        mask = _additive(attention_mask, x.dtype)
        for attn, ln1, fc1, fc2, ln2 in zip(self.attn, self.ln1, self.fc1, self.fc2, self.ln2, strict=True):
            x = ln1(x + attn(x, mask))
            x = ln2(x + fc2(F.gelu(fc1(x))))
        return x


class GPT2Like(nn.Module):
    """Learned positions, two pre-norm layers with a tanh GELU MLP (gelu_new), a final LayerNorm."""

    def __init__(self, vocab: int = 30, dim: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.word, self.pos = nn.Embedding(vocab, dim), nn.Embedding(16, dim)
        self.ln1 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.attn = nn.ModuleList(_Attention(dim, heads) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.fc1 = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(layers))
        self.fc2 = nn.ModuleList(nn.Linear(4 * dim, dim) for _ in range(layers))
        self.lnf = nn.LayerNorm(dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.word(input_ids) + self.pos(torch.arange(input_ids.shape[1]).unsqueeze(0))
        mask = _additive(attention_mask, x.dtype)
        for ln1, attn, ln2, fc1, fc2 in zip(self.ln1, self.attn, self.ln2, self.fc1, self.fc2, strict=True):
            x = x + attn(ln1(x), mask)
            x = x + fc2(F.gelu(fc1(ln2(x)), approximate="tanh"))
        return self.lnf(x)


class _RMSNorm(nn.Module):
    """LlamaRMSNorm as transformers writes it: statistics in float32, scaled in the input's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LlamaLike(nn.Module):
    """Two pre-RMSNorm layers with a SiLU-gated MLP, a final RMSNorm."""

    def __init__(self, vocab: int = 30, dim: int = 16, heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, dim)
        self.n1 = nn.ModuleList(_RMSNorm(dim) for _ in range(layers))
        self.attn = nn.ModuleList(_Attention(dim, heads) for _ in range(layers))
        self.n2 = nn.ModuleList(_RMSNorm(dim) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(dim, 2 * dim, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(dim, 2 * dim, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(2 * dim, dim, bias=False) for _ in range(layers))
        self.norm = _RMSNorm(dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.word(input_ids)
        mask = _additive(attention_mask, x.dtype)
        for n1, attn, n2, gate, up, down in zip(self.n1, self.attn, self.n2, self.gate, self.up, self.down, strict=True):
            x = x + attn(n1(x), mask)
            h = n2(x)
            x = x + down(F.silu(gate(h)) * up(h))
        return self.norm(x)


#: name -> (module class, its inputs, the optimizer's model_type)
ARCHITECTURES: dict[str, tuple[type[nn.Module], tuple[str, ...], str]] = {
    "bert": (BertLike, ("input_ids", "attention_mask", "token_type_ids"), "bert"),
    "gpt2": (GPT2Like, ("input_ids", "attention_mask"), "gpt2"),
    "llama": (LlamaLike, ("input_ids", "attention_mask"), "bert"),
}


def feeds_for(names: tuple[str, ...] | list[str], batch: int = 2, seq: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1, seq - 2 :] = 0
    every = {
        "input_ids": torch.randint(0, 30, (batch, seq), generator=g),
        "attention_mask": mask,
        "token_type_ids": torch.randint(0, 2, (batch, seq), generator=g),
    }
    return {n: every[n] for n in names}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # the exporter and the optimizer warn and log about their own internals, none about the model
    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def deployed(name: str, tmp: Path, *, float16: bool = False) -> onnx.ModelProto:
    """ARCHITECTURES[name] exported (TorchScript, opset 17), optimized by onnxruntime.transformers'
    `optimize_model` (fusions only, as `opt_level=0` saves them), with `float16` converted by its
    `convert_float_to_float16(keep_io_types=True)`, saved by its own `save_model_to_file` and read back."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    cls, names, model_type = ARCHITECTURES[name]
    torch.manual_seed(0)
    module = cls().eval()
    buf = io.BytesIO()
    with _quiet():
        torch.onnx.export(
            module,
            tuple(feeds_for(names).values()),
            buf,
            dynamo=False,
            opset_version=17,
            input_names=list(names),
            output_names=["out"],
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
        )
        optimizer = optimize_model(
            onnx.load_from_string(buf.getvalue()), model_type=model_type, num_heads=2, hidden_size=16, optimization_options=FusionOptions(model_type), opt_level=0
        )
        if float16:
            optimizer.convert_float_to_float16(keep_io_types=True)
        path = tmp / f"{name}{'_fp16' if float16 else ''}.onnx"
        optimizer.save_model_to_file(str(path))
    return onnx.load(str(path))
