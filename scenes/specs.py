"""Value specs: what a scene key accepts, how its value is converted, and how a value is
shown in a message.

A ``Spec`` pairs the words of what is expected ("an integer >= 2", used in messages and the
README) with a conversion that returns the value or raises ``BadValue``. The scene schema,
the real-heads keys (``pretrained_keys``) and the sweep file's validator share them; this
module imports nothing of the project, so each of them can import it.
"""
from __future__ import annotations

import difflib
import math
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

MISSING: Any = object()     # a key absent, or present with a value that failed its spec


class BadValue(Exception):
    """A value failed its spec; ``wrong_type`` tells a type error from a range error."""

    def __init__(self, wrong_type: bool, hint: str = ""):
        super().__init__(hint)
        self.wrong_type = wrong_type
        self.hint = hint


@dataclass(frozen=True)
class Spec:
    expected: str                       # "an integer >= 2", used in messages and the README
    convert: Callable[[Any], Any]       # returns the converted value or raises BadValue


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bounds_text(lo, hi, lo_open, hi_open) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f" {'<' if hi_open else '<='} {hi:g}"
    return ""


def _in_bounds(v, lo, hi, lo_open, hi_open) -> bool:
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    if hi is not None and (v >= hi if hi_open else v > hi):
        return False
    return True


def integer(lo=None, hi=None) -> Spec:
    def convert(v):
        if not is_int(v):
            raise BadValue(True)
        if not _in_bounds(v, lo, hi, False, False):
            raise BadValue(False)
        return v
    return Spec("an integer" + _bounds_text(lo, hi, False, False), convert)


def number(lo=None, hi=None, lo_open=False, hi_open=False) -> Spec:
    def convert(v):
        if not is_number(v):
            raise BadValue(True)
        v = float(v)
        if not math.isfinite(v) or not _in_bounds(v, lo, hi, lo_open, hi_open):
            raise BadValue(False)
        return v
    return Spec("a number" + _bounds_text(lo, hi, lo_open, hi_open), convert)


def boolean() -> Spec:
    def convert(v):
        if not isinstance(v, bool):
            raise BadValue(True)
        return v
    return Spec("true or false", convert)


def string(nonempty: bool = False) -> Spec:
    def convert(v):
        if not isinstance(v, str):
            raise BadValue(True)
        if nonempty and not v.strip():
            raise BadValue(False)
        return v
    return Spec("a non-empty string" if nonempty else "a string", convert)


def choice(*options: str) -> Spec:
    def convert(v):
        if not isinstance(v, str):
            raise BadValue(True)
        if v not in options:
            close = difflib.get_close_matches(v, options, n=1)
            raise BadValue(False, f"; did you mean '{close[0]}'?" if close else "")
        return v
    return Spec("one of " + ", ".join(f"'{o}'" for o in options), convert)


def number_list(lo=None, lo_open=False, length: int | None = None, nonempty=True) -> Spec:
    item = number(lo, lo_open=lo_open)

    def convert(v):
        if not isinstance(v, list) or not all(is_number(x) for x in v):
            raise BadValue(True)
        if nonempty and not v:
            raise BadValue(False)
        if length is not None and len(v) != length:
            raise BadValue(False)
        try:
            return [item.convert(x) for x in v]
        except BadValue:
            raise BadValue(False) from None
    text = "a list of numbers" + _bounds_text(lo, None, lo_open, False).replace(" ", " each ", 1)
    if length is not None:
        text += f" of length {length}"
    return Spec(text, convert)


def int_pair(lo=0) -> Spec:
    def convert(v):
        if not isinstance(v, list) or not all(is_int(x) for x in v):
            raise BadValue(True)
        if len(v) != 2 or v[0] < lo or v[1] <= v[0]:
            raise BadValue(False)
        return list(v)
    return Spec("[start, stop] with integers 0 <= start < stop", convert)


def vectors(cols: int | None, rows: int | None = None, square: bool = False) -> Spec:
    """A nested list of numbers: rows x cols (a list of vectors / a matrix)."""
    shape = f"({rows if rows is not None else 'k'}, {cols if cols is not None else 'd'})"
    what = "a d x d matrix (list of rows)" if square else "a list of vectors"

    def convert(v):
        if not isinstance(v, list) or not v or not all(isinstance(r, list) for r in v):
            raise BadValue(True)
        if not all(is_number(x) for r in v for x in r):
            raise BadValue(True)
        if len({len(r) for r in v}) != 1:
            raise BadValue(False, "; the rows have different lengths")
        if (cols is not None and len(v[0]) != cols) or (rows is not None and len(v) != rows):
            raise BadValue(False, f"; found shape ({len(v)}, {len(v[0])})")
        if not all(math.isfinite(float(x)) for r in v for x in r):
            raise BadValue(False, "; it holds NaN or Inf")
        return [[float(x) for x in r] for r in v]
    return Spec(f"{what} of shape {shape}", convert)


def type_name(v) -> str:
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a table"
    return type(v).__name__


def has_control_character(text: str) -> bool:
    """A newline, a null byte or another control character (also the Unicode line and
    paragraph separators): in a file or folder name such a character breaks paths and lines."""
    return any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text)


def show(v) -> str:
    """A value as it would appear in TOML (short)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        text = "[" + ", ".join(show(x) for x in v[:6]) + (", ...]" if len(v) > 6 else "]")
        return text if len(text) <= 80 else text[:77] + "..."
    return repr(v)
