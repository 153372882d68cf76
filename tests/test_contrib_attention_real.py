"""The attention contrib kernels on what onnxruntime's tools emit: BERT-, GPT-2- and ViT-like modules exported
by torch.onnx.export and fused by onnxruntime.transformers.optimizer into Attention (mask_index from
EmbedLayerNormalization; GPT-2's stacked past/present, causal) and MultiHeadAttention; float32 and the
optimizer's float16 conversion. The ops other helpers are still writing (EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu) run on onnxruntime (missing="ort"); the attention nodes run on our kernels.
"""

from __future__ import annotations

import collections
import io
import math
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels import lookup
from pytest_ortdiff.runtimes.kernels.contrib import attention
from pytest_ortdiff.runtimes.ort import OrtRunner

optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
fusion_options = pytest.importorskip("onnxruntime.transformers.fusion_options")

HIDDEN, HEADS = 32, 4


class SelfAttention(nn.Module):
    """HF BERT's self-attention, as the optimizer's fusion expects it."""

    def __init__(self, masked: bool = True) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.head = HIDDEN // HEADS
        self.masked = masked

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], HEADS, self.head).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head)
        if self.masked:
            scores = scores + mask
        ctx = torch.matmul(F.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.shape[0], ctx.shape[1], -1)


class Layer(nn.Module):
    def __init__(self, masked: bool = True) -> None:
        super().__init__()
        self.attn, self.dense, self.ln1 = SelfAttention(masked), nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN)
        self.up, self.down, self.ln2 = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        h = self.ln1(x + self.dense(self.attn(x, mask)))
        return self.ln2(h + self.down(F.gelu(self.up(h))))


class Bert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word, self.pos, self.tok = nn.Embedding(50, HIDDEN), nn.Embedding(16, HIDDEN), nn.Embedding(2, HIDDEN)
        self.ln = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(2))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1]).unsqueeze(0)
        x = self.ln(self.word(input_ids) + self.pos(pos) + self.tok(token_type_ids))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


class Encoder(nn.Module):
    """ViT-like: no mask, fused into MultiHeadAttention with use_multi_head_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(Layer(masked=False) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln(x)
        for layer in self.layers:
            x = layer(x, None)
        return x


class Conv1D(nn.Module):
    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight, self.bias, self.nf = nn.Parameter(torch.randn(nx, nf) * 0.1), nn.Parameter(torch.randn(nf) * 0.1), nf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.size()[:-1], self.nf)


class GPT2Attention(nn.Module):
    """HF GPT-2's attention (stacked past/present, the causal mask as a where on a tril buffer)."""

    def __init__(self, ctx: int = 16) -> None:
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((ctx, ctx), dtype=torch.uint8)).view(1, 1, ctx, ctx))
        self.register_buffer("masked_bias", torch.tensor(-10000.0))
        self.c_attn, self.c_proj = Conv1D(3 * HIDDEN, HIDDEN), Conv1D(HIDDEN, HIDDEN)

    def heads(self, x: torch.Tensor, k: bool = False) -> torch.Tensor:
        x = x.view(*x.size()[:-1], HEADS, x.size(-1) // HEADS)
        return x.permute(0, 2, 3, 1) if k else x.permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, past: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.c_attn(x).split(HIDDEN, dim=2)
        q, k, v = self.heads(q), self.heads(k, k=True), self.heads(v)
        k = torch.cat((past[0].transpose(-2, -1), k), dim=-1)
        v = torch.cat((past[1], v), dim=-2)
        present = torch.stack((k.transpose(-2, -1), v))
        w = torch.matmul(q, k) / (float(v.size(-1)) ** 0.5)
        nd, ns = w.size(-2), w.size(-1)
        w = torch.where(self.bias[:, :, ns - nd : ns, :ns].bool(), w, self.masked_bias.to(w.dtype))
        a = torch.matmul(nn.Softmax(dim=-1)(w + mask), v).permute(0, 2, 1, 3).contiguous()
        return self.c_proj(a.view(*a.size()[:-2], HIDDEN)), present


class GPT2Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(HIDDEN), GPT2Attention(), nn.LayerNorm(HIDDEN)
        self.c_fc, self.c_proj = Conv1D(4 * HIDDEN, HIDDEN), Conv1D(HIDDEN, 4 * HIDDEN)

    def forward(self, x: torch.Tensor, past: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, present = self.attn(self.ln_1(x), past, mask)
        x = x + a
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)))), present


class GPT2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(GPT2Block() for _ in range(2))
        self.ln_f = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor, past_0: torch.Tensor, past_1: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        presents = []
        for block, past in zip(self.blocks, (past_0, past_1), strict=True):
            x, present = block(x, past, mask)
            presents.append(present)
        return self.ln_f(x), *presents


def _export(module: nn.Module, args: tuple[torch.Tensor, ...], names: list[str], outputs: list[str], axes: dict[str, dict[int, str]]) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's own deprecation and tracer warnings
        torch.onnx.export(module.eval(), args, buf, dynamo=False, opset_version=17, input_names=names, output_names=outputs, dynamic_axes=axes)
    return onnx.load_from_string(buf.getvalue())


def _optimize(model: onnx.ModelProto, model_type: str, mha: bool = False) -> onnx.ModelProto:
    options = fusion_options.FusionOptions(model_type)
    options.use_multi_head_attention = mha
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = optimizer.optimize_model(model, model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN, opt_level=0, optimization_options=options)
    return out.model


@pytest.fixture(scope="module")
def graphs() -> dict[str, tuple[onnx.ModelProto, dict[str, torch.Tensor]]]:
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0  # right padding: EmbedLayerNormalization's mask_index holds the lengths [8, 6]
    bert_feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(2, 8, dtype=torch.int64)}
    axes = {n: {0: "batch", 1: "seq"} for n in bert_feeds}
    bert = _optimize(_export(Bert(), tuple(bert_feeds.values()), list(bert_feeds), ["out"], axes), "bert")

    enc_feeds = {"x": torch.randn(2, 8, HIDDEN)}
    enc = _optimize(_export(Encoder(), (enc_feeds["x"],), ["x"], ["out"], {"x": {0: "batch", 1: "seq"}}), "bert", mha=True)

    past = 4
    gpt_mask = torch.ones(2, past + 3)
    gpt_mask[1, :2] = 0  # left padding
    gpt_feeds = {"x": torch.randn(2, 3, HIDDEN), "attention_mask": gpt_mask, "past_0": torch.randn(2, 2, HEADS, past, HIDDEN // HEADS), "past_1": torch.randn(2, 2, HEADS, past, HIDDEN // HEADS)}
    gpt_axes = {"x": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"}, "past_0": {1: "batch", 3: "past"}, "past_1": {1: "batch", 3: "past"}}
    gpt = _optimize(_export(GPT2(), tuple(gpt_feeds.values()), list(gpt_feeds), ["out", "present_0", "present_1"], gpt_axes), "gpt2")
    return {"bert": (bert, bert_feeds), "encoder": (enc, enc_feeds), "gpt2": (gpt, gpt_feeds)}


def _fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.transformers.onnx_model import OnnxModel

    m = OnnxModel(onnx.ModelProto.FromString(model.SerializeToString()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.convert_float_to_float16(keep_io_types=True)
    m.topological_sort()  # the converter leaves the inputs' Casts last (sorting it in the evaluator is another helper's work)
    return m.model


def _ours_and_ort(model: onnx.ModelProto, feeds: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    # check_model=False: the optimizer writes com.microsoft nodes without importing the domain (onnxruntime
    # accepts that; the checker gate is another helper's work)
    ours = TorchEvaluator(model, missing="ort", check_model=False).run(None, feeds)
    return ours, OrtRunner(model).run(None, feeds)


@pytest.mark.parametrize(("name", "op", "count"), [("bert", "Attention", 2), ("gpt2", "Attention", 2), ("encoder", "MultiHeadAttention", 2)])
def test_optimizer_fused_attention_runs_on_our_kernel_and_matches_onnxruntime(graphs: Any, name: str, op: str, count: int) -> None:
    model, feeds = graphs[name]
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops[op] == count, f"the optimizer fused {dict(ops)}"
    assert lookup("com.microsoft", op, 1) is getattr(attention, op)
    ours, ort = _ours_and_ort(model, feeds)
    assert len(ours) == len(ort)
    for o, g in zip(ours, ort, strict=True):
        assert o.dtype == g.dtype and o.shape == g.shape
        # float32 through two layers: a few float32 ulps of values near 1-4 (measured: <= 7.2e-7)
        np.testing.assert_allclose(o.numpy(), g.numpy(), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["bert", "gpt2", "encoder"])
def test_float16_conversion_matches_onnxruntime_within_its_rounding(graphs: Any, name: str) -> None:
    """convert_float_to_float16(keep_io_types=True): float16 compute behind float32 inputs and outputs."""
    model, feeds = graphs[name]
    half = _fp16(model)
    assert any(n.op_type in ("Attention", "MultiHeadAttention") for n in half.graph.node)
    ours, ort = _ours_and_ort(half, feeds)
    for o, g in zip(ours, ort, strict=True):
        # two float16 ulps of the largest output (ulp 2^-10 relative): both round the same float32 sums
        scale = float(g.abs().max())
        np.testing.assert_allclose(o.float().numpy(), g.float().numpy(), rtol=0, atol=2 * 2**-10 * scale)


# -- onnxruntime-genai's model builder (optional: onnxruntime-genai and transformers are not dependencies) ----


@pytest.fixture(scope="module")
def genai_llama(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    """A 2-layer Llama (4 query heads on 2 KV heads, random weights, a word-level tokenizer made here) through
    onnxruntime-genai's builder for CPU in float32: GroupQueryAttention with packed QKV and rotary inside."""
    pytest.importorskip("onnxruntime_genai")
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    import contextlib
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, head_dim=16,
    )
    with contextlib.redirect_stderr(io.StringIO()):
        transformers.LlamaForCausalLM(config).save_pretrained(folder / "hf")
    vocab = {f"t{i}": i for i in range(64)}
    word = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="t0"))
    word.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=word, unk_token="t0", bos_token="t1", eos_token="t2", pad_token="t3").save_pretrained(folder / "hf")
    subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder / "hf"), "-o", str(folder / "onnx"), "-p", "fp32", "-e", "cpu", "-c", str(folder / "cache")],
        check=True, capture_output=True,
    )
    return onnx.load(str(folder / "onnx" / "model.onnx"))


@pytest.mark.parametrize(("batch", "seq", "past", "left_pad"), [(2, 5, 0, 0), (2, 1, 4, 0), (2, 1, 4, 2)])
def test_genai_group_query_attention_matches_onnxruntime(genai_llama: onnx.ModelProto, batch: int, seq: int, past: int, left_pad: int) -> None:
    """The prompt and decode steps (a past of 4; left padding through the attention mask's seqlens_k)."""
    assert collections.Counter(n.op_type for n in genai_llama.graph.node)["GroupQueryAttention"] == 2
    g = torch.Generator().manual_seed(past + left_pad)
    feeds: dict[str, torch.Tensor] = {"input_ids": torch.randint(0, 64, (batch, seq), generator=g), "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64)}
    feeds["attention_mask"][1, :left_pad] = 0
    for layer in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{layer}.{kind}"] = torch.randn(batch, 2, past, 16, generator=g)
    ours, ort = _ours_and_ort(genai_llama, feeds)
    for o, r in zip(ours, ort, strict=True):
        np.testing.assert_allclose(o.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)  # measured: <= 1.5e-7
