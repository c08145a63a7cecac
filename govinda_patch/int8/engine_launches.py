"""Compile, in the background process, the kernel specializations a server's engine launches that
the self-test and the tuning do not (issue #29), so the engine loads them from the on-disk cache.

Triton compiles one kernel per specialization: the constexprs, the argument dtypes, and for each
pointer and integer whether it is divisible by 16 (or, for an integer, equal to 1). A cold H100
start (``bench.startup``, ``reports/h100/startup.md``) showed the engine still compiling three
of ours after the background had compiled twenty-two, and why:

- the store at the model's shape: the self-test stores at its own small shape, the tuning with
  the torch quantizer, so the engine's page constexprs were new;
- the decode with one split per (decode, KV head), which writes the output directly
  (``WRITE_OUTPUT``: vLLM's large CUDA-graph batch sizes); tuning times batches of 1 and 8 only;
- the gather (and any kernel taking the block table) with the block table's row stride in the
  other divisibility class: vLLM's table is ``cdiv(max_model_len, block_size)`` wide, the tuning's
  as wide as its own batches. Both classes are compiled here, or, where the launch's own
  ``--max-model-len`` fits one block, a table one block wide (Triton specializes an integer equal
  to 1): see :func:`table_widths`.

Every launch goes through the public entry points the engine calls, at the shape and with the
launch configs and rotation it will use; the results are discarded.
"""

from __future__ import annotations

import time
from typing import Dict, Optional, Sequence, Tuple

from ..kernel_package import import_kernel

# Block-table row widths, one of each 16-divisibility class of ``block_table.stride(0)``.
TABLE_WIDTHS = (16, 17)
# The largest batch searched for the one-split decode grid (vLLM captures graphs up to 512).
MAX_DECODES = 1024


def table_widths(block_size: int, max_model_len: Optional[int] = None) -> Tuple[int, ...]:
    """The block-table row widths to compile for: one block when the launch's explicit
    ``max_model_len`` (``launch_shape.max_model_len_arg``) fits one, else one width of each
    16-divisibility class (without it, the width is unknown but more than one block for any
    model whose context exceeds a block)."""
    if max_model_len is not None and 0 < max_model_len <= block_size:
        return (1,)
    return TABLE_WIDTHS


def one_split_decodes(num_kv_heads: int, num_sms: int, policy) -> int:
    """The smallest decode count whose grid has one split per (decode, KV head); 0 if none up to
    ``MAX_DECODES``."""
    splits = import_kernel("launch_configs").decode_num_splits
    return next((n for n in range(1, MAX_DECODES + 1) if splits(n, num_kv_heads, num_sms, policy) == 1), 0)


def compile_engine_launches(shape, device, configs, rotation: str, widths: Sequence[int] = TABLE_WIDTHS) -> Dict[str, float]:
    """Run the launches above for ``shape`` (a ``tuner.TuneShape``) with ``configs``, on block
    tables of each of ``widths`` (:func:`table_widths`); returns ``{"launches": n, "seconds": s}``.
    Raises what a launch raises (the caller reports it)."""
    import torch

    from . import prefill_kernel, prefill_warmup

    attention = import_kernel("int8_paged_attention")
    layout = import_kernel("int8_kv_layout")
    store = import_kernel("int8_kv_store")
    launch_configs = import_kernel("launch_configs")
    began = time.perf_counter()
    device = torch.device(device)
    dtype = shape.torch_dtype()
    bs, kv_heads, q_heads, head_dim = shape.block_size, shape.num_kv_heads, shape.num_q_heads, shape.head_dim
    cache = torch.zeros(layout.cache_shape(2, bs, kv_heads, head_dim), dtype=torch.int8, device=device)
    launches = 0

    # do_kv_cache_update: two tokens into page 1 (page 0 stays the padding page), the device table's store entry.
    key = torch.zeros((2, kv_heads, head_dim), dtype=dtype, device=device)
    slots = torch.tensor([bs, bs + 1], dtype=torch.int64, device=device)
    store.store_kv_int8(key, torch.zeros_like(key), cache, slots, block_size=bs, rotation=rotation)
    launches += 1

    common = dict(block_size=bs, num_kv_heads=kv_heads, softmax_scale=head_dim**-0.5, configs=configs, rotation=rotation)
    num_sms = launch_configs.sm_count(device, configs)
    wide = one_split_decodes(kv_heads, num_sms, configs.decode_splits)
    varlen = prefill_kernel.resolve(configs, head_dim, device).varlen_attention
    for width in widths:
        # Decode-only steps (the CUDA-graph captures): one decode (split KV) and, where the grid
        # has one split, the largest ones (the output written directly). One token each, in page 1.
        for decodes in sorted({1, wide} - {0}):
            query = torch.zeros((decodes, q_heads, head_dim), dtype=dtype, device=device)
            table = torch.zeros((decodes, width), dtype=torch.int32, device=device)
            table[:, 0] = 1
            attention.paged_attention_int8(
                query, cache, torch.empty_like(query), torch.arange(decodes + 1, dtype=torch.int32, device=device),
                torch.ones(decodes, dtype=torch.int32, device=device), table,
                max_query_len=1, max_seq_len=1, num_decodes=decodes, **common,
            )
            launches += 1
        # The engine's warm-up prefill (prefill_warmup.py) on a table of this width.
        table = torch.zeros((1, width), dtype=torch.int32, device=device)
        table[0, 0] = 1
        prefill_warmup.run_warmup_prefill(
            torch.empty((1, q_heads, head_dim), dtype=dtype, device=device), cache, table, varlen=varlen, **common)
        launches += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"launches": launches, "seconds": round(time.perf_counter() - began, 2)}
