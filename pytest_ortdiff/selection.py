"""The run's selection: which providers and dtypes the running pytest session tests. The plugin writes it
at configure time; hypothesis strategies built at import time (which see no config) read it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT", "Selection", "activate", "current", "deactivate"]


@dataclass(frozen=True)
class Selection:
    """Providers (short names: CPU, CUDA, ...) and dtypes (float32, float16, ...) of a run."""

    providers: tuple[str, ...] = ("CPU",)
    dtypes: tuple[str, ...] = ("float32",)


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
