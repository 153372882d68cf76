"""BERT-, GPT-2- and Llama-like `torch.nn.Module`s and their ONNX exports by both torch exporters, with
dynamic batch and sequence axes: the real-architecture graphs `bench_evaluator.py` times.

Structurally faithful (the ops, the shape arithmetic and the attention-mask patterns the real models export
to) but small: an embedding and a few layers, 100–1,000 nodes, exported in seconds and cached on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GRAPHS", "BertLike", "GPT2Like", "GraphSpec", "LlamaLike", "export", "feeds"]

VOCAB, HIDDEN, HEADS, LAYERS, MAX_POS = 1000, 64, 4, 2, 128  # LAYERS: the modules' default


class BertLike(nn.Module):
    """HF BertModel: word + position + token-type embeddings, LayerNorm, post-norm encoder layers (separate
    q/k/v projections, the extended attention mask `(1 - mask) * finfo.min` added to the scores, GELU FFN)."""

    def __init__(self, layers: int = LAYERS, hidden: int = HIDDEN, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.word = nn.Embedding(VOCAB, hidden)
        self.position = nn.Embedding(MAX_POS, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.register_buffer("position_ids", torch.arange(MAX_POS).unsqueeze(0), persistent=False)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(_BertLayer(hidden, heads) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        pos = self.position_ids[:, :seq]  # type: ignore[index]
        h = self.emb_norm(self.word(input_ids) + self.position(pos) + self.token_type(torch.zeros_like(input_ids)))
        ext = attention_mask[:, None, None, :].to(h.dtype)
        ext = (1.0 - ext) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, ext)
        return h


class _BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, -1).transpose(1, 2)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(h)), self.split(self.k(h)), self.split(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask
        ctx = (scores.softmax(-1) @ v).transpose(1, 2)
        ctx = ctx.reshape(ctx.shape[0], ctx.shape[1], -1)
        h = self.norm1(h + self.o(ctx))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


class GPT2Like(nn.Module):
    """HF GPT2Model: token + position embeddings, pre-norm blocks with a fused qkv `Conv1D` (addmm), the causal
    mask sliced from a `bias` buffer and applied with `torch.where`, tanh-GELU MLP, final LayerNorm."""

    def __init__(self, layers: int = LAYERS, hidden: int = HIDDEN, heads: int = HEADS) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, hidden)
        self.wpe = nn.Embedding(MAX_POS, hidden)
        self.blocks = nn.ModuleList(_GPT2Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[-1]
        pos = torch.arange(0, seq, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        h = self.wte(input_ids) + self.wpe(pos)
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h)


class _Conv1D(nn.Module):
    """GPT-2's transposed Linear: `addmm` on the flattened input."""

    def __init__(self, nin: int, nout: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nin, nout) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_shape = (*x.size()[:-1], self.weight.shape[1])
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(out_shape)


class _GPT2Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.c_attn, self.c_proj = _Conv1D(hidden, 3 * hidden), _Conv1D(hidden, hidden)
        self.c_fc, self.mlp_proj = _Conv1D(hidden, 4 * hidden), _Conv1D(4 * hidden, hidden)
        self.register_buffer("bias", torch.tril(torch.ones(MAX_POS, MAX_POS, dtype=torch.bool)).view(1, 1, MAX_POS, MAX_POS), persistent=False)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view((*x.size()[:-1], self.heads, x.size(-1) // self.heads)).permute(0, 2, 1, 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(self.ln_1(h)).split(h.size(-1), dim=2)
        q, k, v = self.split(q), self.split(k), self.split(v)
        w = q @ k.transpose(-1, -2) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        qlen, klen = q.size(-2), k.size(-2)
        causal = self.bias[:, :, klen - qlen : klen, :klen]  # type: ignore[index]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        a = (w.softmax(-1) @ v).permute(0, 2, 1, 3).contiguous()
        a = a.view((*a.size()[:-2], a.size(-2) * a.size(-1)))
        h = h + self.c_proj(a)
        return h + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))


