"""Which of the overlay's Triton kernels a server start compiled, and whether before or after its
engine started (issue #29: the background process should compile what the engine launches, so the
engine only loads it from the on-disk cache).

Triton writes one ``<kernel>.json`` metadata file per compiled specialization (``<cache>/<hash>/``)
when the compile ends. After a start, every such file of one of ``kernels/``'s kernels under the
side's cache roots whose modification time is at or after the launch was compiled by that start;
one older than the launch was loaded. The engine's start comes from vLLM's first
"Initializing a V1 LLM engine" line: its ``MM-DD HH:MM:SS`` is local time on the same machine,
so the launch's year completes it. A compile that ended before that line was the background
process's (the API server compiles none of ours); one after it, the engine's.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, FrozenSet, Iterable, List, Optional

ENGINE_START = re.compile(r"(?P<stamp>\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] Initializing a V1 LLM engine")
GROUP_PREFIX = "__grp__"  # Triton's per-compile group file, beside the metadata


def engine_start_epoch(log_text: str, launched_epoch: float) -> Optional[float]:
    """The engine's first start line as seconds since the epoch, in the launch's year; None without one."""
    match = ENGINE_START.search(log_text)
    if match is None:
        return None
    year = time.localtime(launched_epoch).tm_year
    try:
        return time.mktime(time.strptime(f"{year}-{match.group('stamp')}", "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def compiled_kernels(roots: Iterable[str], ours: FrozenSet[str], launched_epoch: float) -> List[Dict[str, Any]]:
    """``{"kernel", "at_s"}`` for each of our specializations compiled at or after the launch (seconds
    after it), sorted by time; files that vanish or cannot be read are skipped."""
    found = []
    for root in roots:
        for directory, _dirs, names in os.walk(root):
            for name in names:
                kernel, ext = os.path.splitext(name)
                if ext != ".json" or kernel.startswith(GROUP_PREFIX) or kernel not in ours:
                    continue
                try:
                    mtime = os.lstat(os.path.join(directory, name)).st_mtime
                except OSError:
                    continue
                if mtime >= launched_epoch:
                    found.append({"kernel": kernel, "at_s": round(mtime - launched_epoch, 2)})
    return sorted(found, key=lambda entry: entry["at_s"])


def summary(roots: Iterable[str], ours: FrozenSet[str], launched_epoch: float, log_text: str) -> Dict[str, Any]:
    """What a start compiled of ours: ``{"engine_start_s", "before_engine", "in_engine", "compiles"}``
    (counts split at the engine's start line; both None when the log has no such line)."""
    compiles = compiled_kernels(roots, ours, launched_epoch)
    engine = engine_start_epoch(log_text, launched_epoch)
    if engine is None:
        return {"engine_start_s": None, "before_engine": None, "in_engine": None, "compiles": compiles}
    # The log's stamp has whole seconds: a compile inside the start line's second counts as the engine's.
    engine_s = round(engine - launched_epoch, 2)
    in_engine = [entry for entry in compiles if entry["at_s"] >= engine_s]
    return {"engine_start_s": engine_s, "before_engine": len(compiles) - len(in_engine),
            "in_engine": len(in_engine), "compiles": compiles}
