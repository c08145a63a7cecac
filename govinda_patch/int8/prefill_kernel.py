"""Which kernel runs the prefill over the INT8 cache: our Triton kernel, or gather + FA3.

``fa3``: the prefill sequences' INT8 pages (whole context) are gather-dequantized into a transient
bf16/fp16 K/V buffer (``kernels/int8_kv_gather.py``) and vLLM's shipped FlashAttention-3 varlen
kernel attends over it (bottom-right causal mask, i.e. chunked prefill over a prefix). Decode
stays on our INT8 kernels. ``GOVINDA_PREFILL_KERNEL`` picks: ``auto`` takes the launch table's
``prefill_kernel`` if FA3 is importable and supported here, ``triton`` forces ours, and an
explicit ``fa3`` that is unavailable runs Triton with one warning (same cache, same accuracy
semantics; a performance preference never drops the INT8 cache).

FA3 is imported only when a builder or the self-test asks (never at start-up).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from ..settings import prefill_kernel as prefill_kernel_switch

logger = logging.getLogger("govinda")

TRITON = "triton"
FA3 = "fa3"
# FA3's head sizes (multiples of 8 up to 256) cover every head size the backend accepts.
FA3_MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class PrefillChoice:
    name: str  # TRITON | FA3
    varlen_attention: Optional[Callable]  # set for FA3 (the kernels' GatheredPrefill callable)
    description: str  # for the builder's one log line


def fa3_interface():
    """``(vllm.vllm_flash_attn.flash_attn_interface, "")`` when FA3 runs here, else ``(None, why not)``."""
    try:
        from vllm.vllm_flash_attn import flash_attn_interface as fa
    except Exception as exc:  # not built for this platform, missing CUDA libraries, ...
        return None, f"vllm.vllm_flash_attn is not importable ({type(exc).__name__}: {str(exc)[:120]})"
    try:
        if not fa.is_fa_version_supported(3):
            return None, f"FA3 is not supported here ({fa.fa_version_unsupported_reason(3)})"
    except Exception as exc:
        return None, f"FA3 support check failed ({type(exc).__name__}: {str(exc)[:120]})"
    return fa, ""


def fa3_varlen() -> tuple[Optional[Callable], str]:
    """vLLM's FA3 varlen function wrapped to the kernels' ``GatheredPrefill`` calling convention,
    or ``(None, why not)``."""
    fa, why_not = fa3_interface()
    if fa is None:
        return None, why_not

    def varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale):
        fa.flash_attn_varlen_func(
            q, k, v,
            max_seqlen_q=max_seqlen_q, cu_seqlens_q=cu_seqlens_q,
            max_seqlen_k=max_seqlen_k, cu_seqlens_k=cu_seqlens_k,
            softmax_scale=softmax_scale, causal=True, out=out, fa_version=3,
        )

    return varlen, "FA3 (vllm.vllm_flash_attn)"


def resolve(configs, head_dim: int, device, environ=None) -> PrefillChoice:
    """The prefill kernel for launch table ``configs`` on ``device`` under the switch."""
    import torch

    wanted = prefill_kernel_switch(environ)
    table_choice = getattr(configs, "prefill_kernel", TRITON)
    target = table_choice if wanted == "auto" else wanted
    if target == TRITON:
        origin = "GOVINDA_PREFILL_KERNEL=triton" if wanted == TRITON else f"table {configs.key}"
        return PrefillChoice(TRITON, None, f"triton ({origin})")
    why_not = ""
    if torch.device(device).type != "cuda" or torch.version.hip is not None:
        why_not = "FA3 needs an NVIDIA GPU"
    elif head_dim > FA3_MAX_HEAD_DIM or head_dim % 8:
        why_not = f"FA3 does not take head_dim {head_dim}"
    if not why_not:
        varlen, note = fa3_varlen()
        if varlen is not None:
            origin = "GOVINDA_PREFILL_KERNEL=fa3" if wanted == FA3 else f"table {configs.key}"
            return PrefillChoice(FA3, varlen, f"fa3 ({origin}): gather-dequantize INT8 pages to bf16 + {note}")
        why_not = note
    if wanted == FA3:
        logger.warning("GOVINDA_PREFILL_KERNEL=fa3 but %s; prefill runs on the Triton kernel", why_not)
    return PrefillChoice(TRITON, None, f"triton ({why_not})")
