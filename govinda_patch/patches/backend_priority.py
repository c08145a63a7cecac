"""Put the CUSTOM (Govinda INT8) backend first in a platform's attention-backend priorities."""

from __future__ import annotations

import inspect
import sys


def _clear_selector_cache() -> None:
    # The selector memoizes its answer; a late patch (or a revert) must not be hidden by it.
    selector = sys.modules.get("vllm.v1.attention.selector")
    cached = getattr(selector, "_cached_get_attn_backend", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def apply(ctx) -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    custom = AttentionBackendEnum.CUSTOM
    # Signatures differ between vLLM releases (rocm: use_mla, use_sparse; cuda: use_mla,
    # device_capability, num_heads): read the flags by name.
    signature = inspect.signature(getattr(ctx.owner, ctx.attribute))

    def prefer_int8_backend(wrapped, instance, args, kwargs):
        # The CUDA original is functools.cache'd: never mutate the list it returns.
        priorities = wrapped(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs).arguments
        if bound.get("use_mla") or bound.get("use_sparse") or not ctx.group_active():
            return priorities
        return [custom] + [backend for backend in priorities if backend != custom]

    ctx.record.on_revert(_clear_selector_cache)  # runs after the unwrap (undo is LIFO)
    ctx.record.wrap(ctx.owner, ctx.attribute, prefer_int8_backend)
    _clear_selector_cache()
