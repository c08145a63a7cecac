"""Report an INT8 page (data + fp32 scales) for attention layers served by the Govinda backend."""

from __future__ import annotations

import logging

logger = logging.getLogger("govinda")


def int8_spec_for(spec):
    """The plain FullAttentionSpec whose page is 2*B*H*(D+4) int8 bytes (see int8_backend)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from govinda_patch.int8_kv import spec_head_size

    # Exact type on purpose: vLLM 0.18 looks up KV managers by exact spec type.
    if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
        raise TypeError(f"Govinda INT8 attention only serves full attention layers, got {spec!r}")
    return FullAttentionSpec(
        block_size=spec.block_size,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec_head_size(spec.head_size),
        head_size_v=spec_head_size(spec.head_size),
        dtype=torch.int8,
    )


def check_hybrid_pages(vllm_config, spec, exact: bool) -> None:
    """The padded mamba page must be a whole number of INT8 attention pages (vLLM unifies page
    sizes by growing the attention block), and exactly one page once the block size is final."""
    padded_mamba_page = vllm_config.cache_config.mamba_page_size_padded
    if padded_mamba_page is None:
        return
    page = spec.page_size_bytes
    if (padded_mamba_page != page) if exact else (padded_mamba_page % page != 0):
        raise RuntimeError(
            f"INT8 attention page ({page} B at block {spec.block_size}) and the padded mamba page "
            f"({padded_mamba_page} B) disagree: the hybrid block alignment did not use INT8 page "
            "sizes in the process that configured vLLM"
        )


def apply(ctx) -> None:
    logged: list[bool] = []

    def int8_kv_cache_spec(wrapped, instance, args, kwargs):
        spec = wrapped(*args, **kwargs)
        # Name check first: importing the backend module here is only safe once vLLM is loaded.
        impl = getattr(instance, "impl", None)
        if spec is None or type(impl).__name__ != "GovindaInt8AttentionImpl":
            return spec
        from govinda_patch.int8_backend import GovindaInt8AttentionImpl

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
