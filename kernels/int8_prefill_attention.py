"""Causal prefill (and chunked-prefill) attention over the INT8 paged cache.

:func:`prefill_attention_kernel`, grid ``(num_q_heads, T // BLOCK_M + num_prefill_seqs)``: each
program finds its sequence by binary search over ``query_start_loc``. KV tiles that every query
row of the tile may see run in a loop without any masking; only the tiles touching the causal
diagonal (or the end of the sequence) are masked, and tiles past the causal limit are never
visited.

The kernel is unrotated: with a rotated cache the host runs it between two row-rotation passes
(:mod:`int8_paged_attention`). Rotating ``[BLOCK_M, D]`` tiles inside this kernel raised its
register pressure for the whole KV loop (reports/h200/h200-kv-rotation.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .int8_attention_tiles import dot_operand, load_kv_tile

__all__ = ["prefill_attention_kernel"]


@triton.jit
def _attend_tile(
    q,
    k,
    v,
    k_scale,
    v_scale,
    m_i,
    l_i,
    acc,
    qk_scale,
    query_positions,
    kv_positions,
    CAUSAL_MASK: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """One online-softmax step of a query tile against one KV tile."""
    s = tl.dot(q, tl.trans(dot_operand(k, DOT_DTYPE, UPCAST_DOT)))
    s = s * (k_scale * qk_scale)[None, :]
    if CAUSAL_MASK:
        s = tl.where(kv_positions[None, :] <= query_positions[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row can see nothing in this tile and before it only if its position is < 0
        # (inconsistent metadata); keep it NaN-free.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_ref = m_new
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    acc = tl.dot(
        dot_operand(p * v_scale[None, :], DOT_DTYPE, UPCAST_DOT), dot_operand(v, DOT_DTYPE, UPCAST_DOT), acc
    )
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["num_decodes", "num_seqs", "num_q_blocks"])
def prefill_attention_kernel(
    query_ptr,
    output_ptr,
    cache_ptr,
    cache_f32_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    qk_scale,
    num_decodes,
    num_seqs,
    num_q_blocks,
    stride_q_token,
    stride_q_head,
    stride_q_dim,
    stride_o_token,
    stride_o_head,
    stride_o_dim,
    stride_cache_block,
    stride_cache_block_f32,
    stride_block_table,
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    V_DATA_OFFSET: tl.constexpr,
    K_SCALE_OFFSET_F32: tl.constexpr,
    V_SCALE_OFFSET_F32: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    head = tl.program_id(0)  # fastest-varying: the heads of one KV group share K/V in L2
    # Last query blocks first: late blocks of a sequence see the most KV (less tail effect).
    q_block = num_q_blocks - 1 - tl.program_id(1)

    # Sequence s owns query blocks [first_block(s), first_block(s + 1)) with
    # first_block(s) = (query_start_loc[s] - prefill_start) // BLOCK_M + (s - num_decodes).
    prefill_start = tl.load(query_start_loc_ptr + num_decodes)
    low = num_decodes
    high = num_seqs
    while low < high:
        mid = (low + high) // 2
        mid_first_block = (tl.load(query_start_loc_ptr + mid) - prefill_start) // BLOCK_M + (mid - num_decodes)
        if mid_first_block <= q_block:
            low = mid + 1
        else:
            high = mid
    seq = low - 1

    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    first_block = (query_start - prefill_start) // BLOCK_M + (seq - num_decodes)
    row_start = (q_block - first_block) * BLOCK_M
    if row_start >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    rows = row_start + tl.arange(0, BLOCK_M)
    row_valid = rows < query_len
    dims = tl.arange(0, HEAD_DIM)
    tokens = query_start.to(tl.int64) + rows
    q = tl.load(
        query_ptr + tokens[:, None] * stride_q_token + head * stride_q_head + dims[None, :] * stride_q_dim,
        mask=row_valid[:, None],
        other=0.0,
    )
    q = dot_operand(q, DOT_DTYPE, UPCAST_DOT)
    kv_head = head // GROUP
    block_table_row = block_table_ptr + seq.to(tl.int64) * stride_block_table

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    first_query_position = context_len + row_start
    # KV positions 0..first_query_position are visible to every row of this tile.
    num_unmasked_tiles = tl.maximum(first_query_position + 1, 0) // BLOCK_N
    kv_end = tl.minimum(first_query_position + BLOCK_M, seq_len)
    num_tiles = tl.cdiv(tl.maximum(kv_end, 0), BLOCK_N)
    query_positions = first_query_position + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)

    # Tiles every row of this query tile sees in full: no masks.
    for tile in range(0, num_unmasked_tiles):
        kv_positions = tile * BLOCK_N + offs_n
        k, v, k_scale, v_scale = load_kv_tile(
            cache_ptr, cache_f32_ptr, block_table_row, kv_positions, kv_positions, kv_head,  # valid: unused
            stride_cache_block, stride_cache_block_f32,
            BLOCK_SIZE, HEAD_DIM, V_DATA_OFFSET, K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32, False,
        )
        m_i, l_i, acc = _attend_tile(
            q, k, v, k_scale, v_scale, m_i, l_i, acc, qk_scale, query_positions, kv_positions, False, DOT_DTYPE, UPCAST_DOT
        )
    # The tiles on the causal diagonal or at the end of the sequence.
    for tile in range(num_unmasked_tiles, num_tiles):
        kv_positions = tile * BLOCK_N + offs_n
        k, v, k_scale, v_scale = load_kv_tile(
            cache_ptr, cache_f32_ptr, block_table_row, kv_positions, kv_positions < kv_end, kv_head,
            stride_cache_block, stride_cache_block_f32,
            BLOCK_SIZE, HEAD_DIM, V_DATA_OFFSET, K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32, True,
        )
        m_i, l_i, acc = _attend_tile(
            q, k, v, k_scale, v_scale, m_i, l_i, acc, qk_scale, query_positions, kv_positions, True, DOT_DTYPE, UPCAST_DOT
        )

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        output_ptr + tokens[:, None] * stride_o_token + head * stride_o_head + dims[None, :] * stride_o_dim,
        out.to(output_ptr.dtype.element_ty),
        mask=row_valid[:, None],
    )
