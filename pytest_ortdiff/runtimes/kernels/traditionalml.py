"""Kernels of ONNX's traditionalml family (domain ai.onnx.ml) on numeric tensors: feature extraction,
tree ensembles (walked in lock-step over the batch) and label encoding; string variants are refused by name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx
import onnx.numpy_helper
import torch

from .base import Kernel, KernelContext, UnsupportedVariantError, kernel

__all__ = [
    "ArrayFeatureExtractor",
    "Binarizer",
    "LabelEncoder",
    "LabelEncoder1",
    "TreeEnsemble",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
]

_DOMAIN = "ai.onnx.ml"


@kernel("ArrayFeatureExtractor", since=1, domain=_DOMAIN)
class ArrayFeatureExtractor(Kernel):
    """X[..., indices] along the last axis, indices flattened; a 1-D X gives a [1, n] matrix, as
    onnxruntime's kernel does."""

    def run(self, x: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        idx = indices.reshape(-1).to(torch.int64)
        out = torch.index_select(x, -1, idx)
        shape = (1, idx.numel()) if x.dim() == 1 else (*x.shape[:-1], idx.numel())
        return (out.reshape(shape),)


@kernel("Binarizer", since=1, domain=_DOMAIN)
class Binarizer(Kernel):
    """1 where x > threshold, 0 elsewhere, in x's dtype."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.threshold = float(self.attr("threshold", 0.0))

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return ((x > self.threshold).to(x.dtype),)


# ---------------------------------------------------------------------------------------------------
# Tree ensembles: every tree walked for every sample in lock-step, one step per tree level
# ---------------------------------------------------------------------------------------------------

# node comparison codes: the unified op's enumeration, LEAF added for the legacy ops' leaves
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER, _LEAF = range(8)
_LEGACY_MODES = {
    "BRANCH_LEQ": _LEQ, "BRANCH_LT": _LT, "BRANCH_GTE": _GTE, "BRANCH_GT": _GT,
    "BRANCH_EQ": _EQ, "BRANCH_NEQ": _NEQ, "LEAF": _LEAF,
}  # fmt: skip
_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")


@dataclass
class _Forest:
    """Trees flattened into one index space of positions (interior nodes and leaves), each leaf
    pointing at itself so that extra walking steps are harmless; leaf values dense per target."""

    feature: list[int] = field(default_factory=list)
    split: list[float] = field(default_factory=list)
    mode: list[int] = field(default_factory=list)
    true_next: list[int] = field(default_factory=list)
    false_next: list[int] = field(default_factory=list)
    missing_true: list[bool] = field(default_factory=list)
    members: dict[int, list[float]] = field(default_factory=dict)
    roots: list[int] = field(default_factory=list)
    # position -> [(target, weight)]
    leaf_values: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    def add(self, feature: int, split: float, mode: int, missing_true: bool) -> int:
        self.feature.append(feature)
        self.split.append(split)
        self.mode.append(mode)
        self.true_next.append(len(self.mode) - 1)
        self.false_next.append(len(self.mode) - 1)
        self.missing_true.append(missing_true)
        return len(self.mode) - 1

    def depth(self) -> int:
        """The longest root-to-leaf path: how many lock-step moves reach every leaf."""
        best = 0
        for root in self.roots:
            frontier, steps, seen = {root}, 0, set[int]()
            while True:
                nxt = {
                    c
                    for p in frontier
                    if self.mode[p] != _LEAF
                    for c in (self.true_next[p], self.false_next[p])
                }
                if not nxt:
                    break
                if nxt <= seen:
                    raise ValueError("tree ensemble: a tree has a cycle")
                seen |= nxt
                frontier, steps = nxt, steps + 1
            best = max(best, steps)
        return best


class _TreeWalker:
    """The forest as tensors on the device: `leaves(x)` gives each sample's leaf position in every tree,
    `aggregate` folds the leaves' values per target (onnxruntime's semantics: a target no leaf reaches
    scores 0 under MIN/MAX too, and a NaN feature follows the true branch only where tracked)."""

    def __init__(self, forest: _Forest, n_targets: int, aggregate: str, ctx: KernelContext) -> None:
        dev = ctx.device
        self.n_trees = len(forest.roots)
        self.depth = forest.depth()
        self.aggregate = aggregate
        self.feature = torch.tensor(forest.feature, dtype=torch.int64, device=dev)
        self.split = torch.tensor(forest.split, dtype=torch.float64, device=dev)
        self.mode = torch.tensor(forest.mode, dtype=torch.int64, device=dev)
        self.true_next = torch.tensor(forest.true_next, dtype=torch.int64, device=dev)
        self.false_next = torch.tensor(forest.false_next, dtype=torch.int64, device=dev)
        self.missing_true = torch.tensor(forest.missing_true, dtype=torch.bool, device=dev)
        self.roots = torch.tensor(forest.roots, dtype=torch.int64, device=dev)
        self.members: torch.Tensor | None = None
        if forest.members:
            width = max(len(v) for v in forest.members.values())
            m = torch.full((len(forest.mode), max(width, 1)), float("nan"), dtype=torch.float64)
            for pos, vals in forest.members.items():
                m[pos, : len(vals)] = torch.tensor(vals, dtype=torch.float64)
            self.members = m.to(dev)
        n_pos = len(forest.mode)
        fill = {"MIN": float("inf"), "MAX": float("-inf")}.get(aggregate, 0.0)
        values = torch.full((n_pos, n_targets), fill, dtype=torch.float64)
        has = torch.zeros((n_pos, n_targets), dtype=torch.bool)
        for pos, entries in forest.leaf_values.items():
            for target, weight in entries:
                if not 0 <= target < n_targets:
                    raise ValueError(
                        f"tree ensemble: a leaf's target id {target} is not in [0, {n_targets})"
                    )
                old = values[pos, target].item()
                # several weights of one leaf for one target combine as the aggregate does
                values[pos, target] = (
                    min(old, weight)
                    if aggregate == "MIN"
                    else max(old, weight)
                    if aggregate == "MAX"
                    else old + weight
                )
                has[pos, target] = True
        self.values = values.to(dev)
        self.has = has.to(dev)

    def leaves(self, x: torch.Tensor) -> torch.Tensor:
        """[N, n_trees] leaf positions of the samples of x ([N, F], the compute dtype)."""
        n = x.shape[0]
        split = self.split.to(x.dtype)
        members = self.members.to(x.dtype) if self.members is not None else None
        idx = self.roots.unsqueeze(0).expand(n, -1)
        for _ in range(self.depth):
            xv = torch.gather(x, 1, self.feature[idx])
            th = split[idx]
            mode = self.mode[idx]
            cond = torch.where(mode == _LEQ, xv <= th, xv < th)
            cond = torch.where(mode == _GTE, xv >= th, cond)
            cond = torch.where(mode == _GT, xv > th, cond)
            cond = torch.where(mode == _EQ, xv == th, cond)
            cond = torch.where(mode == _NEQ, xv != th, cond)
            if members is not None:
                cond = torch.where(
                    mode == _MEMBER, (xv.unsqueeze(-1) == members[idx]).any(-1), cond
                )
            cond = cond | (self.missing_true[idx] & torch.isnan(xv))
            idx = torch.where(cond, self.true_next[idx], self.false_next[idx])
        return idx

    def aggregate_leaves(
        self, idx: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample per-target scores [N, K] and whether any leaf reached the target [N, K]."""
        values = self.values.to(dtype)[idx]  # [N, T, K]
        has = self.has[idx]
        reached = has.any(1)
        if self.aggregate in ("SUM", "AVERAGE"):
            scores = values.sum(1)
        elif self.aggregate == "MIN":
            scores = values.amin(1)
        else:
            scores = values.amax(1)
        scores = torch.where(reached, scores, torch.zeros((), dtype=dtype, device=scores.device))
        if self.aggregate == "AVERAGE":
            scores = scores / self.n_trees
        return scores, reached


