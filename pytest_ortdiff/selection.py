"""The run's selection: which providers and dtypes the running pytest session tests, and how many bytes of
models its caches keep. The plugin writes it at configure time; code that sees no config reads it."""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["CACHE_ENV", "DEFAULT", "DEFAULT_CACHE_MB", "Selection", "activate", "cache_bytes", "current", "deactivate", "parse_cache_mb", "trim_cache"]

#: the environment variable that bounds each model cache (onnxruntime sessions, torch evaluators), in MiB
CACHE_ENV = "ORTDIFF_CACHE_MB"
#: the bound without it (or ini `ortdiff_cache_mb`): at most this many MiB of models per cache
DEFAULT_CACHE_MB = 512

K = TypeVar("K")


@dataclass(frozen=True)
class Selection:
    """Providers (short names: CPU, CUDA, ...) and dtypes (float32, float16, ...) of a run, and the ini's
    cache bound in MiB (None: not set)."""

    providers: tuple[str, ...] = ("CPU",)
    dtypes: tuple[str, ...] = ("float32",)
    cache_mb: int | None = None


#: outside pytest, and in a session that asked for nothing
DEFAULT = Selection()

# a stack: pytester runs sessions inside a session, and the inner one's selection holds until it ends
_ACTIVE: list[Selection] = []


def activate(selection: Selection) -> None:
    """Make `selection` the current one (a pytest session starting)."""
    _ACTIVE.append(selection)


def deactivate(selection: Selection) -> None:
    """Drop `selection` (its pytest session ended); the enclosing session's holds again."""
    for i in range(len(_ACTIVE) - 1, -1, -1):
        if _ACTIVE[i] is selection:
            del _ACTIVE[i]
            return


def current() -> Selection:
    """The selection of the innermost running pytest session, DEFAULT outside one."""
    return _ACTIVE[-1] if _ACTIVE else DEFAULT


def parse_cache_mb(value: str, source: str) -> int:
    """A cache bound in MiB (a non-negative integer; 0 keeps only the latest model); ValueError naming
    `source` and the fix otherwise."""
    text = value.strip()
    if not text.isdigit():
        raise ValueError(f"{source}: expected a number of MiB such as {DEFAULT_CACHE_MB} (0: keep only the latest model), got {value!r}")
    return int(text)


def cache_bytes() -> int:
    """Bytes of models each cache keeps: $ORTDIFF_CACHE_MB, else ini `ortdiff_cache_mb`, else 512 MiB."""
    env = os.environ.get(CACHE_ENV)
    if env is not None and env.strip():
        return parse_cache_mb(env, f"${CACHE_ENV}") << 20
    mb = current().cache_mb
    return (DEFAULT_CACHE_MB if mb is None else mb) << 20


def trim_cache(cache: OrderedDict[K, tuple[Any, int]]) -> None:
    """Evict the least recently used entries of `cache` (key -> (value, size in bytes), most recent last)
    until their sizes fit `cache_bytes()`: bounded by bytes, since one large model weighs more than
    dozens of small ones. The most recent entry always stays (it is in use)."""
    limit = cache_bytes()
    total = sum(size for _, size in cache.values())
    while total > limit and len(cache) > 1:
        _, (_, size) = cache.popitem(last=False)
        total -= size
