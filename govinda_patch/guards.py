"""Group guards: a check a group declares in ``patches.yaml`` (``guard: NAME``) that must pass
once per process before the group may take effect (e.g. a kernel self-test on the real device).

The loader knows a guard only by its name and the dotted path below; the check itself lives in
its feature. A guard never raises into the caller: an error is a failed verdict.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from .excerpt import clip

# name -> "module:function"; the function takes the process's Settings and returns a GuardVerdict.
GUARDS = {
    "kernel_selftest": "govinda_patch.int8.guard:kernel_selftest",
}
# name -> (starter, waiter), "module:function" each: work a guard may begin as soon as vLLM is
# imported (starter(settings) -> a note to log, or None) and what every process must wait for
# before vLLM's worker touches the device (waiter(settings) -> seconds waited).
EARLY_STARTS = {
    "kernel_selftest": (
        "govinda_patch.int8.selftest_prefetch:start",
        "govinda_patch.int8.selftest_prefetch:wait_before_device",
    ),
}


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    message: str  # why the group is off (ok False), or what was checked (ok True; logged at INFO)
    # A passed check the operator should still hear about (logged at WARNING; an error when strict).
    warning: Optional[str] = None


def _resolve(path: str):
    module_name, _, function = path.partition(":")
    return getattr(importlib.import_module(module_name), function)


def start_early(name: str, settings):
    """Begin guard ``name``'s early work; return (note or None, waiter) or None if it has none.
    Raises what the starter raises (the caller decides: the guard then runs inline)."""
    if name not in EARLY_STARTS:
        return None
    starter, waiter = (_resolve(path) for path in EARLY_STARTS[name])
    return starter(settings), waiter


def run_guard(name: str, settings) -> GuardVerdict:
    try:
        check = _resolve(GUARDS[name])
        return check(settings)
    except Exception as exc:
        return GuardVerdict(False, f"guard {name} could not run: {type(exc).__name__}: {clip(exc)}")
