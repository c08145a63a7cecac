"""Reading and locking the on-disk cache files, so that no file-system state can hang or fool a process.

The self-test verdicts, the tuned launch configs and the dispatch counters live under
``GOVINDA_CACHE_DIR``, where anything may be found: a FIFO (whose open blocks until a writer
comes), a device, a symlink, a directory, a huge or binary file, JSON of the wrong types or
nested too deep for Python's parser. So:

- ``read_validated`` opens only regular files: ``lstat`` first, then a non-blocking open that
  does not follow a link, checked again with ``fstat``; it reads a bounded number of bytes and
  validates them against the caller's schema (``cache_schemas``: strict types, bounded nesting).
  A file that fails any check is reported as ``BadCacheFile`` naming it; the caller ignores it,
  computes the entry again and replaces the file atomically (``write_atomically``).
- ``locked`` takes an exclusive ``flock`` with a timeout (``LOCK_TIMEOUT_S``); a lock path that
  is not a regular file is replaced by one, and a lock still taken after the timeout is given up:
  the block then runs without it, which costs duplicate work at worst, since every write is atomic.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from ..excerpt import PATH_CHARS, clip, error_text, quote

MAX_BYTES = 1 << 20  # an entry is a few KiB
LOCK_TIMEOUT_S = 10.0
_OPEN_FLAGS = os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
)


class BadCacheFile(Exception):
    """A cache file that must not be trusted; the message names it and says why."""

    def __init__(self, path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{quote(path, PATH_CHARS)}: {problem}")


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_regular(path: Path, max_bytes: int = MAX_BYTES) -> Optional[bytes]:
    """The bytes of ``path`` if it is a small regular file, None if it does not exist; anything
    else raises ``BadCacheFile``. Never blocks: a FIFO or device is refused before it is opened."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise BadCacheFile(path, f"cannot be examined ({error_text(exc)})") from None
    if not stat.S_ISREG(mode):
        raise BadCacheFile(path, f"{_kind(mode)}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except FileNotFoundError:  # removed meanwhile
        return None
    except OSError as exc:  # ELOOP: replaced by a link meanwhile; EACCES ...
        raise BadCacheFile(path, f"cannot be opened ({error_text(exc)})") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):  # swapped between lstat and open
            raise BadCacheFile(path, f"{_kind(mode)}, not a regular file")
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise BadCacheFile(path, f"cannot be read ({error_text(exc)})") from None
    if len(data) > max_bytes:
        raise BadCacheFile(path, f"larger than {max_bytes // 1024} KiB")
    return data


def read_validated(path: Path, schema) -> Optional[dict]:
    """The entry in ``path`` validated by the pydantic model ``schema`` (as a dict of what the
    file holds), None when there is no file; ``BadCacheFile`` when it cannot be trusted."""
    from pydantic import ValidationError

    data = read_regular(path)
    if data is None:
        return None
    try:
        return schema.model_validate_json(data).model_dump(exclude_unset=True)
    except ValidationError as exc:
        first = exc.errors()[0] if exc.error_count() else {}
        where = ".".join(str(part) for part in first.get("loc", ())) or "the entry"
        raise BadCacheFile(path, f"not a valid entry: {clip(where, 60)}: {clip(first.get('msg', exc), 120)}") from None


@dataclass
class Lock:
    """What ``locked`` got: ``held`` or not, ``busy`` when another process kept it past the
    timeout, ``problem`` for a lock path that was wrong (replaced, or unusable)."""

    path: Path
    timeout_s: float = LOCK_TIMEOUT_S
    held: bool = False
    busy: bool = False
    problem: Optional[str] = None

    def note(self) -> Optional[str]:
        if self.busy:
            return f"another process held {quote(self.path, PATH_CHARS)} for {self.timeout_s:g} s"
        return self.problem


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with a regular file holding ``text``, through a temporary file in the same
    directory: a reader sees the old file or the new one, never a part."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _replace_with_regular_file(path: Path) -> None:
    write_atomically(path, "")


def _open_lock(lock: Lock) -> int:
    path = lock.path
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        found = _kind(mode)
        _replace_with_regular_file(path)  # e.g. a directory cannot be replaced: OSError
        lock.problem = f"replaced {quote(path, PATH_CHARS)}, which was {found}, by a regular lock file"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o644)
    except (PermissionError, OSError) as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)  # a read-only cache: flock needs no write access
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


@contextmanager
def locked(path: Path, timeout_s: Optional[float] = None) -> Iterator[Lock]:
    """Hold an exclusive lock on ``path`` for the block, waiting at most ``timeout_s`` (default
    ``LOCK_TIMEOUT_S``); the block runs in any case and learns from the yielded ``Lock`` whether
    it holds it."""
    timeout_s = LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    lock = Lock(Path(path), timeout_s=timeout_s)
    fd = None
    try:
        fd = _open_lock(lock)
    except (OSError, ValueError) as exc:
        lock.problem = f"{quote(path, PATH_CHARS)} cannot be used as a lock ({error_text(exc)})"
    if fd is not None:
        deadline = time.monotonic() + timeout_s
        pause = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock.held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    lock.busy = True
                    break
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
                pause = min(pause * 2, 0.25)
            except OSError as exc:  # e.g. a file system without flock
                lock.problem = f"{quote(path, PATH_CHARS)} cannot be locked ({error_text(exc)})"
                break
    try:
        yield lock
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock
