"""The deployed-model corpus: tiny transformers models (random weights, one layer, hidden 32) exported by both
torch exporters and passed through onnxruntime's own tool chain, as people ship them; built once, cached on disk.

A *form* is one model file: an architecture (BERT, GPT-2, Llama, Qwen2, Mistral, Phi-3, T5, ViT, Whisper,
CLIP), how it left torch (`torch.onnx.export(dynamo=True)`, `dynamo=False`, or onnxruntime-genai's model
builder straight from the transformers checkpoint) and the deployment steps applied after, in order:

- `opt`: `onnxruntime.transformers.optimizer.optimize_model` with the model type a user picks for the
  architecture (Llama-family decoders: "gpt2", as onnxruntime's Llama scripts do) at its default level;
  `opt99`: the same at level 99 (onnxruntime's ORT_ENABLE_ALL first: NCHWc layout ops for convolutions);
- `optimumO2` / `optimumO3`: what optimum's ORTOptimizer writes at `--optimize O2` / `O3` (opt_level 2,
  optimum's fusion defaults; O3 approximates Gelu: FastGelu);
- `fp16` / `fp16io`: the optimizer's `convert_float_to_float16` with `keep_io_types=True` (its default:
  float16 compute behind float32 inputs and outputs) / `False` (float16 inputs and outputs);
- `qdyn`: `quantize_dynamic` (uint8 weights); `qdq`: `quantize_static` in QDQ format, calibrated on random
  feeds;
- `int4` / `int4a` / `int4acc4` / `int4g`: `MatMulNBitsQuantizer`, 4 bits, block 32, symmetric /
  asymmetric / symmetric at accuracy_level 4 (int8 activations) / symmetric with the embedding Gather too
  (GatherBlockQuantized);
- genai forms: `genai-fp32`, `genai-int4` (the builder's CPU int4: MatMulNBits at accuracy_level 4),
  `genai-int4shared` (int4 with the tied embedding shared: GatherBlockQuantized).

Form names read `llama-dynamo-opt-fp16`, `qwen2-genai-int4`. `FORMS` lists them all (`FULL`), `DEFAULT` the
subset the test suite runs; `build(name, cache)` returns a form's file, built with its parents on first use
and kept under `cache/<versions key>/<name>/model.onnx` (the key hashes the versions of every tool and this
file, so an upgrade rebuilds). Building is serialized by a lock file per form: xdist workers share the cache.
No hub download: HF_HUB_OFFLINE is set, every model is made from a config, the tokenizer genai's builder
needs is made offline.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers loads: never a download

__all__ = [
    "ARCHS",
    "DEFAULT",
    "FORMS",
    "FULL",
    "Arch",
    "Form",
    "available",
    "build",
    "cache_key",
    "feeds",
    "why_unavailable",
]

VOCAB = 128
SEQ = 8  # tokens of the example inputs (and of the feeds: dims are dynamic, so any length runs)
BOS, EOS = 1, 2


# -- architectures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """One transformers architecture, tiny: how to make it (seeded random weights), its inputs, the optimizer's
    model type for it, and the genai builder's support."""

    name: str
    make: Callable[[], nn.Module]
    inputs: tuple[str, ...]
    optimizer: str  # optimize_model's model_type
    heads: int = 4
    hidden: int = 32
    genai: bool = False  # onnxruntime-genai's builder builds it
    output: str = "logits"  # the model output the export returns
    exporters: tuple[str, ...] = ("dynamo", "torchscript")


def _text(hidden: int = 32, **extra: Any) -> dict[str, Any]:
    # intermediate 3 x hidden, never the vocabulary's 128: onnxruntime-genai's builder takes any Linear with
    # vocab_size outputs for the LM head (an MLP's gate_proj of 128 became it, leaving the rest of the graph dead)
    return dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=1, num_attention_heads=4,
                max_position_embeddings=64, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0, **extra)


def _seeded(factory: Callable[[], nn.Module], attention: str | None = None) -> Callable[[], nn.Module]:
    """`factory` with seeded weights, in eval mode; `attention="eager"`: transformers' written-out attention
    (MatMul, Softmax) where onnxruntime's optimizer fuses Attention only from that (its default, SDPA, exports
    in a form the optimizer leaves unfused)."""

    def make() -> nn.Module:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = factory().eval()
        if attention is not None:
            for sub in model.modules():
                config = getattr(sub, "config", None)
                if config is not None and hasattr(config, "_attn_implementation"):
                    config._attn_implementation = attention
        return model

    return make


def _bert() -> nn.Module:
    import transformers

    return transformers.BertModel(transformers.BertConfig(**_text(), type_vocab_size=2), add_pooling_layer=False)


