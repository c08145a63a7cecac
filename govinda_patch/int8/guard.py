"""The ``kernel_selftest`` guard of the ``int8_kv`` group (``patches.yaml``): the INT8 kernels must
pass their cached self-test on this machine's device before any INT8 page reaches vLLM."""

from __future__ import annotations

from ..excerpt import clip
from ..guards import GuardVerdict


def kernel_selftest(settings) -> GuardVerdict:
    if settings.selftest == "skip":
        return GuardVerdict(True, "")
    from . import selftest  # looked up at call time: tests replace its functions

    try:
        verdict = selftest.cached_verdict(settings)
    except Exception as exc:
        verdict = {"ok": False, "reason": f"self-test could not run: {type(exc).__name__}: {clip(exc)}"}
    uncached = verdict.get("uncached")
    if not verdict.get("ok"):
        reason = clip(verdict.get("reason") or "unknown", 300) + (f" ({uncached})" if uncached else "")
        return GuardVerdict(False, f"kernel self-test failed: {reason}")
    passed = f"kernel self-test passed on {verdict.get('device')} ({clip(verdict.get('summary', ''), 300)})"
    if uncached:
        return GuardVerdict(True, passed, warning=f"{passed}, but {uncached}")
    return GuardVerdict(True, passed)
