"""Number and table formatting shared by every renderer: one rounding for values, shares and indices,
so a report, a violation, the summary table and the blame table print the same number alike."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .dtypes import dtype_of

__all__ = ["cut", "g", "html_text", "index", "markdown_text", "pct", "pct_frac", "printable", "shortest", "table", "threshold"]


def g(x: Any, digits: int = 3) -> str:
    """A number in `digits` significant digits ("-" for None, "0" for zero, "nan"/"inf" as such); a
    per-dtype dict as `{float16: 0.5, float32: 0.0001}`."""
    if x is None:
        return "-"
    if isinstance(x, Mapping):
        return "{" + ", ".join(f"{k}: {g(v, digits)}" for k, v in x.items()) + "}"
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def threshold(t: float) -> str:
    """A histogram threshold: "0", "1e-06", "0.01", "1"."""
    return "0" if t == 0 else f"{t:g}"


def pct_frac(frac: float) -> str:
    """A fraction as a share: "25.00 %", "0.03 %", and below 0.01 % two significant digits ("0.0012 %")."""
    p = float(frac) * 100
    if p == 0:
        return "0 %"
    if p >= 0.01:
        return f"{p:.2f} %"
    return f"{p:.2g} %"


def pct(count: int, n: int) -> str:
    """`count` of `n` elements as a share (pct_frac's rounding; "0 %" when there are none)."""
    return pct_frac(count / n if n else 0.0)


def index(idx: Sequence[int] | None) -> str:
    """An element's index: "(0, 3, 1)"; "-" when there is none."""
    return "-" if idx is None else "(" + ", ".join(str(int(i)) for i in idx) + ")"


# a value -> the nearest value of the dtype (None: outside its range), to print in as few digits as read back
def _round_f32(x: float) -> float | None:
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return None


def _round_f16(x: float) -> float | None:
    try:
        return float(struct.unpack("<e", struct.pack("<e", x))[0])
    except OverflowError:
        return None


def _round_bf16(x: float) -> float | None:
    if _round_f32(x) is None:
        return None
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # round to nearest even
    if bits & 0x7F800000 == 0x7F800000:
        return None
    return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0])


_ROUND: dict[str, Callable[[float], float | None]] = {"float32": _round_f32, "float16": _round_f16, "bfloat16": _round_bf16, "float64": lambda x: x}


def shortest(x: Any, dtype: str) -> str:
    """A value of an output in its dtype, in the fewest significant digits that read back as it (the
    shortest round trip, as numpy's repr of a float32 or float16): two different values never print alike."""
    if x is None:
        return "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)  # exact: int64 values above 2**53 would round through a float
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    try:
        dt = dtype_of(dtype) if dtype and "," not in dtype else None
    except ValueError:
        dt = None
    if dt is not None and not dt.is_floating_point:
        if dt.short == "bool":
            return str(bool(x))
        if x.is_integer():
            return str(int(x))
    rounding = _ROUND.get(dtype, _ROUND["float64"])
    for digits in range(1, 18):
        s = f"{x:.{digits}g}"
        if rounding(float(s)) == x:
            # "100", not "1e+02": 'g' turns to an exponent once the integer part has more digits than it
            # shows; below 1e16 the same digits read better in place
            if "e+" in s and abs(float(s)) < 1e16:
                s = f"{float(s):.0f}"
            return s
    return repr(x)


def table(head: Sequence[str], body: Sequence[Sequence[str]], *, indent: str = "") -> list[str]:
    """Left-aligned columns two spaces apart, each as wide as its widest cell; trailing blanks stripped."""
    widths = [max([len(h), *(len(row[i]) for row in body)]) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return (indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip()

    return [line(head), *(line(row) for row in body)]


# ------------------------------------------------------------------------------------------------
# text from someone else's file (a job file's test ids, a model's input names) on a terminal or in markdown

# C0 and C1 controls (ESC starts every ANSI sequence), DEL, and the bidi overrides that reorder a line
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with every control character shown as an escape (`\\x1b`): a name from a file never moves the
    cursor, recolours, retitles or clears the terminal."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def cut(text: str, limit: int) -> str:
    """`text` in at most `limit` characters, "…" saying where it was cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


#: a word joiner after "@": GitHub makes "@name" a mention (a link, and a notification) and "a@b.c" a mailto link
_JOINED_AT = "@\u2060"
_MD_ESCAPES = {"\\": "\\\\", "|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;", "`": "\\`", "*": "\\*", "_": "\\_", "~": "\\~", "[": "\\[", "#": "\\#", "@": _JOINED_AT, "\n": " ", "\r": " "}
# every character that opens markdown: "[" (links, images, reference definitions, footnotes: none can open,
# so neither "[x]: url" nor its uses "![a][x]", "[a][x]", "[x]" can form one), "<" and "&" (HTML, entities),
# "|" (a column), "`", "*", "~" and "_" (code and emphasis; "_" only where it could open or close: test_lnmm and
# x86_64 stay as they are), "#" (a heading in a list item); and the autolinks of GitHub's extension: "://"
# ("https\://" is text), "www." at a word's start, and "@" (a mention, an e-mail address)
_MD_SPECIAL = re.compile(r"[\\|<>&`*~\[#@\r\n]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|:(?=//)|(?<![A-Za-z0-9])www\.", re.IGNORECASE)


def markdown_text(text: str, limit: int = 400) -> str:
    """Text from a file, as plain text in a markdown line (a table cell, a list item) of a pull-request comment:
    at most `limit` characters of it (a comment has a size limit; one test id must not take it), control
    characters escaped, and every character that could form a link, an image, a reference definition, HTML, a
    mention or a column escaped, as GitHub's cmark-gfm reads it."""

    def escape(m: re.Match[str]) -> str:
        s = m.group()
        if s == ":":
            return "\\:"
        if len(s) == 4:  # www.
            return s[:3] + "\\."
        return _MD_ESCAPES[s]

    return printable(_MD_SPECIAL.sub(escape, cut(text, limit)))


_HTML_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "@": _JOINED_AT, "\n": " ", "\r": " "}


def html_text(text: str, limit: int = 400) -> str:
    """Text from a file inside the raw HTML of a markdown comment (a `<details>`' summary, where markdown is not
    read): cut to `limit`, control characters escaped, `&`, `<` and `>` as entities, no mention."""
    return printable(re.sub(r"[&<>@\r\n]", lambda m: _HTML_ESCAPES[m.group()], cut(text, limit)))
