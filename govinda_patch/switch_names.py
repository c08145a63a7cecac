"""Unknown ``GOVINDA_*`` variables: a misspelt switch must not be silently ignored.

The known names come from the same sources as reports/env-vars.md (``env-doc``): the global
switches of settings.py, the table's ``env:`` keys and the ``# env-doc:`` lines of scripts/ and
bench/, so a switch added in any of them is known here without a second list.
"""

from __future__ import annotations

import difflib

from .excerpt import clip
from .settings import GLOBAL_SWITCHES, PREFIX

MAX_NAMED = 8  # the warning names at most this many variables


def unknown_switch_warning(environ, table) -> str | None:
    """One warning line naming the unknown ``GOVINDA_*`` variables (with a close match), or None."""
    known = {s.name for s in GLOBAL_SWITCHES}
    known |= {p.env for p in table.patches} | {g.env for g in table.groups}
    unknown = sorted(name for name in environ if name.startswith(PREFIX) and name not in known)
    if not unknown:
        return None
    from .docs import script_switches  # reads scripts/ and bench/: only when something is unknown

    try:
        known |= {row[0] for row in script_switches()}
    except (OSError, UnicodeDecodeError):
        pass  # a checkout without readable scripts: their names are then reported as unknown
    unknown = [name for name in unknown if name not in known]
    if not unknown:
        return None
    candidates = sorted(known)
    described = []
    for name in unknown[:MAX_NAMED]:
        # difflib is quadratic in the length: long names are never a typo of ours anyway.
        match = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8) if len(name) <= 64 else []
        described.append(clip(name, 64) + (f" (did you mean {match[0]}?)" if match else ""))
    more = f" and {len(unknown) - MAX_NAMED} more" if len(unknown) > MAX_NAMED else ""
    return (
        f"unknown GOVINDA_* variables are ignored: {', '.join(described)}{more}; "
        "the switches are listed in reports/env-vars.md"
    )