def _gpt2() -> nn.Module:
    import transformers

    return transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                                                bos_token_id=BOS, eos_token_id=EOS))


def _causal(kind: str, **extra: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import transformers

        # hidden 64 over 4 heads: onnxruntime's GroupQueryAttention on CPU takes head sizes in multiples of 16 only
        config = getattr(transformers, f"{kind}Config")(**_text(64, num_key_value_heads=2, tie_word_embeddings=True, **extra))
        return getattr(transformers, f"{kind}ForCausalLM")(config)

    return make


def _t5() -> nn.Module:
    import transformers

    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=EOS, feed_forward_proj="gated-gelu"))


def _vit() -> nn.Module:
    import transformers

    return transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                                        image_size=16, patch_size=4, num_channels=3), add_pooling_layer=False)


def _whisper() -> nn.Module:
    import transformers

    return transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, encoder_layers=1, decoder_layers=1, d_model=32, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16, max_target_positions=32,
        decoder_start_token_id=BOS, pad_token_id=0, bos_token_id=BOS, eos_token_id=EOS))


def _clip() -> nn.Module:
    import transformers

    config = transformers.CLIPConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         max_position_embeddings=16, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=16, patch_size=4),
        projection_dim=16,
    )
    return transformers.CLIPModel(config)


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in (
        Arch("bert", _seeded(_bert, "eager"), ("input_ids", "attention_mask", "token_type_ids"), "bert", output="last_hidden_state"),
        Arch("gpt2", _seeded(_gpt2, "eager"), ("input_ids", "attention_mask"), "gpt2"),
        Arch("llama", _seeded(_causal("Llama")), ("input_ids", "attention_mask"), "gpt2", hidden=64, genai=True),
        Arch("qwen2", _seeded(_causal("Qwen2")), ("input_ids", "attention_mask"), "gpt2", hidden=64, genai=True),
        Arch("mistral", _seeded(_causal("Mistral")), ("input_ids", "attention_mask"), "gpt2", hidden=64, genai=True),
        Arch("phi3", _seeded(_causal("Phi3")), ("input_ids", "attention_mask"), "gpt2", hidden=64, genai=True),
        Arch("t5", _seeded(_t5, "eager"), ("input_ids", "attention_mask", "decoder_input_ids"), "t5"),
        Arch("vit", _seeded(_vit, "eager"), ("pixel_values",), "vit", output="last_hidden_state"),
        Arch("whisper", _seeded(_whisper, "eager"), ("input_features", "decoder_input_ids"), "bart",
             exporters=("dynamo",)),  # (TorchScript has no aten::diff, which transformers' Whisper decoder calls)
        Arch("clip", _seeded(_clip, "eager"), ("input_ids", "pixel_values", "attention_mask"), "clip", output="logits_per_image"),
    )
}


