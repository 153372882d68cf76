"""TfIdfVectorizer on integer token ids: n-gram (with skips) counts against a pool, weighted TF/IDF/TFIDF.

Every n-gram length and skip distance is one vectorised window comparison against that length's pool."""

from __future__ import annotations

import onnx
import torch

from ..base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = ["TfIdfVectorizer"]


@kernel("TfIdfVectorizer", since=9)
class TfIdfVectorizer(Kernel):
    """Counts, per row of a [C] or [B, C] int32/int64 input, the pool's n-grams of lengths
    min_gram_length..max_gram_length whose items are 1..max_skip_count+1 apart (unigrams once), into
    output column ngram_indexes[i]; IDF gives weights[col] where a count is > 0, TFIDF count * weight."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        if self.attrs.get("pool_strings"):
            raise UnsupportedVariantError(
                "TfIdfVectorizer pool_strings: string tokens, which torch cannot hold; run it with kernels={...: 'ort'}"
            )
        self.mode = self.attr("mode")
        if self.mode not in ("TF", "IDF", "TFIDF"):
            raise UnsupportedVariantError(
                f"TfIdfVectorizer mode={self.mode!r}; known: TF, IDF, TFIDF"
            )
        self.min_n, self.max_n = (
            int(self.attr("min_gram_length")),
            int(self.attr("max_gram_length")),
        )
        self.max_skip = int(self.attr("max_skip_count"))
        pool = list(self.attr("pool_int64s", []))
        counts = list(self.attr("ngram_counts"))
        indexes = list(self.attr("ngram_indexes"))
        self.size = max(indexes) + 1
        weights = self.attr("weights")
        self.weights = (
            torch.tensor(
                list(weights), dtype=ctx.torch_dtype(onnx.TensorProto.FLOAT), device=ctx.device
            )
            if weights
            else None
        )
        # per n: the pool's n-grams [count, n] and the output column of each
        self.grams: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        ngram_id = 0
        for i, start in enumerate(counts):
            n = i + 1
            end = counts[i + 1] if i + 1 < len(counts) else len(pool)
            k = (end - start) // n
            if k > 0 and self.min_n <= n <= self.max_n:
                grams = torch.tensor(pool[start : start + k * n], dtype=torch.int64).reshape(k, n)
                cols = torch.tensor(indexes[ngram_id : ngram_id + k], dtype=torch.int64)
                self.grams[n] = (grams.to(ctx.device), cols.to(ctx.device))
            ngram_id += k

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.dim() > 2:
            raise ValueError(f"TfIdfVectorizer: input of rank {x.dim()}; expected [C] or [B, C]")
        rows = x.reshape(1, -1) if x.dim() <= 1 else x
        rows = rows.to(torch.int64)
        b, c = rows.shape
        freq = torch.zeros((b, self.size), dtype=torch.int64, device=x.device)
        for n, (grams, cols) in self.grams.items():
            for skip in range(self.max_skip + 1 if n > 1 else 1):
                d = skip + 1
                span = (n - 1) * d + 1
                if span > c:
                    continue
                starts = torch.arange(c - span + 1, device=x.device)
                windows = rows[
                    :, starts.unsqueeze(1) + d * torch.arange(n, device=x.device)
                ]  # [B, W, n]
                hits = (windows.unsqueeze(2) == grams).all(-1).sum(1)  # [B, count]
                freq.index_add_(1, cols, hits)
        dtype = self.ctx.torch_dtype(onnx.TensorProto.FLOAT)
        f = freq.to(dtype)
        if self.mode == "TF":
            out = f
        elif self.mode == "IDF":
            out = (
                (freq > 0).to(dtype)
                if self.weights is None
                else torch.where(freq > 0, self.weights, 0)
            )
        else:
            out = f if self.weights is None else f * self.weights
        return (out.reshape(-1) if x.dim() <= 1 else out,)
