"""Bounded text for log lines and error messages: user input is quoted in excerpts, never whole.

A value from a patch table or the environment can be arbitrarily large (a YAML alias bomb expands
to millions of items); ``excerpt`` bounds both the work and the length of its repr. Every
user-supplied string (a path, a variable name, a value) goes through ``quote``, which escapes
control characters (a raw ESC or BEL would reach the operator's terminal) and cuts long text in
the middle, so both ends of a path stay readable and whatever follows it in a message stays too.
"""

from __future__ import annotations

import re
import reprlib

EXCERPT_CHARS = 200
PATH_CHARS = 160  # a path in a message: enough for its root and its file name

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = 6
_repr.maxdict = 4
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlong = 40

# C0 and C1 controls, DEL, Unicode line separators and the bidirectional overrides: none of them
# may reach a terminal raw.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\x1b``, ``\\u202e``)."""
    return _CONTROL.sub(_escaped, text)


def quote(text, limit: int = EXCERPT_CHARS) -> str:
    """A user-supplied string as shown in a message: escaped, at most ``limit`` characters, and
    cut in the middle (``head...tail``) when longer. Never raises."""
    try:
        raw = str(text)
    except Exception:
        return f"<{type(text).__name__}>"
    limit = max(limit, 8)
    # Escaping at most quadruples a character: escape only what can be shown.
    if len(raw) > 4 * limit:
        raw = raw[: 2 * limit] + raw[-2 * limit:]
        shown = escape(raw)
        cut = True
    else:
        shown = escape(raw)
        cut = len(shown) > limit
    if not cut:
        return shown
    head = (limit - 3) // 2
    tail = limit - 3 - head
    return shown[:head] + "..." + shown[len(shown) - tail:]


def clip(text, limit: int = EXCERPT_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters (a clipped text ends with '...');
    runs of whitespace become one space and any other control character is escaped."""
    one_line = escape(" ".join(str(text)[: limit * 4].split()))
    return one_line if len(one_line) <= limit else one_line[: limit - 3] + "..."


def excerpt(value, limit: int = EXCERPT_CHARS) -> str:
    """A bounded repr of ``value``; never raises (huge ints refuse repr on recent Pythons)."""
    try:
        text = _repr.repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return clip(text, limit)


def error_text(exc: BaseException, limit: int = EXCERPT_CHARS) -> str:
    """``Type: cause`` of an exception, the cause first: an OSError's file name (user input,
    possibly very long) is quoted after it, never before it."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({quote(exc.filename, PATH_CHARS)})" if exc.filename is not None else ""
        return clip(f"{type(exc).__name__}: {exc.strerror}", limit) + where
    return clip(f"{type(exc).__name__}: {exc}", limit)