def example_inputs(arch: Arch, *, batch: int = 1, seq: int = SEQ, seed: int = 0) -> dict[str, torch.Tensor]:
    """The inputs an export traces with (and the feeds the corpus tests draw the same way)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in arch.inputs:
        if name in ("input_ids", "decoder_input_ids"):
            n = seq if name == "input_ids" else max(2, seq // 2)
            ids = torch.randint(3, VOCAB, (batch, n), generator=g)
            ids[:, -1] = EOS  # CLIP pools its text at the EOS token
            out[name] = ids
        elif name == "attention_mask":
            out[name] = torch.ones(batch, seq, dtype=torch.int64)
        elif name == "token_type_ids":
            out[name] = torch.zeros(batch, seq, dtype=torch.int64)
        elif name == "pixel_values":
            out[name] = torch.randn(batch, 3, 16, 16, generator=g)
        elif name == "input_features":
            out[name] = torch.randn(batch, 8, 32, generator=g)
        else:
            raise ValueError(f"no example for input {name!r}")
    return out


class _Exported(nn.Module):
    """The transformers model as a function of its inputs in order, returning one tensor (no cache, no dict):
    the signature a user exports."""

    def __init__(self, arch: Arch) -> None:
        super().__init__()
        self.arch = arch
        self.model = arch.make()

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.arch.inputs, args, strict=True))
        if "decoder_input_ids" in kwargs or self.arch.name in ("gpt2", "llama", "qwen2", "mistral", "phi3"):
            kwargs["use_cache"] = False
        return getattr(self.model(**kwargs, return_dict=True), self.arch.output)


_DYNAMIC = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "token_type_ids": {0: "batch", 1: "sequence"}, "decoder_input_ids": {0: "batch", 1: "decoder_sequence"},
            "pixel_values": {0: "batch"}, "input_features": {0: "batch"}}


def _export(arch: Arch, exporter: str, path: Path) -> None:
    module = _Exported(arch).eval()
    inputs = example_inputs(arch)
    args = tuple(inputs.values())
    from real_models import (
        _torchlib_registry_built_once,  # (the dynamo exporter's registry, built once per process)
    )

    with warnings.catch_warnings(), torch.no_grad(), _torchlib_registry_built_once():
        warnings.simplefilter("ignore")  # both exporters warn about their own internals; none is about the model
        if exporter == "dynamo":
            from torch.export import Dim

            shapes = {"args": tuple({k: Dim.DYNAMIC for k in _DYNAMIC[n]} for n in inputs)}
            with contextlib.redirect_stdout(io.StringIO()):
                program = torch.onnx.export(module, args, dynamo=True, verbose=False, dynamic_shapes=shapes,
                                            input_names=list(inputs), output_names=[arch.output])
            assert program is not None
            program.save(str(path))
        else:
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, input_names=list(inputs),
                              output_names=[arch.output], dynamic_axes={n: _DYNAMIC[n] for n in inputs})


# -- deployment steps -----------------------------------------------------------------------------------


def _optimize(arch: Arch, src: Path, dst: Path, level: int | None) -> None:
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(src), model_type=arch.optimizer, num_heads=arch.heads, hidden_size=arch.hidden, opt_level=level)
    opt.save_model_to_file(str(dst))


def _optimum(arch: Arch, src: Path, dst: Path, gelu_approximation: bool) -> None:
    """What optimum's `ORTOptimizer` writes at `AutoOptimizationConfig.O2()` / `O3()` (optimum pins transformers
    below 5, so the corpus makes its call itself): optimize_model at opt_level 2 with the fusion options of
    optimum's OptimizationConfig defaults (EmbedLayerNormalization and GroupNorm fusions off, packed KV off), and
    at O3 the Gelu approximation on (FastGelu where the model has an exact Gelu)."""
    import argparse

    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    parser = argparse.ArgumentParser()
    FusionOptions.add_arguments(parser)
    flags = ["--disable_embed_layer_norm", "--disable_group_norm", "--disable_packed_kv", *(["--enable_gelu_approximation"] if gelu_approximation else [])]
    args = parser.parse_args(flags)
    args.model_type = arch.optimizer
    options = FusionOptions.parse(args)
    opt = optimize_model(str(src), model_type=arch.optimizer, num_heads=arch.heads, hidden_size=arch.hidden, opt_level=2, optimization_options=options)
    opt.save_model_to_file(str(dst))


def _float16(arch: Arch, src: Path, dst: Path, keep_io_types: bool) -> None:
    from onnxruntime.transformers.onnx_model import OnnxModel

    m = OnnxModel(onnx.load(str(src)))
    m.convert_float_to_float16(keep_io_types=keep_io_types)
    m.save_model_to_file(str(dst))


def _quantize_dynamic(arch: Arch, src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(src, dst, weight_type=QuantType.QUInt8)


class _Calibration:
    """A few random batches of the architecture's inputs: what quantize_static calibrates activation ranges on."""

    def __init__(self, arch: Arch, names: list[str]) -> None:
        self._batches = iter([{n: v.numpy() for n, v in zip(names, example_inputs(arch, seed=s).values(), strict=True)} for s in range(3)])

    def get_next(self) -> dict[str, Any] | None:
        return next(self._batches, None)

    def rewind(self) -> None:  # one pass is all quantize_static asks for here
        pass


def _quantize_qdq(arch: Arch, src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst.with_name("pre.onnx")
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)  # as onnxruntime's docs ask
    names = [i.name for i in onnx.load(str(pre), load_external_data=False).graph.input]
    quantize_static(pre, dst, _Calibration(arch, names), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    pre.unlink()


def _int4(arch: Arch, src: Path, dst: Path, *, symmetric: bool = True, accuracy_level: int | None = None, gather: bool = False) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    ops = ("MatMul", "Gather") if gather else ("MatMul",)
    q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=4, block_size=32, is_symmetric=symmetric, accuracy_level=accuracy_level,
                             op_types_to_quantize=ops)
    q.process()
    q.model.save_model_to_file(str(dst), use_external_data_format=False)