def _probit(v: torch.Tensor) -> torch.Tensor:
    """sqrt(2) * erfinv(2v - 1) with the closed-form erfinv approximation (Winitzki's, a = 0.147)
    that onnxruntime and onnx.reference both use: torch.erfinv would be exact, and differ from both."""
    x = 2 * v - 1
    sgn = torch.where(x < 0, -1.0, 1.0).to(v.dtype)
    ln = torch.log((1 - x) * (1 + x))
    a = 2 / (3.14159 * 0.147) + 0.5 * ln
    b = ln / 0.147
    return 1.41421356 * sgn * torch.sqrt(-a + torch.sqrt(a * a - b))


def _post_transform(scores: torch.Tensor, name: str) -> torch.Tensor:
    """onnxruntime's post transforms over the last axis of [N, K] scores."""
    if name == "NONE":
        return scores
    if name == "LOGISTIC":
        return torch.sigmoid(scores)
    if name == "SOFTMAX":
        return torch.softmax(scores, dim=-1)
    if name == "SOFTMAX_ZERO":
        # zeros (|v| <= 1e-7) are "no score": they stay ~0 and leave the normalising sum alone
        vmax = scores.amax(-1, keepdim=True)
        live = scores.abs() > 1e-7
        e = torch.where(live, torch.exp(scores - vmax), scores * torch.exp(-vmax))
        return e / torch.where(live, e, 0).sum(-1, keepdim=True)
    if name == "PROBIT":
        return _probit(scores)
    raise UnsupportedVariantError(f"post_transform={name!r}; known: {', '.join(_TRANSFORMS)}")


