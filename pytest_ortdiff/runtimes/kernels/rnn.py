"""Recurrent torch kernels (ONNX's rnn family): RNN, GRU and LSTM, every opset version and attribute.
float16/bfloat16 are computed in float32 and rounded once, as onnxruntime's CPU provider does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import onnx
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "GRU",
    "GRU3",
    "GRU7",
    "GRU14",
    "GRU22",
    "LSTM",
    "LSTM7",
    "LSTM14",
    "LSTM22",
    "RNN",
    "RNN7",
    "RNN14",
    "RNN22",
]

_ActFn = Callable[[torch.Tensor, float, float], torch.Tensor]


def _softplus(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    # log(1 + e^x) without overflow and without F.softplus's linear cut-off at 20 (the oracle needs better)
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


def _where_zero(cond: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(cond, x, torch.zeros((), dtype=x.dtype, device=x.device))


# lower-case name -> (spelling, function, takes alpha, takes beta, default alpha, default beta);
# None as a default: the corresponding ONNX operator has none (ScaledTanh).
_ACTIVATIONS: dict[str, tuple[str, _ActFn, bool, bool, float | None, float | None]] = {
    "relu": ("Relu", lambda x, a, b: torch.relu(x), False, False, 0.0, 0.0),
    "tanh": ("Tanh", lambda x, a, b: torch.tanh(x), False, False, 0.0, 0.0),
    "sigmoid": ("Sigmoid", lambda x, a, b: torch.sigmoid(x), False, False, 0.0, 0.0),
    "affine": ("Affine", lambda x, a, b: x * a + b, True, True, 1.0, 0.0),
    "leakyrelu": ("LeakyRelu", lambda x, a, b: torch.where(x >= 0, x, x * a), True, False, 0.01, 0.0),
    # `x > alpha` as the ThresholdedRelu operator (and onnxruntime) define it; the RNN docs write >=
    "thresholdedrelu": ("ThresholdedRelu", lambda x, a, b: _where_zero(x > a, x), True, False, 1.0, 0.0),
    "scaledtanh": ("ScaledTanh", lambda x, a, b: torch.tanh(x * b) * a, True, True, None, None),
    "hardsigmoid": ("HardSigmoid", lambda x, a, b: torch.clamp(x * a + b, 0.0, 1.0), True, True, 0.2, 0.5),
    "elu": ("Elu", lambda x, a, b: torch.where(x >= 0, x, torch.expm1(x) * a), True, False, 1.0, 0.0),
    "softsign": ("Softsign", lambda x, a, b: x / (1 + x.abs()), False, False, 0.0, 0.0),
    "softplus": ("Softplus", _softplus, False, False, 0.0, 0.0),
}


@dataclass(frozen=True)
class _Activation:
    """One activation function of the node with its alpha and beta resolved."""

    name: str
    alpha: float
    beta: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _ACTIVATIONS[self.name.lower()][1](x, self.alpha, self.beta)


class _PerDirection:
    """The activation in one role (f, g or h) for each direction: applied to a [directions, batch, hidden]
    tensor in one call when both directions use the same function, slice by slice otherwise."""

    def __init__(self, acts: Sequence[_Activation]) -> None:
        self.acts = tuple(acts)
        self.shared = all(a == self.acts[0] for a in self.acts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared:
            return self.acts[0](x)
        return torch.stack([act(x[d]) for d, act in enumerate(self.acts)])


def _lookup(op: str, name: str) -> tuple[str, _ActFn, bool, bool, float | None, float | None]:
    entry = _ACTIVATIONS.get(name.lower())
    if entry is None:
        known = ", ".join(e[0] for e in _ACTIVATIONS.values())
        raise UnsupportedVariantError(f"{op} with activation {name!r}: the spec's activations are {known}")
    return entry


def _resolved(op: str, name: str, alpha: float | None, beta: float | None) -> _Activation:
    spelling, _, _, _, default_alpha, default_beta = _lookup(op, name)
    alpha = default_alpha if alpha is None else alpha
    beta = default_beta if beta is None else beta
    if alpha is None or beta is None:
        raise UnsupportedVariantError(
            f"{op} with activation {spelling} and no activation_alpha/activation_beta for it: the "
            "ScaledTanh operator has no default alpha and beta; give both values explicitly"
        )
    return _Activation(spelling, float(alpha), float(beta))


def _consumed_in_order(op: str, names: Sequence[str], alphas: Sequence[float], betas: Sequence[float]) -> list[_Activation]:
    """Each activation that takes an alpha (a beta) takes the next value of the list."""
    next_alpha: Iterator[float] = iter(alphas)
    next_beta: Iterator[float] = iter(betas)
    acts = []
    for name in names:
        _, _, takes_alpha, takes_beta, _, _ = _lookup(op, name)
        alpha = next(next_alpha, None) if takes_alpha else None
        beta = next(next_beta, None) if takes_beta else None
        acts.append(_resolved(op, name, alpha, beta))
    return acts


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _Recurrent(Kernel):
    """What the three ops share: attribute parsing, layout, directions, sequence lengths, the time loop.

    One loop over time steps advances all directions at once; the input projection of every step is one
    matmul. float16/bfloat16 are computed in float32 and rounded once at the end, as onnxruntime's CPU provider
    does (it runs these ops in float32 between inserted Casts, bit for bit); float32 and float64 (the oracle)
    compute in their own type.

    Where the spec is silent or ambiguous, onnxruntime's CPU provider is followed and the choice said here:

    - `clip` bounds the pre-activations of the gates (LSTM i, f, c, o; GRU z, r, h; RNN's one), after bias and
      peephole terms; LSTM's cell state Ct and the input of h(Ct) are not clipped.
    - `activation_alpha`/`activation_beta` are consumed in order by the activations that take a value (Affine,
      LeakyRelu, ThresholdedRelu, ScaledTanh, HardSigmoid, Elu), the others skipped: onnxruntime's reading (for
      all three ops) and what the Keras converters write. A missing value takes the spec's default, "the same as
      of the corresponding ONNX operator": LeakyRelu 0.01, HardSigmoid 0.2/0.5, Elu 1 (as onnxruntime), and
      ThresholdedRelu 1, Affine 1/0 (where onnxruntime uses 0); ScaledTanh has none, so it needs explicit values.
    - `sequence_lens`: a reverse direction runs over each sequence's own valid steps, last to first; Y is zero past
      a sequence's length; Y_h/Y_c are the state after its last valid step, and zero for a sequence of length 0.
    - `output_sequence` (opsets 1-6) only said that Y may be omitted: Y is computed whenever the node names it.
    """

    n_gates = 1
    #: activations per direction and their defaults
    default_activations: tuple[str, ...] = ("Tanh",)
    #: the `layout` attribute exists from opset 14
    has_layout = False

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        op = node.op_type
        direction = self.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise UnsupportedVariantError(
                f"{op} with direction={direction!r}: the spec's directions are forward, reverse, bidirectional"
            )
        self.num_directions = 2 if direction == "bidirectional" else 1
        #: per direction: does it run last step first
        self.reversed = (False, True) if direction == "bidirectional" else (direction == "reverse",)
        hidden = self.attr("hidden_size")
        self.hidden_size = None if hidden is None else int(hidden)
        clip = self.attr("clip")
        if clip is not None and not float(clip) > 0:
            raise UnsupportedVariantError(
                f"{op} with clip={clip}: the clip threshold must be positive (leave the attribute out for no clipping)"
            )
        self.clip = None if clip is None else float(clip)
        self.layout = int(self.attr("layout", 0)) if self.has_layout else 0
        if self.layout not in (0, 1):
            raise UnsupportedVariantError(f"{op} with layout={self.layout}: the spec's layouts are 0 and 1")
        names = [a.decode() if isinstance(a, bytes) else str(a) for a in self.attr("activations", [])]
        per_dir = len(self.default_activations)
        if not names:
            names = list(self.default_activations) * self.num_directions
        elif op == "RNN" and self.num_directions == 1 and len(names) == 2:
            # RNN's schema default is ["Tanh", "Tanh"]; a one-direction RNN uses the first (as onnxruntime does)
            names = names[:1]
        if len(names) != per_dir * self.num_directions:
            raise ValueError(
                f"{op} with direction={direction!r} takes {per_dir * self.num_directions} activations "
                f"({per_dir} per direction), the node has {len(names)}: {names}"
            )
        alphas = [float(a) for a in self.attr("activation_alpha", [])]
        betas = [float(b) for b in self.attr("activation_beta", [])]
        acts = _consumed_in_order(op, names, alphas, betas)
        #: the activations by role (f, g, h as the spec names them), each over the directions
        self.roles = [_PerDirection(acts[role::per_dir]) for role in range(per_dir)]
        outputs = list(node.output)
        self.n_outputs = len(outputs)
        self.want_y = bool(outputs) and bool(outputs[0])

    # -- shared steps ----------------------------------------------------------------------------------
    def _inputs(
        self, inputs: Sequence[torch.Tensor | None], n_optional: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
        """X, W, R and the optional inputs (None where omitted, trailing ones included)."""
        x, w, r = (inputs[i] if i < len(inputs) else None for i in range(3))
        if x is None or w is None or r is None:
            raise ValueError(f"{self.node.op_type} needs its inputs X, W and R")
        optional = list(inputs[3:]) + [None] * (n_optional - len(inputs[3:]))
        return x, w, r, optional

    def _clip(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.clip is None else torch.clamp(x, -self.clip, self.clip)

    def _check(self, x: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> int:
        op, d, g = self.node.op_type, self.num_directions, self.n_gates
        if x.dim() != 3:
            raise ValueError(f"{op}: X must be 3-D, got shape {tuple(x.shape)}")
        hidden = r.shape[-1]
        if self.hidden_size is not None and self.hidden_size != hidden:
            raise ValueError(f"{op}: hidden_size={self.hidden_size} but R has shape {tuple(r.shape)}")
        if tuple(w.shape) != (d, g * hidden, x.shape[-1]) or tuple(r.shape) != (d, g * hidden, hidden):
            raise ValueError(
                f"{op} with {d} direction(s), {g} gate(s), hidden size {hidden}, input size {x.shape[-1]}: "
                f"W must have shape {(d, g * hidden, x.shape[-1])} and R {(d, g * hidden, hidden)}, "
                f"got {tuple(w.shape)} and {tuple(r.shape)}"
            )
        return int(hidden)

    def _state(self, value: torch.Tensor | None, batch: int, hidden: int, like: torch.Tensor) -> torch.Tensor:
        """initial_h / initial_c as [directions, batch, hidden] in the compute dtype (zeros when omitted)."""
        if value is None:
            return torch.zeros(self.num_directions, batch, hidden, dtype=like.dtype, device=like.device)
        if self.layout == 1:
            value = value.transpose(0, 1)
        if tuple(value.shape) != (self.num_directions, batch, hidden):
            # a [1, batch, hidden] state would broadcast over two directions: refuse it rather than guess
            want = (self.num_directions, batch, hidden) if self.layout == 0 else (batch, self.num_directions, hidden)
            raise ValueError(
                f"{self.node.op_type}: initial states must have shape {want} (layout={self.layout}), "
                f"got {tuple(value.transpose(0, 1).shape if self.layout == 1 else value.shape)}"
            )
        return value.to(like.dtype)

    def _project(
        self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, lens: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """X·Wᵀ (+ the biases that simply add) for every step and direction in one matmul, each reversed
        direction's steps put in the order it runs them: [seq, directions, batch, gates*hidden].
        Also returns the [seq, batch] validity mask and the per-sequence reversal index (None without lens)."""
        seq, batch, _ = x.shape
        xw = torch.matmul(x.reshape(1, seq * batch, x.shape[-1]), w.transpose(1, 2))  # [D, seq*batch, G*H]
        if bias is not None:
            xw = xw + bias.unsqueeze(1)
        xw = xw.view(self.num_directions, seq, batch, w.shape[1])
        valid = rev_index = None
        if lens is not None:
            steps = torch.arange(seq, device=x.device).unsqueeze(1)  # [seq, 1]
            valid = steps < lens.unsqueeze(0)  # [seq, batch]
            # a reversed direction reads step len-1-t at t within a sequence's length; padding stays put
            rev_index = torch.where(valid, lens.unsqueeze(0) - 1 - steps, steps)
        parts = []
        for d, rev in enumerate(self.reversed):
            part = xw[d]
            if rev:
                part = part.flip(0) if rev_index is None else self._reorder(part, rev_index)
            parts.append(part)
        return torch.stack(parts, dim=1), valid, rev_index

    @staticmethod
    def _reorder(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """t[index[s, b], b] for a [seq, batch, features] tensor (an involution for the reversal index)."""
        return t.gather(0, index.unsqueeze(-1).expand(-1, -1, t.shape[-1]))

    def _lengths(self, lens: torch.Tensor | None, seq: int, batch: int) -> torch.Tensor | None:
        if lens is None:
            return None
        lens = lens.to(torch.int64)
        if tuple(lens.shape) != (batch,):
            raise ValueError(f"{self.node.op_type}: sequence_lens must have shape ({batch},), got {tuple(lens.shape)}")
        if bool(((lens < 0) | (lens > seq)).any()):
            raise ValueError(
                f"{self.node.op_type}: sequence_lens must lie in [0, {seq}] (the sequence length of X), "
                f"got {lens.tolist()}"
            )
        return lens

    def _outputs(
        self,
        ys: list[torch.Tensor],
        finals: list[torch.Tensor],
        lens: torch.Tensor | None,
        rev_index: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, ...]:
        """Y from the per-step states (each reversed direction put back in time order), Y_h (and Y_c) from the
        final states, zero for empty sequences, all in the requested layout and the input's dtype."""
        out: list[torch.Tensor] = []
        if self.want_y:
            y = torch.stack(ys) if ys else finals[0].new_zeros((0, *finals[0].shape))  # [seq, D, batch, H]
            if any(self.reversed):
                dirs = []
                for d, rev in enumerate(self.reversed):
                    yd = y[:, d]
                    if rev:
                        yd = yd.flip(0) if rev_index is None else self._reorder(yd, rev_index)
                    dirs.append(yd)
                y = torch.stack(dirs, dim=1)
            out.append(y.permute(2, 0, 1, 3) if self.layout == 1 else y)
        else:
            out.append(torch.empty(0, dtype=dtype, device=finals[0].device))  # an omitted output, never read
        for state in finals:
            if lens is not None:
                state = _where_zero((lens > 0).view(1, -1, 1), state)
            out.append(state.transpose(0, 1) if self.layout == 1 else state)
        return tuple(o.to(dtype) for o in out[: self.n_outputs])

    @staticmethod
    def _keep(valid_t: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(state carried on, this step's output): past a sequence's end the state stays and the output is 0."""
        if valid_t is None:
            return new, new
        m = valid_t.view(1, -1, 1)
        return torch.where(m, new, old), _where_zero(m, new)


# -- RNN ----------------------------------------------------------------------------------------------


class _RNN(_Recurrent):
    n_gates = 1
    default_activations = ("Tanh",)

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        x, w, r, (b, sequence_lens, initial_h) = self._inputs(inputs, 3)
        out_dtype, cd = x.dtype, _compute_dtype(x.dtype)
        if self.layout == 1:
            x = x.transpose(0, 1)
        hidden = self._check(x, w, r)
        seq, batch, _ = x.shape
        x, w, r = x.to(cd), w.to(cd), r.to(cd)
        bias = None if b is None else b[:, :hidden].to(cd) + b[:, hidden:].to(cd)
        lens = self._lengths(sequence_lens, seq, batch)
        xw, valid, rev_index = self._project(x, w, bias, lens)
        rt = r.transpose(1, 2)
        h = self._state(initial_h, batch, hidden, x)
        f = self.roles[0]
        ys = []
        for t in range(seq):
            new = f(self._clip(xw[t] + torch.bmm(h, rt)))
            h, y = self._keep(None if valid is None else valid[t], new, h)
            if self.want_y:
                ys.append(y)
        return self._outputs(ys, [h], lens, rev_index, out_dtype)


@kernel("RNN", since=1)
class RNN(_RNN):
    """Opsets 1-6 (the `output_sequence` attribute, which only allowed Y to be omitted)."""


@kernel("RNN", since=7)
class RNN7(_RNN):
    """Opsets 7-13."""


@kernel("RNN", since=14)
class RNN14(_RNN):
    """Opsets 14-21: `layout` (1 = batch first)."""

    has_layout = True


@kernel("RNN", since=22)
class RNN22(RNN14):
    """Opset 22: bfloat16 admitted (computed in float32)."""


# -- GRU ----------------------------------------------------------------------------------------------


class _GRU(_Recurrent):
    n_gates = 3
    default_activations = ("Sigmoid", "Tanh")
    has_linear_before_reset = True

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        lbr = int(self.attr("linear_before_reset", 0)) if self.has_linear_before_reset else 0
        self.linear_before_reset = lbr != 0

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        x, w, r, (b, sequence_lens, initial_h) = self._inputs(inputs, 3)
        out_dtype, cd = x.dtype, _compute_dtype(x.dtype)
        if self.layout == 1:
            x = x.transpose(0, 1)
        hidden = self._check(x, w, r)
        seq, batch, _ = x.shape
        x, w, r = x.to(cd), w.to(cd), r.to(cd)
        h2 = 2 * hidden
        lbr = self.linear_before_reset
        bias = rbh = None
        if b is not None:
            b = b.to(cd)
            wb, rb = b[:, : 3 * hidden], b[:, 3 * hidden :]
            if lbr:
                # Rbh sits inside the reset gate's product: only Wb[zrh] and Rb[zr] add to X·Wᵀ
                bias = wb + torch.cat([rb[:, :h2], torch.zeros_like(rb[:, h2:])], dim=1)
                rbh = rb[:, h2:].unsqueeze(1)
            else:
                bias = wb + rb
        lens = self._lengths(sequence_lens, seq, batch)
        xw, valid, rev_index = self._project(x, w, bias, lens)
        rt = r.transpose(1, 2)  # [D, H, 3H]
        rt_zr, rt_h = rt[:, :, :h2], rt[:, :, h2:]
        h = self._state(initial_h, batch, hidden, x)
        f, g = self.roles
        ys = []
        for t in range(seq):
            xt = xw[t]
            if lbr:
                hr = torch.bmm(h, rt)
                zr = f(self._clip(xt[..., :h2] + hr[..., :h2]))
                z, rg = zr[..., :hidden], zr[..., hidden:]
                hh = hr[..., h2:] if rbh is None else hr[..., h2:] + rbh
                ht = g(self._clip(xt[..., h2:] + rg * hh))
            else:
                zr = f(self._clip(xt[..., :h2] + torch.bmm(h, rt_zr)))
                z, rg = zr[..., :hidden], zr[..., hidden:]
                ht = g(self._clip(xt[..., h2:] + torch.bmm(rg * h, rt_h)))
            new = (1 - z) * ht + z * h
            h, y = self._keep(None if valid is None else valid[t], new, h)
            if self.want_y:
                ys.append(y)
        return self._outputs(ys, [h], lens, rev_index, out_dtype)


@kernel("GRU", since=1)
class GRU(_GRU):
    """Opsets 1-2: no `linear_before_reset` (always 0); `output_sequence` only allowed Y to be omitted.
    Its equations write Ht-1*R where later versions write Ht-1*(R^T); every implementation (onnx.reference
    included) reads R transposed, as here."""

    has_linear_before_reset = False


@kernel("GRU", since=3)
class GRU3(_GRU):
    """Opsets 3-6: `linear_before_reset`."""


@kernel("GRU", since=7)
class GRU7(_GRU):
    """Opsets 7-13."""


@kernel("GRU", since=14)
class GRU14(_GRU):
    """Opsets 14-21: `layout` (1 = batch first)."""

    has_layout = True


@kernel("GRU", since=22)
class GRU22(GRU14):
    """Opset 22: bfloat16 admitted (computed in float32)."""


# -- LSTM ---------------------------------------------------------------------------------------------


class _LSTM(_Recurrent):
    n_gates = 4
    default_activations = ("Sigmoid", "Tanh", "Tanh")

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.input_forget = int(self.attr("input_forget", 0)) != 0

    def run(self, *inputs: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        x, w, r, (b, sequence_lens, initial_h, initial_c, p) = self._inputs(inputs, 5)
        out_dtype, cd = x.dtype, _compute_dtype(x.dtype)
        if self.layout == 1:
            x = x.transpose(0, 1)
        hidden = self._check(x, w, r)
        seq, batch, _ = x.shape
        x, w, r = x.to(cd), w.to(cd), r.to(cd)
        bias = None if b is None else b[:, : 4 * hidden].to(cd) + b[:, 4 * hidden :].to(cd)
        lens = self._lengths(sequence_lens, seq, batch)
        xw, valid, rev_index = self._project(x, w, bias, lens)
        rt = r.transpose(1, 2)
        h = self._state(initial_h, batch, hidden, x)
        c = self._state(initial_c, batch, hidden, x)
        if p is not None:
            # P[iof]: one [D, 1, H] vector per gate, broadcast over the batch
            p_i, p_o, p_f = p.to(cd).unsqueeze(1).split(hidden, dim=-1)
        f, g, hact = self.roles
        ys = []
        for t in range(seq):
            gates = xw[t] + torch.bmm(h, rt)
            i, o, fg, cg = gates.split(hidden, dim=-1)  # the spec's gate order: i, o, f, c
            if p is not None:
                i = i + p_i * c
            i = f(self._clip(i))
            if self.input_forget:
                fg = 1 - i
            else:
                if p is not None:
                    fg = fg + p_f * c
                fg = f(self._clip(fg))
            c_new = fg * c + i * g(self._clip(cg))
            if p is not None:
                o = o + p_o * c_new
            h_new = f(self._clip(o)) * hact(c_new)
            valid_t = None if valid is None else valid[t]
            c, _ = self._keep(valid_t, c_new, c)
            h, y = self._keep(valid_t, h_new, h)
            if self.want_y:
                ys.append(y)
        return self._outputs(ys, [h, c], lens, rev_index, out_dtype)


@kernel("LSTM", since=1)
class LSTM(_LSTM):
    """Opsets 1-6 (the `output_sequence` attribute, which only allowed Y to be omitted)."""


@kernel("LSTM", since=7)
class LSTM7(_LSTM):
    """Opsets 7-13."""


@kernel("LSTM", since=14)
class LSTM14(_LSTM):
    """Opsets 14-21: `layout` (1 = batch first)."""

    has_layout = True


@kernel("LSTM", since=22)
class LSTM22(LSTM14):
    """Opset 22: bfloat16 admitted (computed in float32)."""
