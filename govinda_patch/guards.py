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


@dataclass(frozen=True)
class GuardVerdict:
    ok: bool
    message: str  # why the group is off (ok False), or what was checked (ok True; logged at INFO)
    # A passed check the operator should still hear about (logged at WARNING; an error when strict).
    warning: Optional[str] = None


def run_guard(name: str, settings) -> GuardVerdict:
    module_name, _, function = GUARDS[name].partition(":")
    try:
        check = getattr(importlib.import_module(module_name), function)
        return check(settings)
    except Exception as exc:
        return GuardVerdict(False, f"guard {name} could not run: {type(exc).__name__}: {clip(exc)}")
