"""Where a maintainer looks for a kernel: the module of the op's ONNX family, as onnx.defs files it."""

from __future__ import annotations

import onnx.defs

from pytest_ortdiff.runtimes.kernels import REGISTRY


def _family(domain: str, op: str) -> str | None:
    try:
        path = onnx.defs.get_schema(op, domain=domain).file
    except onnx.defs.SchemaError:
        return None
    parts = path.replace("\\", "/").split("/")
    return parts[parts.index("defs") + 1] if "defs" in parts else None


def test_every_kernel_lives_in_its_onnx_family() -> None:
    misplaced = []
    for (domain, op), versions in REGISTRY.items():
        family = _family(domain, op)
        if family is None:
            continue
        want = f"pytest_ortdiff.runtimes.kernels.{family}"
        for since, cls in versions:
            if not (cls.__module__ == want or cls.__module__.startswith(want + ".")):
                misplaced.append(f"{domain or 'ai.onnx'}::{op} (since {since}) in {cls.__module__}, not {want}")
    assert misplaced == []


def test_one_way_to_define_a_kernel() -> None:
    # every registered kernel is a class registered by @kernel: it knows its op, domain and version
    for (domain, op), versions in REGISTRY.items():
        for since, cls in versions:
            assert (cls.domain, cls.op_type, cls.since) == (domain, op, since)
