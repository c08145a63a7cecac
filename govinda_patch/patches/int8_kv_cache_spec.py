"""Report an INT8 page (data + fp32 scales) for attention layers served by the Govinda backend."""

from __future__ import annotations

import logging

from govinda_patch.int8.kv_spec import check_hybrid_pages, int8_spec_for

logger = logging.getLogger("govinda")


def apply(ctx) -> None:
    logged: list[bool] = []

    def int8_kv_cache_spec(wrapped, instance, args, kwargs):
        spec = wrapped(*args, **kwargs)
        # Name check first: importing the backend module here is only safe once vLLM is loaded.
        impl = getattr(instance, "impl", None)
        if spec is None or type(impl).__name__ != "GovindaInt8AttentionImpl":
            return spec
        from govinda_patch.int8.backend import GovindaInt8AttentionImpl

        if not isinstance(impl, GovindaInt8AttentionImpl):
            return spec
        vllm_config = args[0] if args else kwargs["vllm_config"]
        int8_spec = int8_spec_for(spec)
        check_hybrid_pages(vllm_config, int8_spec, exact=False)
        if not logged:
            logged.append(True)
            logger.info(
                "INT8 KV spec: %d B per token (stock %s: %d B), block_size=%d before page unification",
                int8_spec.page_size_bytes // int8_spec.block_size,
                spec.dtype,
                spec.page_size_bytes // spec.block_size,
                int8_spec.block_size,
            )
        return int8_spec

    ctx.record.wrap(ctx.owner, ctx.attribute, int8_kv_cache_spec)
