"""Compile the prefill path's kernels during vLLM's warm-up, not in the first request.

vLLM warms up with decode-only batches (the CUDA-graph captures), so without this the first real
prefill compiles the gather kernel (or our Triton prefill) while a request waits; vLLM >= 0.26
logs that as "JIT compilation during inference". So the first forward of a layer that runs
outside a graph capture also runs one 2-token prefill of batch row 0 into scratch buffers,
through the path the builder picked (gather + FA3, or the Triton prefill). What decides Triton's
specialization is real: the layer's cache and block table, the launch configs, the rotation; the
query, output and sequence tensors are fresh allocations (16-byte aligned, like vLLM's buffers),
and the prefill kernels take the decode count as an unspecialized integer. The result is
discarded; the cache is only read.

Once per process for each distinct kernel set (layers of one shape share their kernels).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import torch

from ..kernel_package import import_kernel

logger = logging.getLogger("govinda")

_attention = import_kernel("int8_paged_attention")

# Query rows of the warm-up prefill: 2, so that vLLM's decode split (query_len 1) never takes it.
WARMUP_TOKENS = 2

_lock = threading.Lock()
_warmed: set = set()


def warmup_key(query: torch.Tensor, kv_cache: torch.Tensor, block_size: int, num_kv_heads: int,
               rotation: str, configs, varlen: Optional[Callable]) -> tuple:
    """What selects the compiled kernels (and so what a second warm-up would add nothing for)."""
    return (
        query.device, query.dtype, query.shape[1], query.shape[2], kv_cache.shape[1], block_size, num_kv_heads,
        rotation, id(configs), varlen is not None,
    )


def warm_prefill(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    num_kv_heads: int,
    softmax_scale: float,
    configs,
    rotation: str,
    varlen: Optional[Callable],
) -> bool:
    """Run the warm-up prefill unless one with the same kernels already ran; True when it ran."""
    key = warmup_key(query, kv_cache, block_size, num_kv_heads, rotation, configs, varlen)
    with _lock:
        if key in _warmed:
            return False
        _warmed.add(key)  # also on failure: a broken path is not retried on every layer
    start = time.perf_counter()
    plan = run_warmup_prefill(
        query, kv_cache, block_table, block_size=block_size, num_kv_heads=num_kv_heads,
        softmax_scale=softmax_scale, configs=configs, rotation=rotation, varlen=varlen,
    )
    logger.info(
        "INT8 prefill path warmed up (%s) in %.2f s",
        "gather + varlen kernel" if plan is not None else "Triton prefill", time.perf_counter() - start,
    )
    return True


def run_warmup_prefill(query, kv_cache, block_table, *, block_size, num_kv_heads, softmax_scale, configs, rotation,
                       varlen: Optional[Callable]):
    """One ``WARMUP_TOKENS``-token prefill of ``block_table``'s row 0 into scratch buffers shaped
    like ``query``'s rows, on gather + ``varlen`` when given, else the Triton prefill; returns the
    gathered-prefill plan (None on the Triton prefill). Also used by the background process
    (``engine_launches``) to compile the same specializations ahead of the engine."""
    device = query.device
    rows = torch.zeros((WARMUP_TOKENS,) + tuple(query.shape[1:]), dtype=query.dtype, device=device)
    output = torch.empty_like(rows)
    bounds = torch.tensor([0, WARMUP_TOKENS], dtype=torch.int32, device=device)
    seq_lens = torch.tensor([WARMUP_TOKENS], dtype=torch.int32, device=device)
    plan = None
    if varlen is not None:
        plan = _attention.GatheredPrefill(
            varlen_attention=varlen, cu_seqlens_k=bounds, cu_seqlens_q=bounds, total_k=WARMUP_TOKENS,
            max_seqlen_k=WARMUP_TOKENS, max_seqlen_q=WARMUP_TOKENS, num_prefill_tokens=WARMUP_TOKENS,
        )
    _attention.paged_attention_int8(
        rows, kv_cache, output, bounds, seq_lens, block_table[:1],
        block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=softmax_scale,
        max_query_len=WARMUP_TOKENS, max_seq_len=WARMUP_TOKENS, num_decodes=0, configs=configs,
        rotation=rotation, gathered_prefill=plan,
    )
    return plan


def reset() -> None:
    """Forget what was warmed (tests)."""
    with _lock:
        _warmed.clear()
