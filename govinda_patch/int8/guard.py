"""The ``kernel_selftest`` guard of the ``int8_kv`` group (``patches.yaml``): the INT8 kernels must
pass their cached self-test on this machine's device before any INT8 page reaches vLLM."""

from __future__ import annotations

from ..excerpt import clip
from ..guards import GuardVerdict


def kernel_selftest(settings) -> GuardVerdict:
    if settings.selftest == "skip":
        return GuardVerdict(True, "")
    from . import selftest, selftest_prefetch  # looked up at call time: tests replace their functions

    waited = 0.0
    try:
        waited = selftest_prefetch.wait(settings)  # a background self-test writes the verdict read next
        verdict = selftest.cached_verdict(settings)
    except Exception as exc:
        verdict = {"ok": False, "reason": f"self-test could not run: {type(exc).__name__}: {clip(exc)}"}
    # What went wrong with the cache (the operator should hear it), and what only explains.
    problems = "; ".join(clip(verdict[key], 600) for key in ("uncached", "cache_problem") if verdict.get(key))
    lock_note = verdict.get("lock_note")
    if verdict.get("ok") is not True:
        reason = clip(verdict.get("reason") or "unknown", 300) + (f" ({problems})" if problems else "")
        return GuardVerdict(False, f"kernel self-test failed: {reason}")
    passed = f"kernel self-test passed on {clip(verdict.get('device'), 200)} ({clip(verdict.get('summary', ''), 300)})"
    if lock_note:
        passed += f"; {clip(lock_note, 300)}"
    if waited >= 0.1:
        passed += f"; waited {waited:.1f} s for the background self-test"
    if problems:
        return GuardVerdict(True, passed, warning=f"{passed}, but {problems}")
    return GuardVerdict(True, passed)
