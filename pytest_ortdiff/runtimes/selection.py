"""The run's selection: which providers and dtypes the running pytest session tests, and how many bytes of
models its caches keep. The plugin writes it at configure time; code that sees no config reads it."""

from __future__ import annotations

import ctypes
import functools
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "CACHE_ENV",
    "DEFAULT",
    "DEFAULT_CACHE_MB",
    "ResidentGrowth",
    "Selection",
    "activate",
    "cache_bytes",
    "charge",
    "current",
    "deactivate",
    "parse_cache_mb",
    "release_freed_memory",
    "resident_bytes",
    "trim_cache",
]

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
    dozens of small ones. The most recent entry always stays (it is in use). What the evicted entries held
    goes back to the operating system, so that resident memory follows the cache, not its high-water mark."""
    limit = cache_bytes()
    total = sum(size for _, size in cache.values())
    evicted = False
    while total > limit and len(cache) > 1:
        _, (_, size) = cache.popitem(last=False)
        total -= size
        evicted = True
    if evicted:
        release_freed_memory()


def charge(cache: OrderedDict[K, tuple[Any, int]], key: K, extra: int) -> None:
    """Add `extra` bytes to what the entry `key` of `cache` is charged (memory it took after it was cached: an
    onnxruntime session's arena on its first run), and trim the cache to its bound again."""
    entry = cache.get(key)
    if entry is not None and extra > 0:
        cache[key] = (entry[0], entry[1] + extra)
        trim_cache(cache)


# -- resident memory ---------------------------------------------------------------------------------


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux's /proc/self/statm), None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; other C libraries have none
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the pages the C heap holds free back to the operating system (glibc's malloc_trim; a no-op
    elsewhere): freed sessions and tensors otherwise stay resident, and are what the next ones reuse.
    Cheap: microseconds, even on a heap of gigabytes."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class ResidentGrowth:
    """How much resident memory grows from its creation to `stop()`: what the objects made in between hold.
    The heap's free pages are returned before and after, so memory freed earlier and reused in between does
    not hide the growth, and garbage freed in between does not count. 0 where resident memory cannot be read;
    other threads' allocations in between count too (an estimate: callers charge at least what they know)."""

    def __init__(self) -> None:
        release_freed_memory()
        self._before = resident_bytes()

    def stop(self) -> int:
        release_freed_memory()
        after = resident_bytes()
        return max(0, after - self._before) if after is not None and self._before is not None else 0
