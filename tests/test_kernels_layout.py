"""Where a maintainer looks for a kernel: the module of the op's ONNX family, as onnx.defs files it."""

from __future__ import annotations

import onnx.defs

from pytest_ortdiff.runtimes.kernels import REGISTRY


def _family(domain: str, op: str, since: int) -> str | None:
    """The folder of onnx/defs holding the op's schema at version `since`; None for an op (or a version of
    one: onnxruntime's LayerNormalization below opset 17) onnx has no schema for, which is onnxruntime's own
    and lives in kernels/contrib."""
    try:
        path = onnx.defs.get_schema(op, since, domain=domain).file
    except onnx.defs.SchemaError:
        return None
    parts = path.replace("\\", "/").split("/")
    return parts[parts.index("defs") + 1] if "defs" in parts else None


def test_every_kernel_lives_in_its_onnx_family() -> None:
    misplaced = []
    for (domain, op), versions in REGISTRY.items():
        for since, cls in versions:
            family = _family(domain, op, since)
            if family is None:
                continue
            want = f"pytest_ortdiff.runtimes.kernels.{family}"
            if not (cls.__module__ == want or cls.__module__.startswith(want + ".")):
                misplaced.append(f"{domain or 'ai.onnx'}::{op} (since {since}) in {cls.__module__}, not {want}")
    assert misplaced == []


def test_onnxruntimes_own_ops_live_in_contrib() -> None:
    # onnxruntime's default-domain ops (its LayerNormalization before ONNX's, SimplifiedLayerNormalization)
    # and com.microsoft's sit in kernels/contrib, each looked up at the opsets models carry them
    from pytest_ortdiff.runtimes.kernels import lookup

    for domain, op, opset, module in [
        ("", "SimplifiedLayerNormalization", 17, "contrib.normalization"),
        ("", "SimplifiedLayerNormalization", 13, "contrib.normalization"),
        ("", "LayerNormalization", 16, "contrib.normalization"),
        ("", "LayerNormalization", 17, "nn.normalization"),  # ONNX's own from 17 on
        ("com.microsoft", "SkipLayerNormalization", 1, "contrib.normalization"),
    ]:
        cls = lookup(domain, op, opset)
        assert cls is not None and cls.__module__ == f"pytest_ortdiff.runtimes.kernels.{module}", (op, opset, cls)


def test_one_way_to_define_a_kernel() -> None:
    # every registered kernel is a class registered by @kernel: it knows its op, domain and version
    for (domain, op), versions in REGISTRY.items():
        for since, cls in versions:
            assert (cls.domain, cls.op_type, cls.since) == (domain, op, since)
