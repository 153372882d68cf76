"""A T5-like encoder with trained-like weights, its padded input feeds and its ONNX export: the model the
keep-in-float32 search (pytest_ortdiff.analyses.precision) is proven on against the seeds' range-only rule (seeds/001).

T5 v1.1's encoder as transformers writes it, small: token embedding; a relative-position bias computed in the
graph (buckets from Log of the distance, shared by every layer) to which the padding mask is added as
`(1 - mask) * finfo(float32).min`; pre-norm blocks with RMSNorm *without* the float32 upcast
(x.pow(2).mean -> rsqrt in the input dtype); attention without the 1/sqrt(d) scale; a gated tanh-GELU
feed-forward (gelu_new, with its x**3); a final RMSNorm. Two departures, both float16 hazards the issue asks
for: the softmax is written out without subtracting the row max (exp / sum), and nothing clamps the
residual stream.

The weights are not trained, but drawn so that the values a half-precision conversion meets are those of a
trained T5 (each scale is documented in `T5Like._init`):

- attention is strongly peaked: the position bias falls with distance, so a query gives distant tokens
  probabilities far below float16's 6e-8, and padded keys get exp(-3.4e38) = 0;
- the feed-forward's pre-activations have a std of a few units: the GELU of a very negative one is a tiny
  non-zero number, and so is the gate after it;
- the last feed-forwards write "massive activations" (a few residual features in the hundreds, as trained
  T5s do on their deeper blocks): on the last layer and the final norm some squares of the un-upcast
  RMSNorm pass 65504, which is the hazard a float16 model has to keep in float32.
"""

from __future__ import annotations

import io
import math
import warnings

import onnx
import torch
from torch import nn

__all__ = ["T5Like", "export_t5_like", "t5_feeds"]