class LlamaLike(nn.Module):
    """HF LlamaModel: token embeddings, RMSNorm, rotary position embeddings (cos/sin from `inv_freq` and the
    positions, `rotate_half`), grouped-query attention (`repeat_kv`), the causal mask built from a `triu` of
    `finfo.min` plus the padding mask, SwiGLU MLP, final RMSNorm."""

    def __init__(self, layers: int = LAYERS, hidden: int = HIDDEN, heads: int = HEADS, kv_heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.layers = nn.ModuleList(_LlamaLayer(hidden, heads, kv_heads) for _ in range(layers))
        self.norm = _RMSNorm(hidden)
        dim = hidden // heads
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        seq = input_ids.shape[1]
        positions = torch.arange(seq, device=h.device).unsqueeze(0)
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]  # a buffer
        freqs = (inv_freq[None, :, None].float() @ positions[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(h.dtype), emb.sin().to(h.dtype)
        minimum = torch.finfo(h.dtype).min
        causal = torch.full((seq, seq), minimum, dtype=h.dtype, device=h.device).triu(1)
        causal = causal[None, None, :, :].expand(input_ids.shape[0], 1, -1, -1)
        padding = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * minimum
        mask = (causal + padding).clamp(min=minimum)
        for layer in self.layers:
            h = layer(h, cos, sin, mask)
        return self.norm(h)


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _LlamaLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o = nn.Linear(heads * self.dim, hidden, bias=False)
        self.gate, self.up = nn.Linear(hidden, 2 * hidden, bias=False), nn.Linear(hidden, 2 * hidden, bias=False)
        self.down = nn.Linear(2 * hidden, hidden, bias=False)
        self.norm1, self.norm2 = _RMSNorm(hidden), _RMSNorm(hidden)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = h.shape
        x = self.norm1(h)
        q = self.q(x).view(b, s, -1, self.dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.dim).transpose(1, 2)
        c, si = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * c + _rotate_half(q) * si, k * c + _rotate_half(k) * si
        rep = self.heads // self.kv_heads  # repeat_kv
        k = k[:, :, None, :, :].expand(b, self.kv_heads, rep, s, self.dim).reshape(b, self.heads, s, self.dim)
        v = v[:, :, None, :, :].expand(b, self.kv_heads, rep, s, self.dim).reshape(b, self.heads, s, self.dim)
        w = q @ k.transpose(2, 3) / math.sqrt(self.dim) + mask[:, :, :, : k.shape[-2]]
        a = (w.softmax(-1) @ v).transpose(1, 2).contiguous().reshape(b, s, -1)
        h = h + self.o(a)
        x = self.norm2(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


@dataclass(frozen=True)
class GraphSpec:
    """A module, its input names, and a function making its inputs for a (batch, sequence) shape."""

    module: Callable[[], nn.Module]
    input_names: tuple[str, ...]

    def inputs(self, batch: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
        if len(self.input_names) == 1:
            return (ids,)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq - seq // 4 :] = 0  # some padding, so the mask does something
        return (ids, mask)


# layers chosen so that every export has 100-1,000 nodes (TorchScript's exports have 3-8x dynamo's)
GRAPHS: dict[str, GraphSpec] = {
    "bert": GraphSpec(lambda: BertLike(layers=4), ("input_ids", "attention_mask")),
    "gpt2": GraphSpec(lambda: GPT2Like(layers=3), ("input_ids",)),
    "llama": GraphSpec(lambda: LlamaLike(layers=3), ("input_ids", "attention_mask")),
}
EXPORT_SHAPE = (2, 16)  # (batch, sequence) traced at; both axes are exported dynamic


def feeds(name: str, batch: int, seq: int, seed: int = 0) -> dict[str, torch.Tensor]:
    spec = GRAPHS[name]
    return dict(zip(spec.input_names, spec.inputs(batch, seq, seed), strict=True))


def export(name: str, exporter: str, cache: bool = True) -> onnx.ModelProto:
    """`GRAPHS[name]` (weights from seed 0) exported by "dynamo" (`torch.onnx.export(dynamo=True)`) or
    "torchscript" (`dynamo=False`, opset 18), batch and sequence dynamic; cached under the temp directory,
    keyed by this file's source and torch's version, since an export takes seconds."""
    key = hashlib.sha256(Path(__file__).read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir(), "pytest_ortdiff_real_graphs", f"{name}-{exporter}-{key}.onnx")
    if cache and path.exists():
        return onnx.load(path)
    spec = GRAPHS[name]
    torch.manual_seed(0)
    module = spec.module().eval()
    args = spec.inputs(*EXPORT_SHAPE)
    with warnings.catch_warnings(), torch.no_grad(), _registry_built_once():
        warnings.simplefilter("ignore")  # both exporters warn about their own internals, never the model
        if exporter == "dynamo":
            batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=MAX_POS)
            shapes = {n: {0: batch, 1: seq} for n in spec.input_names}
            with contextlib.redirect_stdout(io.StringIO()):  # its progress lines, even with verbose=False
                program = torch.onnx.export(module, args, dynamo=True, verbose=False, dynamic_shapes=shapes, input_names=list(spec.input_names))
            assert program is not None
            model = program.model_proto
        elif exporter == "torchscript":
            buf = io.BytesIO()
            axes = {n: {0: "batch", 1: "seq"} for n in spec.input_names}
            torch.onnx.export(module, args, buf, dynamo=False, opset_version=18, input_names=list(spec.input_names), output_names=["output"], dynamic_axes=axes)  # type: ignore[arg-type]
            model = onnx.load_from_string(buf.getvalue())
        else:
            raise ValueError(f"exporter must be 'dynamo' or 'torchscript', not {exporter!r}")
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(model, path)
    return model


@contextlib.contextmanager
def _registry_built_once() -> Any:
    """The trick of tests/real_models.py (`_torchlib_registry_built_once`): the dynamo exporter rebuilds its
    registry of torchlib functions on every call, about a second of CPU; build it once per process."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    try:
        from real_models import _torchlib_registry_built_once
    except ImportError:  # the tests are not shipped alongside: export at full cost
        yield
        return
    with _torchlib_registry_built_once():
        yield