def _compute_dtype(x: torch.Tensor, ctx: KernelContext) -> torch.dtype:
    """float64 for double inputs and in the oracle, float32 otherwise (halves and integers upcast
    exactly, as onnxruntime compares them against float thresholds)."""
    if x.dtype == torch.float64:
        return torch.float64
    return ctx.torch_dtype(onnx.TensorProto.FLOAT)


def _as_matrix(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    x = x.to(dtype)
    return x.reshape(1, -1) if x.dim() == 1 else x.reshape(x.shape[0], -1)


def _tensor_attr(kernel: Kernel, name: str) -> list[float] | None:
    value = kernel.attrs.get(name)
    if value is None:
        return None
    return [float(v) for v in onnx.numpy_helper.to_array(value).reshape(-1)]


@kernel("TreeEnsemble", since=5, domain=_DOMAIN)
class TreeEnsemble(Kernel):
    """The unified tree op: nodes_* for interior nodes, leaf_* for leaves, trees from tree_roots."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        agg, post = int(self.attr("aggregate_function", 1)), int(self.attr("post_transform", 0))
        if not 0 <= agg < len(_AGGREGATES):
            raise UnsupportedVariantError(
                f"TreeEnsemble aggregate_function={agg}; known: 0-3 ({', '.join(_AGGREGATES)})"
            )
        if not 0 <= post < len(_TRANSFORMS):
            raise UnsupportedVariantError(
                f"TreeEnsemble post_transform={post}; known: 0-4 ({', '.join(_TRANSFORMS)})"
            )
        self.post = _TRANSFORMS[post]
        features = list(self.attr("nodes_featureids"))
        modes = [int(m) for m in _tensor_attr(self, "nodes_modes") or []]
        splits = _tensor_attr(self, "nodes_splits") or [0.0] * len(modes)
        true_ids, false_ids = (
            list(self.attr("nodes_truenodeids")),
            list(self.attr("nodes_falsenodeids")),
        )
        true_leaf, false_leaf = (
            list(self.attr("nodes_trueleafs")),
            list(self.attr("nodes_falseleafs")),
        )
        missing = list(self.attr("nodes_missing_value_tracks_true", [0] * len(modes)))
        weights = _tensor_attr(self, "leaf_weights") or []
        targets = list(self.attr("leaf_targetids"))
        members = _tensor_attr(self, "membership_values") or []
        self.n_targets = int(self.attr("n_targets", max(targets, default=0) + 1))
        n_nodes = len(modes)
        forest = _Forest()
        for i in range(n_nodes):
            if not 0 <= modes[i] <= _MEMBER:
                raise UnsupportedVariantError(
                    f"TreeEnsemble nodes_modes value {modes[i]}; known: 0-6"
                )
            forest.add(features[i], splits[i], modes[i], bool(missing[i]))
        for j, (w, t) in enumerate(zip(weights, targets, strict=True)):
            pos = forest.add(0, 0.0, _LEAF, False)
            forest.leaf_values[pos] = [(t, w)]
            assert pos == n_nodes + j
        for i in range(n_nodes):
            forest.true_next[i] = true_ids[i] + (n_nodes if true_leaf[i] else 0)
            forest.false_next[i] = false_ids[i] + (n_nodes if false_leaf[i] else 0)
        # membership sets, NaN-delimited, in the order the MEMBER nodes appear
        member_nodes = [i for i in range(n_nodes) if modes[i] == _MEMBER]
        groups: list[list[float]] = [[]]
        for v in members:
            if math.isnan(v):
                groups.append([])
            else:
                groups[-1].append(v)
        for k, i in enumerate(member_nodes):
            if k >= len(groups):
                raise ValueError(
                    "TreeEnsemble: membership_values has fewer NaN-delimited sets than BRANCH_MEMBER nodes"
                )
            forest.members[i] = groups[k]
        forest.roots = list(self.attr("tree_roots"))
        self.walker = _TreeWalker(forest, self.n_targets, _AGGREGATES[agg], ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        xm = _as_matrix(x, dtype)
        scores, _ = self.walker.aggregate_leaves(self.walker.leaves(xm), dtype)
        out_dtype = x.dtype if self.ctx.compute_dtype is None else self.ctx.compute_dtype
        return (_post_transform(scores, self.post).to(out_dtype),)


def _legacy_forest(kernel: Kernel, prefix: str) -> _Forest:
    """The legacy ops' (tree id, node id) addressed nodes, with leaf weights from `prefix`_* attributes
    (target_* for the regressor, class_* for the classifier)."""
    tree_ids = list(kernel.attr("nodes_treeids", []))
    node_ids = list(kernel.attr("nodes_nodeids", []))
    modes = [m.decode() if isinstance(m, bytes) else m for m in kernel.attr("nodes_modes", [])]
    values = _tensor_attr(kernel, "nodes_values_as_tensor") or list(
        kernel.attr("nodes_values", [0.0] * len(modes))
    )
    features = list(kernel.attr("nodes_featureids", [0] * len(modes)))
    true_ids, false_ids = (
        list(kernel.attr("nodes_truenodeids", [])),
        list(kernel.attr("nodes_falsenodeids", [])),
    )
    missing = list(kernel.attr("nodes_missing_value_tracks_true", [0] * len(modes)))
    forest = _Forest()
    position: dict[tuple[int, int], int] = {}
    for i, mode in enumerate(modes):
        if mode not in _LEGACY_MODES:
            raise UnsupportedVariantError(
                f"{kernel.op_type} nodes_modes {mode!r}; known: {', '.join(_LEGACY_MODES)}"
            )
        position[tree_ids[i], node_ids[i]] = forest.add(
            features[i], float(values[i]), _LEGACY_MODES[mode], bool(missing[i])
        )
    for i, mode in enumerate(modes):
        if mode != "LEAF":
            forest.true_next[i] = position[tree_ids[i], true_ids[i]]
            forest.false_next[i] = position[tree_ids[i], false_ids[i]]
    first: dict[int, int] = {}
    for i, t in enumerate(tree_ids):
        first.setdefault(t, i)
    forest.roots = [first[t] for t in sorted(first)]
    weights = _tensor_attr(kernel, f"{prefix}_weights_as_tensor") or list(
        kernel.attr(f"{prefix}_weights", [])
    )
    ids = list(kernel.attr(f"{prefix}_ids", []))
    w_trees, w_nodes = (
        list(kernel.attr(f"{prefix}_treeids", [])),
        list(kernel.attr(f"{prefix}_nodeids", [])),
    )
    for t, n, k, w in zip(w_trees, w_nodes, ids, weights, strict=True):
        forest.leaf_values.setdefault(position[t, n], []).append((k, float(w)))
    return forest


def _base_values(kernel: Kernel) -> list[float]:
    return _tensor_attr(kernel, "base_values_as_tensor") or [
        float(v) for v in kernel.attr("base_values", [])
    ]


@kernel("TreeEnsembleRegressor", since=1, domain=_DOMAIN)
class TreeEnsembleRegressor(Kernel):
    """The legacy regressor (skl2onnx's output for sklearn trees, forests and gradient boosting):
    aggregate over trees, then base_values, then post_transform — onnxruntime's semantics."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        self.n_targets = int(self.attr("n_targets", 1))
        aggregate = self.attr("aggregate_function", "SUM")
        self.post = self.attr("post_transform", "NONE")
        if aggregate not in _AGGREGATES:
            raise UnsupportedVariantError(
                f"{self.op_type} aggregate_function={aggregate!r}; known: {', '.join(_AGGREGATES)}"
            )
        if self.post not in _TRANSFORMS:
            raise UnsupportedVariantError(
                f"{self.op_type} post_transform={self.post!r}; known: {', '.join(_TRANSFORMS)}"
            )
        if self.n_targets == 1 and self.post not in ("NONE", "PROBIT"):
            # onnxruntime ignores it for one target and onnx.reference refuses it: no agreed answer
            raise UnsupportedVariantError(
                f"{self.op_type} with n_targets=1 and post_transform={self.post!r}: onnxruntime ignores the "
                "transform for a single target, so the torch evaluator refuses it; run it with kernels={...: 'ort'}"
            )
        self.base = _base_values(self)
        self.walker = _TreeWalker(_legacy_forest(self, "target"), self.n_targets, aggregate, ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dtype = _compute_dtype(x, self.ctx)
        scores, _ = self.walker.aggregate_leaves(self.walker.leaves(_as_matrix(x, dtype)), dtype)
        # one target: a single base value is its origin; several: base values only when one per target
        if len(self.base) == self.n_targets or (self.n_targets == 1 and len(self.base) == 1):
            scores = scores + torch.tensor(self.base, dtype=dtype, device=scores.device)
        out = _post_transform(scores, self.post)
        return (out.to(self.ctx.torch_dtype(onnx.TensorProto.FLOAT)),)


@kernel("TreeEnsembleClassifier", since=1, domain=_DOMAIN)
class TreeEnsembleClassifier(Kernel):
    """The legacy classifier: summed class votes plus base_values, post_transform, and the top class's
    int64 label; two classes voted through one class id (gradient boosting's encoding) follow
    onnxruntime's conventions (one score completed into two, a 0.5 or 0 threshold)."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        if self.attrs.get("classlabels_strings"):
            raise UnsupportedVariantError(
                f"{self.op_type} classlabels_strings: string labels, which torch cannot hold; "
                "run it with kernels={...: 'ort'}"
            )
        self.labels = [int(v) for v in self.attr("classlabels_int64s", [])]
        if len(self.labels) < 2:
            raise UnsupportedVariantError(
                f"{self.op_type} with {len(self.labels)} class label(s): at least 2 are supported"
            )
        self.post = self.attr("post_transform", "NONE")
        if self.post not in _TRANSFORMS:
            raise UnsupportedVariantError(
                f"{self.op_type} post_transform={self.post!r}; known: {', '.join(_TRANSFORMS)}"
            )
        self.base = _base_values(self)
        forest = _legacy_forest(self, "class")
        ids = list(self.attr("class_ids", []))
        weights = _tensor_attr(self, "class_weights_as_tensor") or list(
            self.attr("class_weights", [])
        )
        self.binary_case = len(self.labels) == 2 and len(set(ids)) == 1
        self.all_positive = all(w >= 0 for w in weights)
        if self.binary_case and len(self.base) == 2:
            # onnxruntime then drops the votes (score = base[1] + the unvoted class's score) and
            # onnx.reference mirrors one column: no agreed answer
            raise UnsupportedVariantError(
                f"{self.op_type} with two classes, votes for one class only and two base_values: onnxruntime "
                "and onnx.reference disagree on its scores; run it with kernels={...: 'ort'}"
            )
        if self.binary_case and self.post == "PROBIT":
            leaves = [p for p, m in enumerate(forest.mode) if m == _LEAF]
            if any(all(k != 1 for k, _ in forest.leaf_values.get(p, [])) for p in leaves):
                raise UnsupportedVariantError(
                    f"{self.op_type} with two classes, votes for class 0 only and post_transform='PROBIT': "
                    "onnxruntime leaves the second score undefined; run it with kernels={...: 'ort'}"
                )
        self.walker = _TreeWalker(forest, len(self.labels), "SUM", ctx)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dtype = _compute_dtype(x, self.ctx)
        s, has = self.walker.aggregate_leaves(self.walker.leaves(_as_matrix(x, dtype)), dtype)
        labels = torch.tensor(self.labels, dtype=torch.int64, device=s.device)
        if self.binary_case:
            y, z = self._binary(s, has, labels)
        else:
            y, z = self._multiclass(s, labels)
        return y, z.to(self.ctx.torch_dtype(onnx.TensorProto.FLOAT))

    def _multiclass(
        self, s: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self.labels) == 2:
            # votes for both of two classes: the spec's reading (votes + base_values, top class's label),
            # as onnx.reference computes it; onnxruntime instead labels 1 whenever class 1's score is > 0
            # and, with two base_values, scores [-(base[1] + votes[0]), base[1] + votes[0]]
            if self.base:
                s = s + torch.tensor(self.base, dtype=s.dtype, device=s.device)
            z = _post_transform(s, self.post)
            return labels[z.argmax(1)], z
        if self.base:
            base = torch.zeros(s.shape[1], dtype=s.dtype, device=s.device)
            base[: len(self.base)] = torch.tensor(self.base, dtype=s.dtype, device=s.device)
            s = s + base
        # the top class among all (an unvoted class scores 0, as in Z and onnx.reference; onnxruntime
        # skips unvoted classes), the first on ties
        return labels[s.argmax(1)], _post_transform(s, self.post)

    def _binary(
        self, s: torch.Tensor, has: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s0, s1, h1 = s[:, 0], s[:, 1], has[:, 1]
        two = h1
        if len(self.base) == 1:
            p0, p1 = s0 + self.base[0], s1
        else:
            p0, p1 = s0, s1
        pos = torch.where(two, p1, p0)
        y = torch.where(pos > (0.5 if self.all_positive else 0.0), labels[1], labels[0])
        both = _post_transform(torch.stack([p0, p1], 1), self.post)
        # one score completed into two: 1 - p for all-positive votes, +-p (logistic of each) otherwise
        if self.all_positive:
            single = torch.stack([1 - p0, p0], 1)
        elif self.post == "LOGISTIC":
            single = torch.stack([torch.sigmoid(-p0), torch.sigmoid(p0)], 1)
        else:
            single = torch.stack([-p0, p0], 1)
        if not self.all_positive and self.post not in ("NONE", "LOGISTIC"):
            single = _post_transform(single, self.post)
        return y, torch.where(two.unsqueeze(1), both, single)


# ---------------------------------------------------------------------------------------------------
# LabelEncoder: a lookup in sorted keys
# ---------------------------------------------------------------------------------------------------

_FLOAT = onnx.TensorProto.FLOAT
_INT64 = onnx.TensorProto.INT64


@kernel("LabelEncoder", since=1, domain=_DOMAIN)
class LabelEncoder1(Kernel):
    """Version 1 maps strings to int64 and back: always a string side, which torch cannot hold."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        raise UnsupportedVariantError(
            "LabelEncoder-1 maps strings (classes_strings): torch has no string tensors; "
            "run it with kernels={...: 'ort'}"
        )


@kernel("LabelEncoder", since=2, domain=_DOMAIN)
class LabelEncoder(Kernel):
    """keys_* -> values_* (numeric: int64 and float, any tensor type from version 4 on), default_* for
    a key not listed; a NaN key matches nothing (IEEE equality, as onnxruntime compares). String keys or values are refused by name."""

    def __init__(self, node: onnx.NodeProto, ctx: KernelContext) -> None:
        super().__init__(node, ctx)
        for side in ("keys", "values"):
            if (
                self.attrs.get(f"{side}_strings")
                or self._tensor_type(f"{side}_tensor") == onnx.TensorProto.STRING
            ):
                raise UnsupportedVariantError(
                    f"LabelEncoder {side}_strings: string {side}, which torch cannot hold; run it with kernels={{...: 'ort'}}"
                )
        keys, _ = self._side("keys")
        values, value_type = self._side("values")
        if keys.numel() != values.numel():
            raise ValueError(f"LabelEncoder: {keys.numel()} keys but {values.numel()} values")
        self.value_dtype = ctx.torch_dtype(value_type)
        self.key_is_float = keys.is_floating_point()
        nan = torch.isnan(keys) if self.key_is_float else torch.zeros_like(keys, dtype=torch.bool)
        order = torch.argsort(keys[~nan], stable=True)
        self.keys = keys[~nan][order].to(ctx.device)
        self.values = values[~nan][order].to(self.value_dtype).to(ctx.device)
        self.default = self._default(value_type).to(ctx.device)

    def _tensor_type(self, name: str) -> int | None:
        t = self.attrs.get(name)
        return int(t.data_type) if t is not None else None

    def _side(self, side: str) -> tuple[torch.Tensor, int]:
        if self.attrs.get(f"{side}_tensor") is not None:
            t = self.attrs[f"{side}_tensor"]
            arr = onnx.numpy_helper.to_array(t).reshape(-1)
            return torch.as_tensor(arr.copy()), int(t.data_type)
        if self.attrs.get(f"{side}_int64s") is not None:
            return torch.tensor(list(self.attrs[f"{side}_int64s"]), dtype=torch.int64), _INT64
        if self.attrs.get(f"{side}_floats") is not None:
            return torch.tensor(list(self.attrs[f"{side}_floats"]), dtype=torch.float32), _FLOAT
        raise ValueError(f"LabelEncoder: no {side}_* attribute")

    def _default(self, value_type: int) -> torch.Tensor:
        if self.attrs.get("default_tensor") is not None:
            arr = onnx.numpy_helper.to_array(self.attrs["default_tensor"]).reshape(-1)
            return torch.as_tensor(arr.copy()).to(self.value_dtype)[0]
        if value_type == _FLOAT:
            return torch.tensor(float(self.attr("default_float", -0.0)), dtype=self.value_dtype)
        if value_type == _INT64:
            return torch.tensor(int(self.attr("default_int64", -1)), dtype=self.value_dtype)
        # other value types default to 0 unless default_tensor is given (onnxruntime's convention)
        return torch.zeros((), dtype=self.value_dtype)

    def run(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        keys = self.keys.to(x.dtype) if self.key_is_float and x.is_floating_point() else self.keys
        flat = x.reshape(-1)
        if self.keys.numel():
            pos = torch.searchsorted(keys, flat.to(keys.dtype)).clamp(max=keys.numel() - 1)
            found = keys[pos] == flat.to(keys.dtype)
            out = torch.where(found, self.values[pos], self.default)
        else:
            out = self.default.expand(flat.shape).clone()
        return (out.reshape(x.shape),)
