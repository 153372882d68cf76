"""Progress bars for long work — blame on a large graph, the conformance suite, long fuzz runs: tqdm on a
person's terminal, nothing in CI logs, under `pytest -q`, in xdist workers or when output is not a terminal."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Protocol

__all__ = ["Bar", "bar", "configure", "configure_for_pytest", "enabled"]

#: blame shows a bar on graphs with more nodes than this (a smaller one takes about a second)
BLAME_MIN_NODES = 300


class Stream(Protocol):
    def write(self, text: str, /) -> Any: ...
    def flush(self) -> Any: ...


class Bar(Protocol):
    def update(self, n: int = 1) -> Any: ...


class _Silent:
    def update(self, n: int = 1) -> None:
        return None


# Set by the pytest plugin: where a bar may write while pytest captures output (a stream that suspends
# capture around each write), and whether this run wants bars at all (-q, CI, xdist workers: no).
_stream: Stream | None = None
_allowed: bool | None = None


def configure(stream: Stream | None, allowed: bool | None) -> None:
    """The plugin's say: `stream` the terminal to draw on, `allowed` False to silence every bar (None: decide
    from the environment as outside pytest)."""
    global _stream, _allowed
    _stream, _allowed = stream, allowed


def _forced() -> bool | None:
    """ORTDIFF_PROGRESS=1 shows bars even where they would be silent, =0 hides them: None when unset."""
    value = os.environ.get("ORTDIFF_PROGRESS", "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


def enabled(stream: Stream | None = None) -> bool:
    """Whether a bar would be drawn now: forced by ORTDIFF_PROGRESS, else off in CI (the `CI` variable CI
    systems set), in an xdist worker, when the plugin said no, and when the stream is not a terminal."""
    forced = _forced()
    if forced is not None:
        return forced
    if os.environ.get("CI") or os.environ.get("PYTEST_XDIST_WORKER") or _allowed is False:
        return False
    target = stream or _stream or sys.stderr
    isatty: Callable[[], bool] | None = getattr(target, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def bar(total: int, desc: str, *, unit: str = "it", min_total: int = 0) -> Iterator[Bar]:
    """A progress bar over `total` steps named `desc`, or a silent stand-in when bars are off or `total`
    is below `min_total` (short work shows none)."""
    stream = _stream or sys.stderr
    if total < max(min_total, 1) or not enabled(stream):
        yield _Silent()
        return
    from tqdm import tqdm

    start = getattr(stream, "start_line", None)
    if start is not None:
        start()
    # the finished bar stays, on its own line: what ran and how long it took
    with tqdm(total=total, desc=desc, unit=unit, file=stream, mininterval=0.25, dynamic_ncols=True) as t:
        yield t


class _PastCapture:
    """A stream onto pytest's terminal that suspends pytest's output capture around each write, so that a
    bar drawn inside a test reaches the terminal (and nothing of it lands in the test's captured output).
    Resolved at each write: the plugin configures before pytest's terminal reporter exists."""

    def __init__(self, config: Any) -> None:
        self._config = config

    def write(self, text: str) -> int:
        self._draw(text, newline_first=False)
        return len(text)

    def start_line(self) -> None:
        """A bar starts on a line of its own (pytest's line of dots may be half written)."""
        self._draw("", newline_first=True)

    def _draw(self, text: str, newline_first: bool) -> None:
        manager = self._config.pluginmanager
        if manager.getplugin("terminalreporter") is None:  # -p no:terminal: nowhere to draw
            return
        tw = self._config.get_terminal_writer()
        capman = manager.getplugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman is not None else nullcontext():
            if newline_first and tw.width_of_current_line:
                tw.line()
            if text:
                tw.write(text, flush=True)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        out = sys.__stdout__
        return bool(out is not None and out.isatty())


def configure_for_pytest(config: Any) -> None:
    """Called by the plugin at configure time: bars draw on pytest's terminal, past its capture; none
    under `-q` or in an xdist worker."""
    quiet = config.getoption("verbose", 0) < 0 or hasattr(config, "workerinput")
    configure(_PastCapture(config), False if quiet else None)
