"""Bounded text for log lines and error messages: user input is quoted in excerpts, never whole.

A value from a patch table or the environment can be arbitrarily large (a YAML alias bomb expands
to millions of items); ``excerpt`` bounds both the work and the length of its repr.
"""

from __future__ import annotations

import reprlib

EXCERPT_CHARS = 200

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = 6
_repr.maxdict = 4
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlong = 40


def clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters (a clipped text ends with '...')."""
    one_line = " ".join(str(text)[: limit * 4].split())
    return one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."


def excerpt(value, limit: int = EXCERPT_CHARS) -> str:
    """A bounded repr of ``value``; never raises (huge ints refuse repr on recent Pythons)."""
    try:
        text = _repr.repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return clip(text, limit)
