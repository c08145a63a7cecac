"""Dispatch counters that prove our kernels ran.

Counted in Python at each eager call of our backend (prefill/mixed batches and piecewise CUDA
graphs; replays of a full decode CUDA graph do not run Python, so decode counts are a lower bound).
At powers of two a counter is logged and the process's counters are written to
``$GOVINDA_CACHE_DIR/counters/<pid>.json``, which ``python -m govinda_patch counters`` reads. The
file is written by a thread of its own: a forward pass never waits on the file system (an fsync
there can take tens of ms while a new server's compile caches are written back, and the first
requests cross the most powers of two).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
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
        _snapshot_writer().request(counters_dir())


def snapshot() -> dict[str, int]:
    return dict(_counts)


def flush(timeout: float = 10.0) -> bool:
    """Wait until every snapshot asked for so far is written (False if ``timeout`` passed first)."""
    writer = _writer
    return True if writer is None else writer.wait(timeout)


class _SnapshotWriter:
    """One daemon thread per process that writes the latest snapshot when asked; asks that come
    while it writes are served by one more write."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._asked = self._written = 0
        self._directory: Path | None = None
        threading.Thread(target=self._run, name="govinda-counters", daemon=True).start()

    def request(self, directory: Path | None) -> None:
        """Write a snapshot into ``directory`` (read where the count was made: the environment of
        that moment, not of the write's)."""
        with self._changed:
            self._asked += 1
            self._directory = directory
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._written >= self._asked, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._asked > self._written)
                asked, directory = self._asked, self._directory
            try:
                _write_snapshot(directory)
            except Exception as exc:  # the thread outlives a write that failed in any way
                logger.debug("could not write counters: %s: %s", type(exc).__name__, exc)
            with self._changed:
                self._written = asked
                self._changed.notify_all()


_writer: _SnapshotWriter | None = None
_writer_lock = threading.Lock()


def _snapshot_writer() -> _SnapshotWriter:
    global _writer
    if _writer is None:
        with _writer_lock:
            if _writer is None:
                _writer = _SnapshotWriter()
    return _writer


def _forget_writer_in_child() -> None:
    # A forked child has none of the parent's threads (its first bump starts its own writer), and a
    # lock they held stays held.
    global _writer, _writer_lock
    _writer, _writer_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_writer_in_child)
atexit.register(flush, 2.0)  # the last snapshot of a process that exits normally


def _write_snapshot(directory: Path | None) -> None:
    try:
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
