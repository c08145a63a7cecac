"""The INT8 backend first in a platform's attention-backend priority list (vLLM's or a plugin's)."""

from __future__ import annotations

import inspect
import sys
from typing import Callable


def clear_selector_cache() -> None:
    # The selector memoizes its answer; a late patch (or a revert) must not be hidden by it.
    selector = sys.modules.get("vllm.v1.attention.selector")
    cached = getattr(selector, "_cached_get_attn_backend", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def flags_by_name(function) -> Callable:
    """``(args, kwargs) -> (use_mla, use_sparse)`` read by parameter name (vLLM's signatures
    differ between releases: rocm takes use_mla, use_sparse; cuda use_mla, device_capability, ...)."""
    signature = inspect.signature(function)

    def read(args, kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        return bool(bound.get("use_mla")), bool(bound.get("use_sparse"))

    return read


def lead_with_int8(ctx, read_flags: Callable) -> None:
    """Wrap ``ctx.owner.<ctx.attribute>`` so that, for non-MLA, non-sparse attention while the group
    is active, it returns a new list ``[CUSTOM, *stock]``. The stock functions are often
    ``functools.cache``'d, so the list they return is never mutated."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    custom = AttentionBackendEnum.CUSTOM

    def prefer_int8_backend(wrapped, instance, args, kwargs):
        priorities = wrapped(*args, **kwargs)
        use_mla, use_sparse = read_flags(args, kwargs)
        if use_mla or use_sparse or not ctx.group_active():
            return priorities
        return [custom] + [backend for backend in priorities if backend != custom]

    ctx.record.on_revert(clear_selector_cache)  # runs after the unwrap (undo is LIFO)
    ctx.record.wrap(ctx.owner, ctx.attribute, prefer_int8_backend)
    clear_selector_cache()
