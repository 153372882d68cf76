"""random_feeds: seeded inputs for a model, shaped by its symbolic dims, in each input's value range;
transformer_feeds: the inputs of a transformers export or of a model onnxruntime's tools wrote, past included.

Builders store an input's sensible range in the model's metadata (`ortdiff.range.<input>` = "low,high").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
import torch

from ..numerics.dtypes import DType, dtype_of
from ..runtimes.ort import load_model

__all__ = ["random_feeds", "set_feed_range", "transformer_feeds"]

_PREFIX = "ortdiff.range."


def set_feed_range(model: onnx.ModelProto, name: str, low: float, high: float) -> None:
    """Record that input `name` takes values in [low, high) (what `random_feeds` draws)."""
    if not low < high:
        raise ValueError(f"feed range for {name!r} must have low < high, got [{low}, {high})")
    key = _PREFIX + name
    for p in model.metadata_props:
        if p.key == key:
            p.value = f"{low!r},{high!r}"
            return
    model.metadata_props.add(key=key, value=f"{low!r},{high!r}")


def _ranges(model: onnx.ModelProto) -> dict[str, tuple[float, float]]:
    out = {}
    for p in model.metadata_props:
        if p.key.startswith(_PREFIX):
            low, high = (float(x) for x in p.value.split(","))
            out[p.key[len(_PREFIX) :]] = (low, high)
    return out


def random_feeds(model: Any, *, dims: Mapping[str, int] | None = None, seed: int = 0, dtype: Any = None, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """A dict input name -> torch tensor for `model`.

    `dims` gives the symbolic dims (`{"a": 2, "b": 1024, "c": 1152}`); values are drawn uniformly in each
    input's recorded range (floats default to [-1, 1), ints to [0, 10)) with a seeded generator, in
    float32 then cast, so the float16 feeds are the float32 feeds rounded. `dtype` overrides the
    floating inputs' dtype.
    """
    m = load_model(model)
    dims = dict(dims or {})
    init_names = {i.name for i in m.graph.initializer}
    ranges = _ranges(m)
    gen = torch.Generator().manual_seed(seed)
    override = dtype_of(dtype) if dtype is not None else None
    feeds: dict[str, torch.Tensor] = {}
    needed: set[str] = set()
    for vi in m.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param and d.dim_param in dims:
                shape.append(int(dims[d.dim_param]))
            else:
                needed.add(d.dim_param or f"<unnamed dim of {vi.name}>")
        if needed:
            continue
        dt = DType(tt.elem_type)
        if override is not None and dt.is_floating_point:
            dt = override
        feeds[vi.name] = _draw(tuple(shape), dt, ranges.get(vi.name), gen).to(device)
    if needed:
        known = {d.dim_param for vi in m.graph.input if vi.name not in init_names for d in vi.type.tensor_type.shape.dim if d.dim_param}
        stray = sorted(set(dims) - known)
        also = f" ({', '.join(map(repr, stray))} {'is' if len(stray) == 1 else 'are'} not a dim of its inputs; theirs: {sorted(known)})" if stray else ""
        raise ValueError(f"random_feeds needs a value for the symbolic dims {sorted(needed)}; pass dims={{{', '.join(repr(n) + ': ...' for n in sorted(needed))}}}{also}")
    return feeds


def _draw(shape: tuple[int, ...], dt: DType, rng: tuple[float, float] | None, gen: torch.Generator) -> torch.Tensor:
    if dt == DType.BOOL:
        return torch.rand(shape, generator=gen) < 0.5
    if dt.is_floating_point:
        low, high = rng or (-1.0, 1.0)
        x = torch.rand(shape, generator=gen, dtype=torch.float64 if dt == DType.FLOAT64 else torch.float32)
        return (x * (high - low) + low).to(dt.torch)
    low, high = rng or (0, 10)
    return torch.randint(int(low), int(high), shape, generator=gen).to(dt.torch)


# -- transformers' inputs ---------------------------------------------------------------------------------

_PAST = re.compile(r"past", re.IGNORECASE)
_IDS = ("input_ids", "decoder_input_ids")
_EMBEDDERS = {"Gather": 0, "GatherBlockQuantized": 0, "EmbedLayerNormalization": 2, "QEmbedLayerNormalization": 2}


def transformer_feeds(
    model: Any,
    *,
    batch: int = 1,
    sequence: int = 8,
    past: int = 0,
    seed: int = 0,
    vocab: int | None = None,
    dims: Mapping[str, int] | None = None,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """Feeds for a transformer as the exporters and onnxruntime's tools write it (a torch.onnx export of a
    transformers model, onnxruntime.transformers' optimizer, onnxruntime-genai's model builder), its inputs
    recognized by name: `sequence` new tokens after `past` cached ones, as a decode step of onnxruntime-genai
    feeds them.

    - `input_ids` / `decoder_input_ids`: token ids drawn in [0, vocab): `vocab` defaults to the rows of the
      embedding that reads them (a Gather, GatherBlockQuantized or EmbedLayerNormalization);
    - `attention_mask`: ones over the past and the new tokens (`batch` x `past + sequence`);
    - `position_ids` (and `cache_position`): `past, ..., past + sequence - 1`; `token_type_ids`: zeros;
    - past key/values (an input whose name has "past": `past_key_values.0.key`, `past.0.value`, ...):
      values in [-1, 1) with `past` along the sequence axis (the axis named like "past_sequence_length", else
      axis 2 of [batch, heads, past, head_size]);
    - GroupQueryAttention's own inputs: `seqlens_k` = `past + sequence - 1` per batch row (int32, the index of
      the last token, not a length) and `total_sequence_length` = `past + sequence` (int32 scalar);
    - anything else as `random_feeds` draws it.

    A symbolic dim is resolved from `dims` first, then by its name (batch..., past..., total..., sequence...,
    and a sum of such names, optimum's "past_sequence_length + sequence_length"), then by the input it shapes; genai's `kv_cache_dim` (the head size) from the genai_config.json beside a
    model given by its path. A dim left unknown is an error naming it and `dims=`.
    """
    m = load_model(model)
    if batch < 1 or sequence < 1 or past < 0:
        raise ValueError(f"transformer_feeds: batch and sequence must be >= 1 and past >= 0, got batch={batch}, sequence={sequence}, past={past}")
    init = {i.name for i in m.graph.initializer}
    inputs = [vi for vi in m.graph.input if vi.name not in init]
    has_past = any(_PAST.search(vi.name) for vi in inputs)
    if past and not has_past:
        raise ValueError(
            f"transformer_feeds(past={past}): the model has no past key/value input (its inputs: {[vi.name for vi in inputs]}); "
            "export the decoder with its cache (or build it with onnxruntime-genai), or leave past=0"
        )
    total = past + sequence
    known: dict[str, int] = {}
    known.update(_genai_dims(model))
    known.update(dims or {})
    gen = torch.Generator().manual_seed(seed)
    ranges = _ranges(m)
    feeds: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for vi in inputs:
        name = vi.name
        tt = vi.type.tensor_type
        dt = DType(tt.elem_type)
        role = _role(name)
        shape: list[int] = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
                continue
            size = _dim(d.dim_param, role, axis, known, batch=batch, sequence=sequence, past=past, total=total)
            if size is None:
                unknown.append(f"{d.dim_param or '<unnamed>'} (axis {axis} of {name!r})")
                size = 1
            if d.dim_param:
                known.setdefault(d.dim_param, size)  # one value per name, as onnxruntime checks
            shape.append(size)
        if unknown:
            continue
        feeds[name] = _transformer_value(role, tuple(shape), dt, m, name, vocab, past, total, ranges.get(name), gen).to(device)
    if unknown:
        raise ValueError(f"transformer_feeds cannot size the symbolic dims {unknown}; pass dims={{name: size, ...}}")
    return feeds


def _role(name: str) -> str:
    low = name.lower()
    for role in ("seqlens_k", "total_sequence_length", "position_ids", "cache_position", "token_type_ids", "attention_mask"):
        if low == role or low.endswith("." + role) or low.endswith("_" + role):
            return role
    if low in _IDS:
        return "ids"
    if _PAST.search(name):
        return "past"
    return "other"


def _dim(param: str, role: str, axis: int, known: Mapping[str, int], *, batch: int, sequence: int, past: int, total: int) -> int | None:
    """The size of a symbolic dim: given, by its name, else by the role of the input it shapes."""
    if param in known:
        return int(known[param])
    if "+" in param:  # optimum's "past_sequence_length + sequence_length": the sum of its terms
        terms = [t.strip() for t in param.split("+")]
        sizes = [int(t) if t.isdigit() else _dim(t, role, axis, known, batch=batch, sequence=sequence, past=past, total=total) for t in terms]
        return None if any(x is None for x in sizes) else sum(x for x in sizes if x is not None)
    low = param.lower()
    if "batch" in low:
        return batch
    if "past" in low:
        return past
    if "total" in low:
        return total
    if "seq" in low or low in ("sequence", "sequence_length"):
        return total if role == "attention_mask" else sequence
    # unnamed, or a name an exporter made up (s0, s1, ...): what the axis means for this input
    if axis == 0 and role != "total_sequence_length":
        return batch
    if axis == 1 and role in ("ids", "position_ids", "token_type_ids"):
        return sequence
    if axis == 1 and role == "attention_mask":
        return total
    if axis == 2 and role == "past":
        return past
    return None


def _genai_dims(model: Any) -> dict[str, int]:
    """The dims onnxruntime-genai's builder leaves symbolic, from the genai_config.json it writes beside its model."""
    if not isinstance(model, str | Path):
        return {}
    cfg = Path(model).parent / "genai_config.json"
    if not cfg.exists():
        return {}
    decoder = json.loads(cfg.read_text()).get("model", {}).get("decoder", {})
    return {"kv_cache_dim": int(decoder["head_size"])} if "head_size" in decoder else {}


def _vocab(m: onnx.ModelProto, name: str) -> int | None:
    """Rows of the embedding table the token ids `name` index (the table an initializer, a Transpose of one: a
    tied embedding, or a DequantizeLinear of one: QDQ; the ids through Casts), else the last dim of a `logits`
    output; None when neither says."""
    shapes = {i.name: tuple(i.dims) for i in m.graph.initializer}
    names = {name}
    for node in m.graph.node:  # (graph order: what a node reads is made before it)
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    shapes[node.output[0]] = tuple(a.t.dims)
        elif node.op_type == "Transpose" and node.input[0] in shapes:
            dims = shapes[node.input[0]]
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(len(dims)))[::-1])
            shapes[node.output[0]] = tuple(dims[p] for p in perm)
        elif node.op_type == "Cast" and node.input and node.input[0] in names:
            names.add(node.output[0])
        elif node.op_type in ("DequantizeLinear", "Cast", "Identity") and node.input and node.input[0] in shapes:
            shapes[node.output[0]] = shapes[node.input[0]]  # (a QDQ model's table: int8, dequantized)
        at = _EMBEDDERS.get(node.op_type)
        if at is None:
            continue
        ids_at = 0 if node.op_type.endswith("EmbedLayerNormalization") else 1
        if len(node.input) > max(at, ids_at) and node.input[ids_at] in names and shapes.get(node.input[at]):
            return int(shapes[node.input[at]][0])
    for out in m.graph.output:
        dims = out.type.tensor_type.shape.dim
        if out.name == "logits" and dims and dims[-1].HasField("dim_value"):
            return int(dims[-1].dim_value)
    return None


def _transformer_value(role: str, shape: tuple[int, ...], dt: DType, m: onnx.ModelProto, name: str, vocab: int | None,
                       past: int, total: int, rng: tuple[float, float] | None, gen: torch.Generator) -> torch.Tensor:
    if role == "ids":
        rows = vocab if vocab is not None else _vocab(m, name)
        if rows is None:
            raise ValueError(f"transformer_feeds: the vocabulary of {name!r} is not read from an initializer the graph holds; pass vocab=")
        return torch.randint(0, rows, shape, generator=gen).to(dt.torch)
    if role == "attention_mask":
        return torch.ones(shape, dtype=dt.torch)
    if role == "token_type_ids":
        return torch.zeros(shape, dtype=dt.torch)
    if role in ("position_ids", "cache_position"):
        return torch.arange(past, total).expand(shape).to(dt.torch).contiguous()
    if role == "seqlens_k":
        return torch.full(shape, total - 1, dtype=dt.torch)  # the last token's index, as onnxruntime-genai feeds it
    if role == "total_sequence_length":
        return torch.full(shape, total, dtype=dt.torch)
    return _draw(shape, dt, rng, gen)