STEPS: dict[str, Callable[[Arch, Path, Path], None]] = {
    "opt": lambda a, s, d: _optimize(a, s, d, None),
    "opt99": lambda a, s, d: _optimize(a, s, d, 99),
    "optimumO2": lambda a, s, d: _optimum(a, s, d, False),
    "optimumO3": lambda a, s, d: _optimum(a, s, d, True),
    "fp16": lambda a, s, d: _float16(a, s, d, True),
    "fp16io": lambda a, s, d: _float16(a, s, d, False),
    "qdyn": _quantize_dynamic,
    "qdq": _quantize_qdq,
    "int4": lambda a, s, d: _int4(a, s, d),
    "int4a": lambda a, s, d: _int4(a, s, d, symmetric=False),
    "int4acc4": lambda a, s, d: _int4(a, s, d, accuracy_level=4),
    "int4g": lambda a, s, d: _int4(a, s, d, gather=True),
}

GENAI = {"genai-fp32": ("fp32", {}), "genai-int4": ("int4", {}), "genai-int4shared": ("int4", {"shared_embeddings": "true"})}


def _tokenizer(folder: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary, made offline: genai's builder copies one beside its model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": BOS, "</s>": EOS, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<pad>", pad_token="<pad>", bos_token="<s>", eos_token="</s>").save_pretrained(folder)


def _genai(arch: Arch, variant: str, out: Path) -> None:
    """`python -m onnxruntime_genai.models.builder -i HF -o OUT -p PRECISION -e cpu`, run in this process (runpy:
    the command line exactly, without a second interpreter importing torch again)."""
    import runpy

    precision, extra = GENAI[variant]
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp, "hf")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            arch.make().save_pretrained(hf)
        _tokenizer(hf)
        argv = ["builder", "-i", str(hf), "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(Path(tmp, "cache"))]
        if extra:
            argv += ["--extra_options", *(f"{k}={v}" for k, v in extra.items())]
        old = sys.argv
        sys.argv = argv
        try:
            runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=False)
        except SystemExit as exc:
            raise RuntimeError(f"onnxruntime-genai's builder refused {arch.name} {variant}: exit status {exc.code}") from None
        finally:
            sys.argv = old
        if not (out / "model.onnx").exists():
            raise RuntimeError(f"onnxruntime-genai's builder wrote no model.onnx for {arch.name} {variant}")


