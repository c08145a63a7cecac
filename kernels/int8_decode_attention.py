"""Split-KV ("flash-decoding") attention of single-token decodes over the INT8 paged cache.

:func:`decode_split_kernel`, grid ``(num_decodes, num_kv_heads, num_splits)``: one program holds
all query heads of a KV group (padded to 16 for ``tl.dot``; they are the columns of transposed
products, see the kernel) and walks a contiguous range of KV tiles computed in-kernel from
``seq_lens``, so the grid depends on ``num_decodes`` only (CUDA-graph capturable) and the time
grows with the KV bytes read. Partial (acc, max, sum) go to the host's ``DecodeWorkspace``;
:func:`decode_reduce_kernel` merges them. With a single split the decode kernel writes the
output itself.

Rotation (``ROTATE``): the query rows are rotated in fp32 (then rounded to the query dtype)
before the KV loop and the fp32 accumulator back after it (:mod:`kv_rotation`); split-KV partial
accumulators are rotated back before they are written (the reduce step is linear in them).

Launched by :mod:`int8_paged_attention`, which picks the tile and split count.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .int8_attention_tiles import dot_operand, load_kv_tile
from .kv_rotation import hadamard_rows

__all__ = ["decode_split_kernel", "decode_reduce_kernel"]


@triton.jit
def _decode_tile(
    q_t, k, v, k_scale, v_scale, valid, m_i, l_i, acc_t, qk_scale, DOT_DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr
):
    """One online-softmax step of a decode, transposed: the group's query heads are columns."""
    s_t = tl.dot(dot_operand(k, DOT_DTYPE, UPCAST_DOT), q_t)  # [BLOCK_N, GROUP_PAD]
    s_t = s_t * (k_scale * qk_scale)[:, None]
    s_t = tl.where(valid[:, None], s_t, float("-inf"))
    # Every tile of a split's range holds a valid position, so m_new is finite.
    m_new = tl.maximum(m_i, tl.max(s_t, axis=0))
    alpha = tl.exp2(m_i - m_new)
    p_t = tl.exp2(s_t - m_new[None, :])
    l_i = l_i * alpha + tl.sum(p_t, axis=0)
    acc_t = acc_t * alpha[None, :]
    acc_t = tl.dot(
        tl.trans(dot_operand(v, DOT_DTYPE, UPCAST_DOT)),
        dot_operand(p_t * v_scale[:, None], DOT_DTYPE, UPCAST_DOT),
        acc_t,
    )
    return m_new, l_i, acc_t


@triton.jit(do_not_specialize=["num_tokens", "num_splits"])
def decode_split_kernel(
    query_ptr,
    output_ptr,
    cache_ptr,
    cache_f32_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_table_ptr,
    partial_acc_ptr,  # fp32 [entries * NUM_Q_HEADS, HEAD_DIM]; entry = seq * num_splits + split
    partial_max_ptr,  # fp32 [entries * NUM_Q_HEADS]  (base-2 running max)
    partial_sum_ptr,  # fp32 [entries * NUM_Q_HEADS]
    qk_scale,  # softmax_scale * log2(e)
    num_tokens,
    num_splits,
    stride_q_token,
    stride_q_head,
    stride_q_dim,
    stride_o_token,
    stride_o_head,
    stride_o_dim,
    stride_cache_block,
    stride_cache_block_f32,
    stride_block_table,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_TILES_PER_SPLIT: tl.constexpr,
    V_DATA_OFFSET: tl.constexpr,
    K_SCALE_OFFSET_F32: tl.constexpr,
    V_SCALE_OFFSET_F32: tl.constexpr,
    WRITE_OUTPUT: tl.constexpr,  # single split: normalise and write the output directly
    PREFETCH_NEXT_TILE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # the query dtype (tl.bfloat16 / tl.float16)
    UPCAST_DOT: tl.constexpr,
    ROTATE: tl.constexpr,
    LOG2_HEAD_DIM: tl.constexpr,
    ROTATION_NORM: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    query_start = tl.load(query_start_loc_ptr + seq)
    query_end = tl.load(query_start_loc_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    # CUDA-graph padding (query_len 0) or a malformed entry: touch nothing.
    if (query_end - query_start != 1) | (query_start < 0) | (query_start >= num_tokens):
        return
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(num_tiles, num_splits), MIN_TILES_PER_SPLIT)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    # The group's query heads are the columns: everything below is transposed
    # (S^T = K Q^T, O^T = V^T P^T) so that the KV tile -- the big operand -- is the left-hand
    # one and M = BLOCK_N / HEAD_DIM is large enough for wgmma on sm90 (with the group as M,
    # Triton fell back to mma.sync and read the int8 V tile from shared memory byte by byte).
    cols = tl.arange(0, GROUP_PAD)
    col_valid = cols < GROUP
    heads = kv_head * GROUP + cols
    dims = tl.arange(0, HEAD_DIM)
    token = query_start.to(tl.int64)
    entry = (seq.to(tl.int64) * num_splits + split) * NUM_Q_HEADS + heads
    if tile_lo >= tile_hi:
        # More splits than tiles (or seq_len 0): mark the split empty for the reduce kernel.
        if not WRITE_OUTPUT:
            tl.store(partial_max_ptr + entry, tl.full([GROUP_PAD], float("-inf"), tl.float32), mask=col_valid)
            tl.store(partial_sum_ptr + entry, tl.zeros([GROUP_PAD], tl.float32), mask=col_valid)
        return

    if ROTATE:
        q = tl.load(
            query_ptr + token * stride_q_token + heads[:, None] * stride_q_head + dims[None, :] * stride_q_dim,
            mask=col_valid[:, None],
            other=0.0,
        )  # [GROUP_PAD, HEAD_DIM]
        q_t = tl.trans(hadamard_rows(q.to(tl.float32), GROUP_PAD, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM))
    else:
        q_t = tl.load(
            query_ptr + token * stride_q_token + heads[None, :] * stride_q_head + dims[:, None] * stride_q_dim,
            mask=col_valid[None, :],
            other=0.0,
        )  # [HEAD_DIM, GROUP_PAD]
    q_t = dot_operand(q_t, DOT_DTYPE, UPCAST_DOT)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc_t = tl.zeros([HEAD_DIM, GROUP_PAD], dtype=tl.float32)
    block_table_row = block_table_ptr + seq.to(tl.int64) * stride_block_table
    if PREFETCH_NEXT_TILE:
        # Software pipelining by hand: the next tile's block-table entries and K/V bytes are in
        # flight while this tile's dots and softmax run (num_stages > 1 would stage through
        # shared memory and costs more registers than this). Past the split's last tile the
        # mask is all false, so no bytes of the next split are read.
        positions = tile_lo * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = positions < seq_len
        k, v, k_scale, v_scale = load_kv_tile(
            cache_ptr, cache_f32_ptr, block_table_row, positions, valid, kv_head,
            stride_cache_block, stride_cache_block_f32,
            BLOCK_SIZE, HEAD_DIM, V_DATA_OFFSET, K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32, True,
        )
        for tile in range(tile_lo, tile_hi):
            next_positions = positions + BLOCK_N
            next_valid = (next_positions < seq_len) & (tile + 1 < tile_hi)
            next_k, next_v, next_k_scale, next_v_scale = load_kv_tile(
                cache_ptr, cache_f32_ptr, block_table_row, next_positions, next_valid, kv_head,
                stride_cache_block, stride_cache_block_f32,
                BLOCK_SIZE, HEAD_DIM, V_DATA_OFFSET, K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32, True,
            )
            m_i, l_i, acc_t = _decode_tile(
                q_t, k, v, k_scale, v_scale, valid, m_i, l_i, acc_t, qk_scale, DOT_DTYPE, UPCAST_DOT
            )
            k, v, k_scale, v_scale = next_k, next_v, next_k_scale, next_v_scale
            positions, valid = next_positions, next_valid
    else:
        for tile in range(tile_lo, tile_hi):
            positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = positions < seq_len
            k, v, k_scale, v_scale = load_kv_tile(
                cache_ptr, cache_f32_ptr, block_table_row, positions, valid, kv_head,
                stride_cache_block, stride_cache_block_f32,
                BLOCK_SIZE, HEAD_DIM, V_DATA_OFFSET, K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32, True,
            )
            m_i, l_i, acc_t = _decode_tile(
                q_t, k, v, k_scale, v_scale, valid, m_i, l_i, acc_t, qk_scale, DOT_DTYPE, UPCAST_DOT
            )

    if ROTATE:
        acc_t = tl.trans(hadamard_rows(tl.trans(acc_t), GROUP_PAD, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM))
    if WRITE_OUTPUT:
        out_t = acc_t / l_i[None, :]
        tl.store(
            output_ptr + token * stride_o_token + heads[None, :] * stride_o_head + dims[:, None] * stride_o_dim,
            out_t.to(output_ptr.dtype.element_ty),
            mask=col_valid[None, :],
        )
    else:
        tl.store(partial_acc_ptr + entry[None, :] * HEAD_DIM + dims[:, None], acc_t, mask=col_valid[None, :])
        tl.store(partial_max_ptr + entry, m_i, mask=col_valid)
        tl.store(partial_sum_ptr + entry, l_i, mask=col_valid)


@triton.jit(do_not_specialize=["num_tokens", "num_splits"])
def decode_reduce_kernel(
    output_ptr,
    partial_acc_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    query_start_loc_ptr,
    num_tokens,
    num_splits,
    stride_o_token,
    stride_o_head,
    stride_o_dim,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge the splits of one (decode, query head, head-dim slice).

    Every split of a real decode wrote an entry (empty ones: max -inf, sum 0), so nothing
    here depends on seq_lens: all loads go out at once. Online rescaling across chunks
    (one chunk when SPLIT_CHUNK >= num_splits).
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    dim_block = tl.program_id(2)

    query_start = tl.load(query_start_loc_ptr + seq)
    query_end = tl.load(query_start_loc_ptr + seq + 1)
    is_decode = (query_end - query_start == 1) & (query_start >= 0) & (query_start < num_tokens)

    chunk = tl.arange(0, SPLIT_CHUNK)
    dims = dim_block * BLOCK_D + tl.arange(0, BLOCK_D)
    first_entry = seq.to(tl.int64) * num_splits
    # A padding entry's workspace rows were never written: read none of them.
    splits_to_read = tl.where(is_decode, num_splits, 0)
    running_max = tl.full([], float("-inf"), dtype=tl.float32)
    total = tl.full([], 0.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, num_splits, SPLIT_CHUNK):
        split = start + chunk
        in_range = split < splits_to_read
        entry = (first_entry + split) * NUM_Q_HEADS + head
        split_max = tl.load(partial_max_ptr + entry, mask=in_range, other=float("-inf"))
        split_sum = tl.load(partial_sum_ptr + entry, mask=in_range, other=0.0)
        part = tl.load(
            partial_acc_ptr + entry[:, None] * HEAD_DIM + dims[None, :], mask=in_range[:, None], other=0.0
        )
        new_max = tl.maximum(running_max, tl.max(split_max, axis=0))
        reference = tl.where(new_max == float("-inf"), 0.0, new_max)
        weight = tl.exp2(split_max - reference)  # 0 for empty splits
        part = tl.where(weight[:, None] > 0.0, part, 0.0)  # an empty split's accumulator is stale
        rescale = tl.exp2(running_max - reference)
        total = total * rescale + tl.sum(weight * split_sum, axis=0)
        acc = acc * rescale + tl.sum(part * weight[:, None], axis=0)
        running_max = new_max

    has_keys = total > 0.0  # seq_len 0: leave the row alone
    out = acc / tl.where(has_keys, total, 1.0)
    tl.store(
        output_ptr + query_start.to(tl.int64) * stride_o_token + head * stride_o_head + dims * stride_o_dim,
        out.to(output_ptr.dtype.element_ty),
        mask=dims < tl.where(is_decode & has_keys, HEAD_DIM, 0),
    )