VOCAB = 128
PAD, EOS = 0, 1  # T5's ids


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
    """`forward(input_ids [batch, seq] int64, attention_mask [batch, seq] int64) -> last_hidden_state
    [batch, seq, dim]`; weights drawn from `seed` (see `_init` for their scales and why)."""

    #: residual features the last feed-forwards write massive activations into
    MASSIVE = (3, 17)

    def __init__(
        self,
        *,
        layers: int = 8,
        dim: int = 64,
        heads: int = 4,
        ff: int = 128,
        num_buckets: int = 32,
        max_distance: int = 128,
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
        """The scales of a trained T5 where a float16 conversion meets them (the rest as transformers'
        T5 initializes it: normal, std 1/sqrt(fan_in))."""
        g = torch.Generator().manual_seed(seed)

        def normal(p: torch.Tensor, std: float) -> None:
            p.copy_(torch.randn(p.shape, generator=g) * std)

        dim = self.embed.embedding_dim
        heads = self.relative_attention_bias.embedding_dim
        blocks = [b for b in self.blocks if isinstance(b, Block)]
        ff = blocks[0].ff.wo.weight.shape[1]
        dk = dim // heads
        # T5's embedding init (std 1): residual features of a few units
        normal(self.embed.weight, 1.0)
        # Relative-position bias of local heads, as trained T5s learn it: about +2 at the head's preferred
        # offset (the previous token, itself, the next token), falling by 1.5 per token of distance
        # (0.75 for the broader last head) to -10 .. -20 for distant tokens; the content scores (std 2,
        # below) rarely reorder that, so a query's distant keys get probabilities of 1e-9 and less, far
        # below float16's 6e-8 (the peaked attention that fills the range-only rule's list with Exp and
        # Div nodes).
        distance = self._bucket_distance()
        offsets, slopes = (-1.0, 0.0, 1.0, 0.0), (1.5, 1.5, 1.5, 0.75)
        for h in range(heads):
            col = 2.0 - slopes[h % 4] * (distance - offsets[h % 4]).abs()
            noise = torch.randn(len(col), generator=g) * 0.3
            self.relative_attention_bias.weight[:, h] = col + noise
        for i, blk in enumerate(blocks):
            # q, k: content scores q.k (no 1/sqrt(d) in T5) with a std of 2 on normalized inputs
            qk = (2.0 / math.sqrt(dk)) ** 0.5
            normal(blk.attn.q.weight, qk / math.sqrt(dim))
            normal(blk.attn.k.weight, qk / math.sqrt(dim))
            normal(blk.attn.v.weight, 1.0 / math.sqrt(dim))
            normal(blk.attn.o.weight, 1.0 / math.sqrt(dim))
            # gelu pre-activations with a std of 3 (trained T5 v1.1 feed-forwards: a few units): x**3
            # stays in range (|x| < 40), the gelu of x < -5 is a non-zero below 6e-8
            normal(blk.ff.wi_0.weight, 3.0 / math.sqrt(dim))
            normal(blk.ff.wi_1.weight, 1.0 / math.sqrt(dim))
            normal(blk.ff.wo.weight, 1.0 / math.sqrt(ff))
            if i >= len(blocks) - 2:
                # massive activations: the deeper feed-forwards of trained T5s write a few residual
                # features far beyond the rest (transformers#5651: a wo output of 66,246 in t5-base;
                # openvino#37041: T5's deep blocks overflow float16). Here, small: gain 100 on two
                # features, reaching several hundred: their squares (from |x| > 256) overflow float16 in
                # the next norms, their mean of squares does not
                for f in self.MASSIVE:
                    blk.ff.wo.weight[f] *= 100.0
            # trained T5 norm weights vary around 1
            normal(blk.norm1.weight, 0.2)
            blk.norm1.weight.add_(1.0)
            normal(blk.norm2.weight, 0.2)
            blk.norm2.weight.add_(1.0)

    def _bucket_distance(self) -> torch.Tensor:
        """Each bucket's signed relative position (key - query; the smallest distance a log bucket holds)."""
        half = self.num_buckets // 2
        exact = half // 2
        k = torch.arange(half, dtype=torch.float32)
        log_start = exact * (self.max_distance / exact) ** ((k - exact) / (half - exact))
        size = torch.where(k < exact, k, torch.ceil(log_start))
        return torch.cat([-size, size])

    def position_bias(self, seq: int) -> torch.Tensor:
        pos = torch.arange(seq, dtype=torch.long)
        relative = pos[None, :] - pos[:, None]
        buckets = relative_position_bucket(relative, self.num_buckets, self.max_distance)
        # [1, heads, seq, seq]
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        # transformers' extended attention mask: float32's min on padded keys, added to the bias
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        bias = self.position_bias(input_ids.shape[1]) + mask
        for blk in self.blocks:
            x = blk(x, bias)
        return self.final_norm(x)


def t5_feeds(
    *, samples: int = 2, batch: int = 2, seq: int = 16, seed: int = 0
) -> list[dict[str, torch.Tensor]]:
    """`samples` padded batches as a tokenizer makes them: each sequence `seq // 2` to `seq` tokens long
    (random ids, the last one EOS), the longest of the batch `seq` long, the rest padded with PAD and
    masked out (attention_mask 0). Every sequence keeps real tokens: no attention row is fully masked."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(samples):
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
        lengths[torch.randint(0, batch, (1,), generator=g)] = seq
        ids = torch.randint(2, VOCAB, (batch, seq), generator=g)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.long)
        ids[torch.arange(batch), lengths - 1] = EOS
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, PAD))
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def export_t5_like(module: T5Like | None = None, *, seq: int = 16) -> onnx.ModelProto:
    """The float32 ONNX export by the TorchScript exporter (`dynamo=False`, opset 18), batch and seq symbolic,
    so the relative-position buckets are computed in the graph as in a real T5 export (the dynamo exporter
    traces static shapes here and folds them into a constant; it also takes several times longer)."""
    module = (module or T5Like()).eval()
    feeds = t5_feeds(samples=1, seq=seq, seed=1)[0]
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation and tracer warnings
        torch.onnx.export(
            module,
            (feeds["input_ids"], feeds["attention_mask"]),
            buf,  # type: ignore[arg-type]
            dynamo=False,
            opset_version=18,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
            },
        )
    return onnx.load_from_string(buf.getvalue())
