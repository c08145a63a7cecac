"""Report an INT8 page (data + fp32 scales) for attention layers served by the Govinda backend."""

from __future__ import annotations

import logging

from govinda_patch.int8 import selection
from govinda_patch.int8.kv_spec import check_hybrid_pages, int8_serves_layer, int8_spec_for

logger = logging.getLogger("govinda")


def apply(ctx) -> None:
    logged: list[bool] = []

    def int8_kv_cache_spec(wrapped, instance, args, kwargs):
        spec = wrapped(*args, **kwargs)
        if spec is None:
            return spec
        vllm_config = args[0] if args else kwargs["vllm_config"]
        # Name check first: importing the backend module here is only safe once vLLM is loaded.
        impl = getattr(instance, "impl", None)
        ours = type(impl).__name__ == "GovindaInt8AttentionImpl"
        if ours:
            from govinda_patch.int8.backend import GovindaInt8AttentionImpl

            ours = isinstance(impl, GovindaInt8AttentionImpl)
        if not ours:
            # The page follows the backend vLLM selected for this layer: stock, and one line if
            # the INT8 backend would have served it.
            if int8_serves_layer(vllm_config, spec) and ctx.group_active():
                selection.warn_not_selected(
                    instance.get_attn_backend() if hasattr(instance, "get_attn_backend") else None,
                    f"layer {getattr(instance, 'layer_name', '?')}",
                    f"its KV cache keeps stock {spec.dtype} pages",
                    vllm_config,
                )
            return spec
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
