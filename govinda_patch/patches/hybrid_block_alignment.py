"""Make vLLM's hybrid attention/mamba page alignment count INT8 page bytes.

Two targets, one per vLLM line (see patches.yaml):
- 0.18: ``HybridAttentionMambaModelConfig.verify_and_update_config`` (runs where the config is
  built, i.e. the API-server process, before any layer exists) sizes one attention token with the
  module-level ``FullAttentionSpec``; when vLLM's platform selects our backend for the model's
  attention layers (asked as its selector asks), that name builds our INT8 spec during the call.
- 0.26 and later: ``Platform._align_hybrid_block_size(vllm_config, backend_cls)`` (worker) is told the selected
  backend; only when it is ours, 0.26 runs it with vLLM's native ``int8_per_token_head`` accounting, whose
  page is byte-for-byte ours (2*H*(D+4) per token), by setting that cache dtype during the call;
  0.33 sizes the token through the backend's ``customize_spec`` (ours returns the INT8 spec).
"""

from __future__ import annotations

import logging

logger = logging.getLogger("govinda")


def _int8_spec_factory(stock_spec_cls):
    from govinda_patch.int8.kv_spec import int8_spec_for

    def build(**kwargs):
        return int8_spec_for(stock_spec_cls(**kwargs))

    return build


def _log_result(cache_config) -> None:
    logger.info(
        "hybrid alignment with INT8 pages: attention block_size=%d, mamba page padded to %s B",
        cache_config.block_size,
        cache_config.mamba_page_size_padded,
    )


def _wrap_config_verifier(ctx) -> None:
    config_module = ctx.module
    from govinda_patch.excerpt import clip
    from govinda_patch.int8 import selection
    from govinda_patch.int8.kv_spec import int8_serves_model

    def align_with_int8_pages(wrapped, instance, args, kwargs):
        vllm_config = args[0] if args else kwargs["vllm_config"]
        serves, _ = int8_serves_model(
            vllm_config.model_config, vllm_config.cache_config, vllm_config.attention_config.backend
        )
        if not serves or not ctx.group_active():
            return wrapped(*args, **kwargs)
        # No layer exists yet: ask vLLM's platform which backend its attention layers will get.
        what, stock = "the attention layers of this hybrid model", "the hybrid page alignment stays stock"
        config = None
        try:
            config = selection.selector_config(vllm_config)
            selected = selection.predicted_backend(vllm_config, config)
        except Exception as exc:  # whatever it is, pages stay stock and the line says why
            selection.warn_not_selected(None, what, stock, why=f"vLLM's selection could not be asked ({type(exc).__name__}: {clip(exc, 300)})")
            return wrapped(*args, **kwargs)
        if not selection.is_int8(selected):
            selection.warn_not_selected(selected, what, stock, config=config)
            return wrapped(*args, **kwargs)
        stock_spec_cls = config_module.FullAttentionSpec
        config_module.FullAttentionSpec = _int8_spec_factory(stock_spec_cls)
        try:
            result = wrapped(*args, **kwargs)
        finally:
            config_module.FullAttentionSpec = stock_spec_cls
        _log_result(vllm_config.cache_config)
        return result

    ctx.record.wrap(ctx.owner, ctx.attribute, align_with_int8_pages)


def _sizes_token_through_backend() -> bool:
    """vLLM >= 0.33 sizes the attention token with ``backend_cls.customize_spec``."""
    from vllm.v1.attention.backend import AttentionBackend

    return "customize_spec" in vars(AttentionBackend)


def _wrap_platform_aligner(ctx) -> None:
    from govinda_patch.int8 import selection
    from govinda_patch.int8.kv_spec import int8_serves_model

    def align_with_int8_pages(wrapped, instance, args, kwargs):
        vllm_config = args[0] if args else kwargs["vllm_config"]
        backend_cls = args[1] if len(args) > 1 else kwargs["backend_cls"]
        if not selection.is_int8(backend_cls):
            serves, _ = int8_serves_model(
                vllm_config.model_config, vllm_config.cache_config, vllm_config.attention_config.backend
            )
            if serves and ctx.group_active():
                selection.warn_not_selected(
                    backend_cls, "the attention layers of this hybrid model", "the hybrid page alignment stays stock", vllm_config
                )
            return wrapped(*args, **kwargs)
        if not ctx.group_active():
            return wrapped(*args, **kwargs)
        cache_config = vllm_config.cache_config
        if _sizes_token_through_backend():
            # Our customize_spec answers with the INT8 page; 0.33's int8_per_token_head page no
            # longer counts the scales, so the cache dtype is left alone.
            result = wrapped(*args, **kwargs)
        else:
            stock_dtype = cache_config.cache_dtype
            cache_config.cache_dtype = "int8_per_token_head"
            try:
                result = wrapped(*args, **kwargs)
            finally:
                cache_config.cache_dtype = stock_dtype
        _log_result(cache_config)
        return result

    ctx.record.wrap(ctx.owner, ctx.attribute, align_with_int8_pages)


def apply(ctx) -> None:
    if ctx.attribute == "verify_and_update_config":
        _wrap_config_verifier(ctx)
    elif ctx.attribute == "_align_hybrid_block_size":
        _wrap_platform_aligner(ctx)
    else:
        raise ValueError(f"no alignment strategy for target {ctx.target.label}")
