"""The overlay applied in this process for a ``with`` block, then reverted (like FlagGems' ``use_gems``).

``sitecustomize`` applies the overlay once per process, at ``import vllm``. Tests (and notebooks)
that only need "vLLM with these switches" can instead run ``bootstrap.on_vllm_imported`` here:

    with overlay_scope({"GOVINDA_INT8_KV": "0"}) as scope:
        ...                       # patches land as their vLLM modules are (or were) imported
    # every patch reverted, GOVINDA_* variables and the overlay's logging as they were

Only the ``GOVINDA_*`` variables of ``environ`` count: for the block they replace those of
``os.environ``, so every reader of the switches sees the scope's. A patch whose module is imported
only after the block never lands (its entry is disabled on exit). What vLLM itself derived or cached
from patched code inside the block (e.g. an attention backend it selected) keeps what it saw:
start-up semantics, spawned workers and platform choice still need a fresh interpreter.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from . import bootstrap, settings as settings_module
from .manager import APPLIED, DISABLED, PENDING, Overlay

PREFIX = settings_module.PREFIX
_logger = logging.getLogger("govinda")


class OverlayScopeError(RuntimeError):
    """The scope cannot be entered: an overlay is already live in this process."""


@dataclass
class Scope:
    """What one scope planned: ``overlay`` is None when the overlay is off (disabled, bad table)."""

    overlay: Overlay | None
    records: list[logging.LogRecord] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The overlay's log lines, as ``govinda LEVEL message`` (a child's stderr minus the pid)."""
        return [f"govinda {r.levelname} {r.getMessage()}" for r in self.records]

    def problems(self) -> list[str]:
        return [line for line in self.lines() if " ERROR " in line or " WARNING " in line]


class _Recorder(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]):
        super().__init__(logging.DEBUG)
        self._records = records

    def emit(self, record: logging.LogRecord) -> None:
        self._records.append(record)


def _swap_switches(environ: Mapping[str, str]) -> dict[str, str]:
    previous = {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}
    for key in previous:
        del os.environ[key]
    os.environ.update({k: str(v) for k, v in environ.items() if k.startswith(PREFIX)})
    _forget_parsed_settings()
    return previous


def _forget_parsed_settings() -> None:
    # Settings parsed once per process would otherwise keep the switches of before the scope.
    clear = getattr(settings_module.current, "cache_clear", None)
    if clear is not None:
        clear()


def _retire(overlay: Overlay) -> None:
    """Undo every patch; a hook that fires later (its module imported after the block) finds its
    entry no longer pending and does nothing."""
    overlay.revert_all()
    for entry in overlay.entries.values():
        if entry.state in (PENDING, APPLIED):
            entry.state, entry.reason = DISABLED, "scope exited"


@contextmanager
def overlay_scope(environ: Mapping[str, str] | None = None) -> Iterator[Scope]:
    """Plan and apply the overlay from ``environ``'s ``GOVINDA_*`` switches (default: this
    process's), yield a ``Scope``, and revert everything on exit, also when the block raises.
    Strict-mode errors (``GovindaStrictError``) propagate, after the same clean-up."""
    if getattr(bootstrap, "OVERLAY", None) is not None:
        raise OverlayScopeError("an overlay is already live in this process (sitecustomize or an enclosing scope); "
                                "scopes neither nest nor stack on it")
    environ = dict(os.environ if environ is None else environ)
    saved_logger = (list(_logger.handlers), _logger.level, _logger.propagate)
    scope = Scope(overlay=None)
    recorder = _Recorder(scope.records)
    previous_switches = _swap_switches(environ)
    _logger.addHandler(recorder)
    try:
        try:
            scope.overlay = bootstrap.on_vllm_imported(environ)
        finally:
            scope.overlay = scope.overlay or getattr(bootstrap, "OVERLAY", None)
        yield scope
    finally:
        try:
            if scope.overlay is not None:
                _retire(scope.overlay)
        finally:
            bootstrap.OVERLAY = None
            _logger.handlers[:] = saved_logger[0]
            _logger.setLevel(saved_logger[1])
            _logger.propagate = saved_logger[2]
            _swap_switches(previous_switches)