# -- forms ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    """One model file of the corpus: `arch` exported by `source` ("dynamo", "torchscript", or a genai variant),
    then each of `steps`."""

    arch: str
    source: str
    steps: tuple[str, ...] = ()
    needs: tuple[str, ...] = field(default=())  # distributions it needs beyond the test extra

    @property
    def name(self) -> str:
        return "-".join((self.arch, self.source, *self.steps))

    @property
    def parent(self) -> Form | None:
        return Form(self.arch, self.source, self.steps[:-1], self.needs) if self.steps else None

    @property
    def export(self) -> Form:
        """The float32 export this form was made from (genai forms: the builder's fp32 model)."""
        source = "genai-fp32" if self.source.startswith("genai") else self.source
        return Form(self.arch, source, (), self.needs)


def _forms() -> dict[str, Form]:
    out: list[Form] = []
    for arch in ARCHS.values():
        for exporter in arch.exporters:
            out.append(Form(arch.name, exporter))
            out.append(Form(arch.name, exporter, ("opt",)))
            out.append(Form(arch.name, exporter, ("opt", "fp16")))
            out.append(Form(arch.name, exporter, ("opt", "fp16io")))
            out.append(Form(arch.name, exporter, ("fp16",)))
            out.append(Form(arch.name, exporter, ("qdyn",)))
            out.append(Form(arch.name, exporter, ("qdq",)))
            out += [Form(arch.name, exporter, (q,)) for q in ("int4", "int4a", "int4acc4")]
        out.append(Form(arch.name, arch.exporters[-1], ("opt99",)))
        out += [Form(arch.name, exporter, (level,)) for exporter in arch.exporters for level in ("optimumO2", "optimumO3")]
        out.append(Form(arch.name, arch.exporters[-1], ("opt", "int4")))
        if arch.genai:
            out += [Form(arch.name, v, needs=("onnxruntime-genai",)) for v in GENAI]
    out.append(Form("llama", "dynamo", ("int4g",)))
    return {f.name: f for f in out}


FORMS: dict[str, Form] = _forms()
FULL: tuple[str, ...] = tuple(FORMS)

#: the test suite's subset: every tool and every fused op family at least once, on few exports (a dynamo export
#: costs 5-10 s: one, Llama's; Whisper, exported by dynamo only and fusing what BERT and ViT fuse, is in FULL)
DEFAULT: tuple[str, ...] = (
    "bert-torchscript",
    "bert-torchscript-opt",  # EmbedLayerNormalization, Attention, SkipLayerNormalization, BiasGelu
    "bert-torchscript-opt-fp16",  # float16 compute behind float32 I/O
    "bert-torchscript-opt-fp16io",
    "bert-torchscript-qdyn",  # DynamicQuantizeLinear, MatMulInteger
    "bert-torchscript-qdq",
    "gpt2-torchscript-opt",  # FastGelu, SkipLayerNormalization
    "bert-torchscript-optimumO3",  # optimum's O3: opt_level 2, Gelu approximated (FastGelu), no EmbedLayerNormalization
    "llama-dynamo",
    "llama-dynamo-opt",  # SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization
    "llama-dynamo-fp16",
    "llama-dynamo-int4",  # MatMulNBits (symmetric)
    "llama-dynamo-int4a",  # MatMulNBits with zero points
    "llama-dynamo-int4acc4",  # MatMulNBits, accuracy_level 4
    "llama-genai-fp32",  # GroupQueryAttention with rotary inside
    "llama-genai-int4",
    "qwen2-genai-int4shared",  # GatherBlockQuantized
    "t5-torchscript-opt",
    "vit-torchscript-opt",
    "clip-torchscript-opt",  # QuickGelu
)


def why_unavailable(form: Form) -> str | None:
    """Why this machine cannot build `form` (a distribution it needs is not installed), None when it can."""
    for dist in ("transformers", *form.needs):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            return f"{form.name} needs {dist}: pip install {dist}"
    return None


def available(form: Form) -> bool:
    return why_unavailable(form) is None


# -- building and caching -------------------------------------------------------------------------------

_TOOLS = ("torch", "transformers", "onnx", "onnxruntime", "onnxruntime-gpu", "onnxscript", "onnxruntime-genai", "tokenizers")


def cache_key() -> str:
    """The versions of every tool that writes the corpus, and this file: any change rebuilds it."""
    parts = []
    for dist in _TOOLS:
        try:
            parts.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}=-")
    parts.append(hashlib.sha256(Path(__file__).read_bytes()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder of a form at a time across processes (xdist workers); others wait, then find it built."""
    try:
        import fcntl
    except ImportError:  # (not on Windows: two workers may build the same form; the rename keeps it whole)
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build(name: str, cache: Path) -> Path:
    """The file of form `name` (its folder holds any external data), built on first use with its parents."""
    form = FORMS[name]
    why = why_unavailable(form)
    if why:
        raise RuntimeError(why)
    root = Path(cache).resolve() / cache_key()  # (absolute: the tools run in their work folder)
    done = root / name / "model.onnx"
    if done.exists():
        return done
    parent = build(form.parent.name, cache) if form.parent is not None else None
    with _locked(root / f"{name}.lock"):
        if done.exists():
            return done
        work = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=root))
        try:
            arch = ARCHS[form.arch]
            # (in the work folder: onnxruntime's symbolic shape inference writes sym_shape_infer_temp.onnx into the cwd)
            with warnings.catch_warnings(), _quiet(), _cwd(work):
                warnings.simplefilter("ignore")  # the tools' own deprecation and tracer warnings
                if parent is None and form.source in GENAI:
                    _genai(arch, form.source, work)
                elif parent is None:
                    _export(arch, form.source, work / "model.onnx")
                else:
                    STEPS[form.steps[-1]](arch, parent, work / "model.onnx")
            _keep_inline(work / "model.onnx")
            os.replace(work, root / name)  # whole or not at all
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return done


def _keep_inline(path: Path) -> None:
    """The small models inline their weights (a dynamo export writes them aside by default); genai's builder's
    external data stays as it wrote it: that is what users ship."""
    if any(p.suffix == ".data" for p in path.parent.iterdir()) and (path.parent / "genai_config.json").exists():
        return
    m = onnx.load(str(path))
    for p in path.parent.iterdir():
        if p != path:
            p.unlink()
    onnx.save(m, str(path))


@contextlib.contextmanager
def _cwd(folder: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The tools log progress on stdout and through logging; a test run shows none of it."""
    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


# -- feeds ---------------------------------------------------------------------------------------------


def feeds(path: Path | str, *, batch: int = 1, seq: int = SEQ, past: int = 0, seed: int = 0) -> dict[str, torch.Tensor]:
    """Feeds for a corpus file: `models.transformer_feeds` with the corpus's vocabulary (its features and
    images drawn as the exports traced them)."""
    from pytest_ortdiff.models import transformer_feeds

    return transformer_feeds(path, batch=batch, sequence=seq, past=past, seed=seed, vocab=VOCAB)


def genai_config(path: Path | str) -> dict[str, Any] | None:
    cfg = Path(path).parent / "genai_config.json"
    return json.loads(cfg.read_text()) if cfg.exists() else None
