"""A T5-like encoder whose float16 conversion breaks the way T5's does (seeds/001), its ONNX export and its
input feeds: the model the keep-in-float32 search (pytest_ortdiff.precision) is proven on.

T5 v1.1's encoder, small: token embedding, a relative-position bias computed in the graph (buckets from
Log of the distance, shared by every layer), pre-norm blocks with RMSNorm *without* the float32 upcast
(x.pow(2).mean -> rsqrt in the input dtype), attention without the 1/sqrt(d) scale whose softmax is written
out without subtracting the row max (exp / sum), a gated tanh-GELU feed-forward (gelu_new, with its
x**3), and a final RMSNorm. The weights are drawn so that, on any token ids:

- the last layer's attention scores reach about 25: exp overflows float16 (65504 = exp(11.09)), the row
  sums are +inf, the probabilities NaN;
- the last feed-forward writes a few large features into the residual stream (the "massive activations"
  of trained T5s): some x**2 of the final RMSNorm pass 65504, its mean of squares is +inf;
- harmless for the outputs, but out of float16's range all the same: the gelu's x**3 and the terms built
  on it overflow (tanh saturates either way), exp of very negative scores and the probabilities underflow,
  the negative gelu tail is subnormal, Log(0) = -inf in the bucket computation (Where discards it).
"""

from __future__ import annotations

import io
import math
import warnings

import onnx
import torch
from torch import nn

__all__ = ["T5Like", "export_t5_like", "t5_feeds"]

VOCAB = 64


class RMSNorm(nn.Module):
    """T5LayerNorm without the float32 upcast: the mean of squares in the input's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """transformers' NewGELUActivation (T5 v1.1's feed-forward activation), as it is written there."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def relative_position_bucket(
    relative_position: torch.Tensor, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """transformers' T5Attention._relative_position_bucket, bidirectional."""
    num_buckets //= 2
    buckets = (relative_position > 0).to(torch.long) * num_buckets
    relative_position = torch.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        scores = heads(self.q(x)) @ heads(self.k(x)).transpose(-1, -2) + position_bias
        e = scores.exp()  # no max subtraction
        probs = e / e.sum(-1, keepdim=True)
        return self.o((probs @ heads(self.v(x))).transpose(1, 2).reshape(b, s, d))


class GatedGelu(nn.Module):
    def __init__(self, dim: int, ff: int) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(dim, ff, bias=False)
        self.wi_1 = nn.Linear(dim, ff, bias=False)
        self.wo = nn.Linear(ff, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(gelu_new(self.wi_0(x)) * self.wi_1(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ff: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = RMSNorm(dim)
        self.ff = GatedGelu(dim, ff)

    def forward(self, x: torch.Tensor, position_bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), position_bias)
        return x + self.ff(self.norm2(x))


class T5Like(nn.Module):
    """`forward(input_ids [batch, seq] int64) -> last_hidden_state [batch, seq, dim]`; weights drawn from
    `seed` (see the module docstring for what they do to float16)."""

    def __init__(
        self,
        *,
        layers: int = 4,
        dim: int = 32,
        heads: int = 4,
        ff: int = 64,
        num_buckets: int = 16,
        max_distance: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.embed = nn.Embedding(VOCAB, dim)
        self.relative_attention_bias = nn.Embedding(num_buckets, heads)
        self.blocks = nn.ModuleList(Block(dim, heads, ff) for _ in range(layers))
        self.final_norm = RMSNorm(dim)
        self._init(seed)

    @torch.no_grad()
    def _init(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)

        def normal(p: torch.Tensor, std: float) -> None:
            p.copy_(torch.randn(p.shape, generator=g) * std)

        dim = self.embed.embedding_dim
        normal(self.embed.weight, 20.0)
        # trained T5 biases: near 0 for close tokens, down to about -10 far away
        normal(self.relative_attention_bias.weight, 2.0)
        blocks = [b for b in self.blocks if isinstance(b, Block)]
        last = len(blocks) - 1
        for i, blk in enumerate(blocks):
            # the last layer attends sharply: its scores pass exp's float16 range
            qk = 1.6 if i == last else 0.6
            normal(blk.attn.q.weight, qk / math.sqrt(dim))
            normal(blk.attn.k.weight, qk / math.sqrt(dim))
            normal(blk.attn.v.weight, 8.0 / math.sqrt(dim))
            normal(blk.attn.o.weight, 1.0 / math.sqrt(dim))
            normal(blk.ff.wi_0.weight, 40.0 / math.sqrt(dim))  # gelu inputs past 40: x**3 overflows
            normal(blk.ff.wi_1.weight, 1.0 / math.sqrt(dim))
            ff = blk.ff.wo.weight.shape[1]
            normal(blk.ff.wo.weight, (3.0 if i == last else 0.5) / math.sqrt(ff))
            normal(blk.norm1.weight, 0.2)
            blk.norm1.weight.add_(1.0)
            normal(blk.norm2.weight, 0.2)
            blk.norm2.weight.add_(1.0)

    def position_bias(self, seq: int) -> torch.Tensor:
        pos = torch.arange(seq, dtype=torch.long)
        relative = pos[None, :] - pos[:, None]
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
        # [1, heads, seq, seq]
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        bias = self.position_bias(input_ids.shape[1])
        for blk in self.blocks:
            x = blk(x, bias)
        return self.final_norm(x)


def t5_feeds(
    *, samples: int = 4, batch: int = 2, seq: int = 16, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """Token ids drawn uniformly from the vocabulary, `samples` batches (as the seeds' notebook draws them)."""
    g = torch.Generator().manual_seed(seed)
    return [
        {"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=g)} for _ in range(samples)
    ]


def export_t5_like(module: T5Like | None = None, *, seq: int = 16) -> onnx.ModelProto:
    """The float32 ONNX export by the TorchScript exporter (`dynamo=False`, opset 18), batch and seq symbolic,
    so the relative-position buckets are computed in the graph as in a real T5 export (the dynamo exporter
    traces static shapes here and folds them into a constant; it also takes several times longer)."""
    module = (module or T5Like()).eval()
    ids = torch.randint(0, VOCAB, (2, seq), generator=torch.Generator().manual_seed(1))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation and tracer warnings
        torch.onnx.export(
            module,
            (ids,),
            buf,  # type: ignore[arg-type]
            dynamo=False,
            opset_version=18,
            input_names=["input_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
            },
        )
    return onnx.load_from_string(buf.getvalue())
