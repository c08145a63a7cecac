"""Loading what the benches compare: our kernels from kernels/, and the installed vLLM's TRITON_ATTN
backend pieces (the run's :class:`~.session.Context` loads both; the contenders wrap them). It
imports no other module of this package, so :mod:`.session` and :mod:`.contenders` import in one
direction only: contenders -> session -> loaders."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def load_our_kernels() -> SimpleNamespace:
    from govinda_patch.kernel_package import import_kernel

    layout = import_kernel("int8_kv_layout")
    store = import_kernel("int8_kv_store")
    attention = import_kernel("int8_paged_attention")
    try:
        arch_key = import_kernel("launch_configs").arch_key()
    except Exception as error:  # informational only
        arch_key = f"unknown ({type(error).__name__}: {error})"
    return SimpleNamespace(
        layout=layout,
        rotation=import_kernel("kv_rotation"),
        store_kv_int8=store.store_kv_int8,
        paged_attention_int8=attention.paged_attention_int8,
        DecodeWorkspace=attention.DecodeWorkspace,
        GatheredPrefill=getattr(attention, "GatheredPrefill", None),
        # Optional helper (not part of the API contract): the split count a decode batch gets.
        decode_splits_for=getattr(attention, "decode_splits_for", None),
        arch_key=arch_key,
    )


def load_vllm() -> SimpleNamespace:
    """vLLM's TRITON_ATTN backend pieces, plus whether this vLLM has int8_per_token_head."""
    import inspect

    import vllm
    from vllm.v1.attention.backends import triton_attn

    int8pth_reason = None
    if "int8_per_token_head" not in getattr(
        triton_attn.TritonAttentionBackend, "supported_kv_cache_dtypes", ()
    ):
        int8pth_reason = (
            f"vLLM {vllm.__version__}: TritonAttentionBackend does not list "
            "'int8_per_token_head' among its supported kv-cache dtypes"
        )
    else:
        try:
            from vllm.v1.kv_cache_interface import KVQuantMode

            KVQuantMode.INT8_PER_TOKEN_HEAD  # noqa: B018 - presence check
        except (ImportError, AttributeError) as error:
            int8pth_reason = f"vLLM {vllm.__version__}: no KVQuantMode.INT8_PER_TOKEN_HEAD ({error})"

    def where(obj: Any) -> str:
        try:
            return f"{inspect.getsourcefile(obj)}:{obj.__qualname__}"
        except (TypeError, AttributeError):
            return repr(obj)

    provenance = {
        "attention": where(triton_attn.TritonAttentionImpl.forward),
        "attention_kernel_wrapper": where(triton_attn.unified_attention),
        "store": where(triton_attn.TritonAttentionImpl.do_kv_cache_update),
        "store_bf16_kernel_wrapper": where(triton_attn.triton_reshape_and_cache_flash),
    }
    if int8pth_reason is None:
        provenance["store_int8pth_kernel_wrapper"] = where(
            triton_attn.triton_reshape_and_cache_flash_per_token_head_quant
        )
        provenance["int8pth_scale_views"] = where(triton_attn.TritonAttentionImpl._ensure_scale_caches)
    return SimpleNamespace(
        version=vllm.__version__,
        module=triton_attn,
        backend=triton_attn.TritonAttentionBackend,
        impl_cls=triton_attn.TritonAttentionImpl,
        metadata_cls=triton_attn.TritonAttentionMetadata,
        int8pth_unavailable_reason=int8pth_reason,
        provenance=provenance,
    )
