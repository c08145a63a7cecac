"""Dispatch counters that prove our kernels ran.

Counted in Python at each eager call of our backend (prefill/mixed batches and piecewise CUDA
graphs; replays of a full decode CUDA graph do not run Python, so decode counts are a lower bound).
At powers of two a counter is logged and the process's counters are written to
``$GOVINDA_CACHE_DIR/counters/<pid>.json``, which ``python -m govinda_patch counters`` reads.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from pathlib import Path

from ..settings import current as current_settings

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
        (directory / f"{os.getpid()}.json").write_text(json.dumps(payload))
    except OSError as exc:  # counters are evidence, never a reason to fail a forward pass
        logger.debug("could not write counters: %s", exc)


def read_all() -> list[dict]:
    """Every snapshot that can be read; an unreadable directory reads as none."""
    directory = counters_dir()
    try:
        paths = sorted(directory.glob("*.json")) if directory is not None and directory.is_dir() else []
    except OSError:
        return []
    snapshots = []
    for path in paths:
        try:
            snapshot = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(snapshot, dict) and isinstance(snapshot.get("counters"), dict):
            snapshots.append(snapshot)
    return snapshots
