"""Dispatch counters that prove our kernels ran.

Counted in Python at each eager call of our backend (prefill/mixed batches and piecewise CUDA
graphs; replays of a full decode CUDA graph do not run Python, so decode counts are a lower bound).
At powers of two a counter is logged and the process's counters are written to
``$GOVINDA_CACHE_DIR/counters/<pid>.json``, which ``python -m govinda_patch counters`` reads.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter
from pathlib import Path

from ..excerpt import PATH_CHARS, error_text, quote
from ..settings import current as current_settings
from . import cache_files
from .device_cache import write_json_atomically

logger = logging.getLogger("govinda")

_counts: Counter = Counter()


def counters_dir() -> Path | None:
    return current_settings().cache_subdir("counters")


def bump(name: str) -> None:
    _counts[name] += 1
    value = _counts[name]
    if value & (value - 1) == 0:  # 1, 2, 4, 8, ...
        logger.info("dispatch counters: %s", " ".join(f"{k}={v}" for k, v in sorted(_counts.items())))
        _write_snapshot()


def snapshot() -> dict[str, int]:
    return dict(_counts)


def _write_snapshot() -> None:
    try:
        directory = counters_dir()
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        payload = {"pid": os.getpid(), "time": time.time(), "counters": snapshot()}
        # Atomic: whatever sits at the path (a FIFO would block a plain open) is replaced.
        write_json_atomically(directory / f"{os.getpid()}.json", payload)
    except OSError as exc:  # counters are evidence, never a reason to fail a forward pass
        logger.debug("could not write counters: %s", exc)


MAX_SNAPSHOTS = 4096  # a directory with more files is read in part (the report says so)


def read_all() -> tuple[list[dict], list[str]]:
    """Every snapshot that can be trusted, and one line per file that was ignored (named, with
    why); an unreadable directory reads as none. Never blocks: see ``cache_files``."""
    from .cache_schemas import CountersSnapshot

    directory = counters_dir()
    snapshots, ignored = [], []
    try:
        if directory is None or not directory.is_dir():
            return [], []
        paths = sorted(itertools.islice(directory.glob("*.json"), MAX_SNAPSHOTS + 1))
    except OSError as exc:
        return [], [f"{quote(directory, PATH_CHARS)}: cannot be listed ({error_text(exc)})"]
    if len(paths) > MAX_SNAPSHOTS:
        ignored.append(f"{quote(directory, PATH_CHARS)}: more than {MAX_SNAPSHOTS} snapshots, only some were read")
        paths = paths[:MAX_SNAPSHOTS]
    for path in paths:
        try:
            snapshot = cache_files.read_validated(path, CountersSnapshot)
        except cache_files.BadCacheFile as exc:
            ignored.append(f"ignored {exc}")
            continue
        if snapshot is not None:
            snapshots.append(snapshot)
    return snapshots, ignored
