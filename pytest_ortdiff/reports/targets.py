"""The files reports are written to: whether a path holds a report of ours (only such a file is written over,
by pytest's --ortdiff-json/--ortdiff-html and by `merge --output/--html`), and the page a report holds while its run runs."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Literal

__all__ = ["foreign_report", "running_page"]

#: the keys of every --ortdiff-json file any version wrote (the first ones: results and skips only)
_JSON_KEYS = frozenset({"schema", "complete", "results", "skips", "tests", "baselines", "environment"})
_JSON_HEAD = re.compile(r'\A\s*\{\s*"(?:schema|complete|results)"\s*:')
#: the title every HTML report had before it carried htmlreport.GENERATOR
_LEGACY_TITLE = "<title>pytest-ortdiff report</title>"
#: a report larger than this is recognized by its head alone (a JSON report of 5,000 checks is ~10 MB)
_PARSE_MAX = 256 << 20


def foreign_report(path: Path, kind: Literal["json", "html"]) -> str | None:
    """Why the file at `path` must not be written over by the `kind` report, or None when it may: there is
    nothing there (a dangling link included), an empty file, or a report of that kind this package wrote
    (any version's, an incomplete run's too). Read through a link, as anyone reading the path would see it:
    `pytest --ortdiff-json tests/test_models.py` (a space for the `=`) must not cost the module."""
    try:
        size = path.stat().st_size
        if size == 0:
            return None
        with path.open("rb") as f:
            head = f.read(4096)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read to tell whether it is a report ({exc.strerror or exc})"
    text = head.decode("utf-8", errors="replace")
    if kind == "html":
        ours = text.startswith("<!DOCTYPE html>") and (_generator() in text or _LEGACY_TITLE in text[:1024])
    else:
        ours = _JSON_HEAD.match(text) is not None and (size > _PARSE_MAX or _our_json(path))
    return None if ours else "is not a report written by pytest-ortdiff"


def _our_json(path: Path) -> bool:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("results"), list) and set(data) <= _JSON_KEYS


def _generator() -> str:
    from ..reports.htmlreport import GENERATOR

    return GENERATOR


def running_page(started: str | None = None) -> str:
    """The page --ortdiff-html holds while its run has not finished: what a run killed before its end leaves
    in place of the previous run's report (which may be green), in the head this package's reports carry."""
    if started is None:
        started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{_generator()}'
        "<title>pytest-ortdiff report: run did not finish</title>"
        "<style>body{font:15px/1.5 system-ui,sans-serif;margin:2em;max-width:50em}h1{color:#b00020}</style></head><body>"
        "<h1>pytest-ortdiff report: run did not finish</h1>"
        f"<p>The pytest run that writes this report started {escape(started)} (pid {os.getpid()}) and did not finish: "
        "it was killed, interrupted, or is still running. Its results are unknown; a run that finishes replaces this "
        "page with its report.</p></body></html>\n"
    )
