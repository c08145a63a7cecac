"""Device-side pieces both INT8 attention kernels share (decode: :mod:`int8_decode_attention`,
prefill: :mod:`int8_prefill_attention`): loading one KV tile of the paged INT8 cache
(:mod:`int8_kv_layout`) and rounding a ``tl.dot`` operand to the query dtype.

K and V tiles stay int8 with their fp32 scales beside them: the kernels multiply the scales
into score and probability columns, never into the tiles (see :mod:`int8_paged_attention`).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["dot_operand", "load_kv_tile"]


@triton.jit
def dot_operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """``x`` rounded to the dot's input dtype; with ``UPCAST`` (interpreter only) held in fp32.

    Triton's CPU interpreter multiplies bf16 tensors as raw uint16 bits and casts int8 to
    bf16 wrongly, so there the operands go to fp32 after the same rounding: the products
    and fp32 accumulation are those of a bf16/fp16 tensor-core dot.
    """
    if UPCAST:
        if x.dtype.is_int8():
            return x.to(tl.float32)  # int8 -> bf16/fp16 is exact
        return x.to(DTYPE).to(tl.float32)
    return x.to(DTYPE)


@triton.jit
def load_kv_tile(
    cache_ptr,
    cache_f32_ptr,
    block_table_row_ptr,
    positions,
    valid,
    kv_head,
    stride_cache_block,
    stride_cache_block_f32,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_DATA_OFFSET: tl.constexpr,
    K_SCALE_OFFSET_F32: tl.constexpr,
    V_SCALE_OFFSET_F32: tl.constexpr,
    MASKED: tl.constexpr,
):
    """int8 K and V ``[N, D]`` and their fp32 scales ``[N]`` for KV ``positions`` of one head.

    Every token is looked up in the block table on its own, so a tile may straddle pages
    (block sizes need not be multiples of the tile). A page stores one head's tokens as
    contiguous ``D``-byte rows, so each row is one wide load.
    """
    dims = tl.arange(0, HEAD_DIM)
    if MASKED:
        block = tl.load(block_table_row_ptr + positions // BLOCK_SIZE, mask=valid, other=0)
    else:
        block = tl.load(block_table_row_ptr + positions // BLOCK_SIZE)
    block = block.to(tl.int64)
    row = kv_head * BLOCK_SIZE + positions % BLOCK_SIZE  # (head, token) row inside the page
    data_offsets = block * stride_cache_block + row * HEAD_DIM
    scale_offsets = block * stride_cache_block_f32 + row
    k_ptrs = cache_ptr + data_offsets[:, None] + dims[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=valid[:, None], other=0)
        v = tl.load(k_ptrs + V_DATA_OFFSET, mask=valid[:, None], other=0)
        k_scale = tl.load(cache_f32_ptr + scale_offsets + K_SCALE_OFFSET_F32, mask=valid, other=0.0)
        v_scale = tl.load(cache_f32_ptr + scale_offsets + V_SCALE_OFFSET_F32, mask=valid, other=0.0)
    else:
        k = tl.load(k_ptrs)
        v = tl.load(k_ptrs + V_DATA_OFFSET)
        k_scale = tl.load(cache_f32_ptr + scale_offsets + K_SCALE_OFFSET_F32)
        v_scale = tl.load(cache_f32_ptr + scale_offsets + V_SCALE_OFFSET_F32)
    return k, v, k_scale, v_scale
