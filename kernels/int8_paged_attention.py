"""Paged attention over Govinda's INT8 KV cache (layout: :mod:`int8_kv_layout`).

One entry point, :func:`paged_attention_int8`, serves a mixed batch whose first
``num_decodes`` sequences are single-token decodes (vLLM orders them first):

* decodes -> split-KV ("flash-decoding") kernel, grid ``(num_decodes, num_kv_heads,
  num_splits)``. One program holds all query heads of a KV group (padded to 16 for
  ``tl.dot``; they are the columns of transposed products, see the kernel) and walks a
  contiguous range of KV tiles computed in-kernel from ``seq_lens``, so the grid depends on
  ``num_decodes`` only (CUDA-graph capturable) and the time grows with the KV bytes read.
  Partial (acc, max, sum) go to a :class:`DecodeWorkspace`; a reduce
  kernel merges them. With a single split the decode kernel writes the output itself.
* the rest -> prefill kernel, grid ``(num_q_heads, T // BLOCK_M + num_prefill_seqs)``;
  each program finds its sequence by binary search over ``query_start_loc``. KV tiles that
  every query row of the tile may see run in a loop without any masking; only the tiles
  touching the causal diagonal (or the end of the sequence) are masked, and tiles past the
  causal limit are never visited.

Numerics: int8 K/V tiles are converted to the query dtype (exact for |q| <= 127) and fed to
``tl.dot`` with fp32 accumulation. Scales are never multiplied into the tiles: the K scale
multiplies the score columns (``S[:, n] *= k_scale[n]``) and the V scale the probability
columns (``P[:, n] *= v_scale[n]``) before ``P`` is rounded to the query dtype. Softmax runs in
base 2 with ``log2(e)`` folded into the softmax scale.

Rotation (``rotation="hadamard"``, cache written by the store kernel with the same rotation):
each program rotates its query rows in fp32 (then rounds them to the query dtype) before its
KV loop and rotates its fp32 accumulator back after it (:mod:`kv_rotation`). Split-KV partial
accumulators are rotated back before they are written: the reduce step is linear in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import triton
import triton.language as tl

from .int8_kv_gather import gather_kv_int8
from .int8_kv_layout import gather_reference, page_offsets
from .int8_kv_store import float32_view
from .kv_rotation import NONE, check_rotation, hadamard_reference, hadamard_rows, log2_exact, normalizer
from .launch_configs import (
    ArchLaunchConfigs,
    decode_num_splits,
    get_launch_configs,
    interpreting,
    sm_count,
)

__all__ = ["paged_attention_int8", "DecodeWorkspace", "GatheredPrefill", "attention_reference", "decode_splits_for"]

LOG2E = 1.4426950408889634
# Smallest dimension tl.dot accepts; the decode kernel pads a KV group's query heads to it.
MIN_DOT_DIM = 16
_DOT_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _dot_operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
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
def _load_kv_tile(
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


@triton.jit
def _decode_tile(
    q_t, k, v, k_scale, v_scale, valid, m_i, l_i, acc_t, qk_scale, DOT_DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr
):
    """One online-softmax step of a decode, transposed: the group's query heads are columns."""
    s_t = tl.dot(_dot_operand(k, DOT_DTYPE, UPCAST_DOT), q_t)  # [BLOCK_N, GROUP_PAD]
    s_t = s_t * (k_scale * qk_scale)[:, None]
    s_t = tl.where(valid[:, None], s_t, float("-inf"))
    # Every tile of a split's range holds a valid position, so m_new is finite.
    m_new = tl.maximum(m_i, tl.max(s_t, axis=0))
    alpha = tl.exp2(m_i - m_new)
    p_t = tl.exp2(s_t - m_new[None, :])
    l_i = l_i * alpha + tl.sum(p_t, axis=0)
    acc_t = acc_t * alpha[None, :]
    acc_t = tl.dot(
        tl.trans(_dot_operand(v, DOT_DTYPE, UPCAST_DOT)),
        _dot_operand(p_t * v_scale[:, None], DOT_DTYPE, UPCAST_DOT),
        acc_t,
    )
    return m_new, l_i, acc_t


@triton.jit(do_not_specialize=["num_tokens", "num_splits"])
def _decode_split_kernel(
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
    q_t = _dot_operand(q_t, DOT_DTYPE, UPCAST_DOT)

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
        k, v, k_scale, v_scale = _load_kv_tile(
            cache_ptr, cache_f32_ptr, block_table_row, positions, valid, kv_head,
            stride_cache_block, stride_cache_block_f32,
            BLOCK_SIZE, HEAD_DIM, V_DATA_OFFSET, K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32, True,
        )
        for tile in range(tile_lo, tile_hi):
            next_positions = positions + BLOCK_N
            next_valid = (next_positions < seq_len) & (tile + 1 < tile_hi)
            next_k, next_v, next_k_scale, next_v_scale = _load_kv_tile(
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
            k, v, k_scale, v_scale = _load_kv_tile(
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
def _decode_reduce_kernel(
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
    s = tl.dot(q, tl.trans(_dot_operand(k, DOT_DTYPE, UPCAST_DOT)))
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
        _dot_operand(p * v_scale[None, :], DOT_DTYPE, UPCAST_DOT), _dot_operand(v, DOT_DTYPE, UPCAST_DOT), acc
    )
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["num_decodes", "num_seqs", "num_q_blocks"])
def _prefill_kernel(
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
    ROTATE: tl.constexpr,
    LOG2_HEAD_DIM: tl.constexpr,
    ROTATION_NORM: tl.constexpr,
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
    if ROTATE:
        q = hadamard_rows(q.to(tl.float32), BLOCK_M, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
    q = _dot_operand(q, DOT_DTYPE, UPCAST_DOT)
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

    for tile in range(0, num_unmasked_tiles):
        kv_positions = tile * BLOCK_N + offs_n
        k, v, k_scale, v_scale = _load_kv_tile(
            cache_ptr,
            cache_f32_ptr,
            block_table_row,
            kv_positions,
            kv_positions,  # unused: unmasked
            kv_head,
            stride_cache_block,
            stride_cache_block_f32,
            BLOCK_SIZE,
            HEAD_DIM,
            V_DATA_OFFSET,
            K_SCALE_OFFSET_F32,
            V_SCALE_OFFSET_F32,
            False,
        )
        m_i, l_i, acc = _attend_tile(
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
            False,
            DOT_DTYPE,
            UPCAST_DOT,
        )

    for tile in range(num_unmasked_tiles, num_tiles):
        kv_positions = tile * BLOCK_N + offs_n
        k, v, k_scale, v_scale = _load_kv_tile(
            cache_ptr,
            cache_f32_ptr,
            block_table_row,
            kv_positions,
            kv_positions < kv_end,
            kv_head,
            stride_cache_block,
            stride_cache_block_f32,
            BLOCK_SIZE,
            HEAD_DIM,
            V_DATA_OFFSET,
            K_SCALE_OFFSET_F32,
            V_SCALE_OFFSET_F32,
            True,
        )
        m_i, l_i, acc = _attend_tile(
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
            True,
            DOT_DTYPE,
            UPCAST_DOT,
        )

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if ROTATE:
        out = hadamard_rows(out, BLOCK_M, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
    tl.store(
        output_ptr + tokens[:, None] * stride_o_token + head * stride_o_head + dims[None, :] * stride_o_dim,
        out.to(output_ptr.dtype.element_ty),
        mask=row_valid[:, None],
    )


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


def decode_splits_for(
    num_decodes: int, num_kv_heads: int, device: torch.device, configs: Optional[ArchLaunchConfigs] = None
) -> int:
    """KV splits per (decode, kv head) that :func:`paged_attention_int8` uses on ``device``
    with ``configs`` (default: the device's table)."""
    configs = configs or get_launch_configs(device)
    return decode_num_splits(num_decodes, num_kv_heads, sm_count(device, configs), configs.decode_splits)


@dataclass
class DecodeWorkspace:
    """Preallocated split-KV partial results (so the decode path allocates nothing).

    Entry ``e = seq * num_splits + split`` holds, for every query head, the unnormalised
    accumulator ``[head_dim]``, the base-2 running max and the exp-sum.
    """

    partial_acc: torch.Tensor  # fp32 [max_entries * num_q_heads, head_dim]
    partial_max: torch.Tensor  # fp32 [max_entries * num_q_heads]
    partial_sum: torch.Tensor  # fp32 [max_entries * num_q_heads]
    max_entries: int
    num_q_heads: int
    head_dim: int

    @classmethod
    def allocate(
        cls,
        max_num_seqs: int,
        num_q_heads: int,
        head_dim: int,
        device: torch.device,
        *,
        num_kv_heads: int = 1,
        configs: Optional[ArchLaunchConfigs] = None,
    ) -> "DecodeWorkspace":
        """Room for any decode batch of up to ``max_num_seqs`` sequences on ``device``.

        The split count shrinks as the batch grows; the buffer is sized for the largest
        ``num_decodes * num_splits`` over all batch sizes. ``num_kv_heads`` (default 1 = the
        worst case) tightens the bound. ``configs`` must be the launch configs the decodes
        will run with (their split policy sizes the buffer).
        """
        device = torch.device(device)
        max_entries = 1
        for num_decodes in range(1, max(int(max_num_seqs), 1) + 1):
            splits = decode_splits_for(num_decodes, num_kv_heads, device, configs)
            if splits > 1:
                max_entries = max(max_entries, num_decodes * splits)
        return cls.with_entries(max_entries, num_q_heads, head_dim, device)

    @classmethod
    def with_entries(cls, max_entries: int, num_q_heads: int, head_dim: int, device: torch.device) -> "DecodeWorkspace":
        """Room for exactly ``max_entries`` (decode, split) pairs."""
        rows = max_entries * num_q_heads
        return cls(
            partial_acc=torch.empty((rows, head_dim), dtype=torch.float32, device=device),
            partial_max=torch.empty((rows,), dtype=torch.float32, device=device),
            partial_sum=torch.empty((rows,), dtype=torch.float32, device=device),
            max_entries=max_entries,
            num_q_heads=num_q_heads,
            head_dim=head_dim,
        )

    def check_fits(self, num_decodes: int, num_splits: int, num_q_heads: int, head_dim: int) -> None:
        if num_q_heads != self.num_q_heads or head_dim != self.head_dim:
            raise ValueError(
                f"workspace is for {self.num_q_heads} heads x {self.head_dim} dims, "
                f"got {num_q_heads} x {head_dim}"
            )
        if num_decodes * num_splits > self.max_entries:
            raise ValueError(
                f"workspace holds {self.max_entries} (decode, split) entries, "
                f"this batch needs {num_decodes} x {num_splits}"
            )


def _launch_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    cache_f32: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    num_kv_heads: int,
    qk_scale: float,
    num_decodes: int,
    num_splits: int,
    workspace: Optional[DecodeWorkspace],
    configs: ArchLaunchConfigs,
    rotate: bool,
) -> None:
    num_tokens, num_q_heads, head_dim = query.shape
    group = num_q_heads // num_kv_heads
    offsets = page_offsets(block_size, num_kv_heads, head_dim)
    config = configs.decode_config(head_dim)
    min_tiles = configs.decode_splits.min_tiles_per_split
    write_output = num_splits == 1
    if write_output:
        partial_acc = partial_max = partial_sum = output  # unused by the kernel
    else:
        if workspace is None:  # eager use: exactly this batch's size
            workspace = DecodeWorkspace.with_entries(num_decodes * num_splits, num_q_heads, head_dim, query.device)
        workspace.check_fits(num_decodes, num_splits, num_q_heads, head_dim)
        partial_acc, partial_max, partial_sum = workspace.partial_acc, workspace.partial_max, workspace.partial_sum
    _decode_split_kernel[(num_decodes, num_kv_heads, num_splits)](
        query,
        output,
        kv_cache,
        cache_f32,
        query_start_loc,
        seq_lens,
        block_table,
        partial_acc,
        partial_max,
        partial_sum,
        qk_scale,
        num_tokens,
        num_splits,
        query.stride(0),
        query.stride(1),
        query.stride(2),
        output.stride(0),
        output.stride(1),
        output.stride(2),
        kv_cache.stride(0),
        cache_f32.stride(0),
        block_table.stride(0),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        GROUP_PAD=max(MIN_DOT_DIM, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_N=config.block_n,
        MIN_TILES_PER_SPLIT=min_tiles,
        V_DATA_OFFSET=offsets.v_data,
        K_SCALE_OFFSET_F32=offsets.k_scale // 4,
        V_SCALE_OFFSET_F32=offsets.v_scale // 4,
        WRITE_OUTPUT=write_output,
        PREFETCH_NEXT_TILE=config.prefetch_next_tile,
        DOT_DTYPE=_DOT_DTYPES[query.dtype],
        UPCAST_DOT=interpreting(),
        ROTATE=rotate,
        LOG2_HEAD_DIM=log2_exact(head_dim),
        ROTATION_NORM=normalizer(head_dim),
        **config.launch_kwargs(),
    )
    if write_output:
        return
    reduce = configs.reduce
    block_d = min(reduce.block_n, head_dim)
    _decode_reduce_kernel[(num_decodes, num_q_heads, head_dim // block_d)](
        output,
        partial_acc,
        partial_max,
        partial_sum,
        query_start_loc,
        num_tokens,
        num_splits,
        output.stride(0),
        output.stride(1),
        output.stride(2),
        NUM_Q_HEADS=num_q_heads,
        HEAD_DIM=head_dim,
        SPLIT_CHUNK=min(triton.next_power_of_2(num_splits), reduce.block_m),
        BLOCK_D=block_d,
        **reduce.launch_kwargs(),
    )


def _launch_prefill(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    cache_f32: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    num_kv_heads: int,
    qk_scale: float,
    num_decodes: int,
    configs: ArchLaunchConfigs,
    rotate: bool,
) -> None:
    num_tokens, num_q_heads, head_dim = query.shape
    num_seqs = seq_lens.shape[0]
    offsets = page_offsets(block_size, num_kv_heads, head_dim)
    config = configs.prefill_config(head_dim, rotated=rotate)
    # Upper bound on sum(cdiv(query_len, BLOCK_M)) over the prefills without reading query_start_loc.
    num_q_blocks = num_tokens // config.block_m + (num_seqs - num_decodes)
    _prefill_kernel[(num_q_heads, num_q_blocks)](
        query,
        output,
        kv_cache,
        cache_f32,
        query_start_loc,
        seq_lens,
        block_table,
        qk_scale,
        num_decodes,
        num_seqs,
        num_q_blocks,
        query.stride(0),
        query.stride(1),
        query.stride(2),
        output.stride(0),
        output.stride(1),
        output.stride(2),
        kv_cache.stride(0),
        cache_f32.stride(0),
        block_table.stride(0),
        GROUP=num_q_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        V_DATA_OFFSET=offsets.v_data,
        K_SCALE_OFFSET_F32=offsets.k_scale // 4,
        V_SCALE_OFFSET_F32=offsets.v_scale // 4,
        DOT_DTYPE=_DOT_DTYPES[query.dtype],
        UPCAST_DOT=interpreting(),
        ROTATE=rotate,
        LOG2_HEAD_DIM=log2_exact(head_dim),
        ROTATION_NORM=normalizer(head_dim),
        **config.launch_kwargs(),
    )


@dataclass(frozen=True)
class GatheredPrefill:
    """The prefills of one step on the gather + bf16 varlen path, sized on the host.

    Built by the caller from CPU copies of the metadata (vLLM's builder has them), so the launch
    reads nothing back from the device. ``varlen_attention(q, k, v, out, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale)`` is a causal (bottom-right
    aligned) varlen kernel, e.g. FA3; rows of ``out`` past ``cu_seqlens_q[-1]`` stay untouched.
    """

    varlen_attention: Callable
    cu_seqlens_k: torch.Tensor  # device int32 [num_prefills + 1]: the prefills' rows in the K/V buffer
    total_k: int  # sum of the prefills' seq_lens
    max_seqlen_k: int
    max_seqlen_q: int
    num_prefill_tokens: int  # query rows of the prefills (they follow the num_decodes decode rows)
    # Device int32 [num_prefills + 1]: the prefills' query rows from 0; None: derived from
    # query_start_loc on the device (one more small kernel per layer).
    cu_seqlens_q: Optional[torch.Tensor] = None


def _gathered_prefill(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    plan: GatheredPrefill,
    block_size: int,
    num_kv_heads: int,
    softmax_scale: float,
    num_decodes: int,
    configs: ArchLaunchConfigs,
    rotation: str,
) -> None:
    """Prefill = dequantize the prefills' whole contexts (prefix + the chunk just stored) to the
    query dtype, then a bf16 varlen kernel: it sees exactly the values the INT8 decode sees."""
    head_dim = query.shape[2]
    # Transient: mixed batches are never captured as full CUDA graphs (the builder's support level).
    keys, values = torch.empty((2, plan.total_k, num_kv_heads, head_dim), dtype=query.dtype, device=query.device)
    gather_kv_int8(
        kv_cache, block_table[num_decodes:], seq_lens[num_decodes:], plan.cu_seqlens_k, keys, values,
        block_size=block_size, num_kv_heads=num_kv_heads, max_seqlen_k=plan.max_seqlen_k, rotation=rotation,
        block_t=configs.gather.block_n, launch_kwargs=configs.gather.launch_kwargs(),
    )
    # Decodes are one token each, so the prefills' rows start at row num_decodes.
    rows = slice(num_decodes, num_decodes + plan.num_prefill_tokens)
    cu_seqlens_q = plan.cu_seqlens_q if plan.cu_seqlens_q is not None else query_start_loc[num_decodes:] - num_decodes
    plan.varlen_attention(
        query[rows], keys, values, output[rows], cu_seqlens_q, plan.cu_seqlens_k,
        plan.max_seqlen_q, plan.max_seqlen_k, softmax_scale,
    )


def _check_inputs(query, kv_cache, output, query_start_loc, seq_lens, block_table, block_size, num_kv_heads):
    if query.dim() != 3 or output.shape != query.shape or output.dtype != query.dtype:
        raise ValueError(f"query/output must be [T, Hq, D] of one dtype, got {query.shape} / {output.shape}")
    if query.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"query must be bf16 or fp16, got {query.dtype}")
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if block_size % 16:
        raise ValueError(f"block_size must be a multiple of 16, got {block_size}")
    page = page_offsets(block_size, num_kv_heads, head_dim).page
    if kv_cache.dtype != torch.int8 or kv_cache.dim() != 2 or kv_cache.shape[1] != page:
        raise ValueError(f"expected an int8 cache [num_blocks, {page}], got {tuple(kv_cache.shape)} {kv_cache.dtype}")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_table.shape[0] < num_seqs:
        raise ValueError("query_start_loc must be [num_seqs + 1] and block_table [>= num_seqs, max_blocks]")


def paged_attention_int8(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    num_kv_heads: int,
    softmax_scale: float,
    max_query_len: int,
    max_seq_len: int,
    num_decodes: int,
    workspace: Optional[DecodeWorkspace] = None,
    configs: Optional[ArchLaunchConfigs] = None,
    rotation: str = NONE,
    gathered_prefill: Optional[GatheredPrefill] = None,
) -> torch.Tensor:
    """Causal attention of ``query [T, Hq, D]`` over the INT8 paged cache; writes ``output`` in place.

    The first ``num_decodes`` sequences must have query_len 1. ``max_query_len`` and
    ``max_seq_len`` are accepted for the caller's convenience but do not shape the launch:
    grids depend on tensor shapes and ``num_decodes`` only, so a captured CUDA graph stays
    valid when they change. Rows of tokens outside every sequence, and rows of sequences
    with query_len 0 or seq_len 0, are left untouched. ``configs`` (default: the device's
    table) are the launch configs; a caller that keeps a ``workspace`` must size it with the
    same ones. ``rotation`` must be the one the cache was written with
    (:func:`int8_kv_store.store_kv_int8`). ``gathered_prefill`` (sized on the host by the caller)
    sends the prefills to gather-dequantize + a bf16 varlen kernel instead of the Triton prefill.
    """
    del max_query_len, max_seq_len  # see the docstring
    rotate = check_rotation(rotation)
    _check_inputs(query, kv_cache, output, query_start_loc, seq_lens, block_table, block_size, num_kv_heads)
    num_seqs = seq_lens.shape[0]
    num_decodes = max(0, min(int(num_decodes), num_seqs))
    if query.shape[0] == 0 or num_seqs == 0:
        return output
    cache_f32 = float32_view(kv_cache)
    configs = configs or get_launch_configs(query.device)
    qk_scale = float(softmax_scale) * LOG2E
    common = dict(block_size=block_size, num_kv_heads=num_kv_heads, qk_scale=qk_scale, configs=configs, rotate=rotate)
    tensors = (query, kv_cache, cache_f32, output, query_start_loc, seq_lens, block_table)
    if num_decodes > 0:
        num_splits = decode_num_splits(
            num_decodes, num_kv_heads, sm_count(query.device, configs), configs.decode_splits
        )
        _launch_decode(*tensors, num_decodes=num_decodes, num_splits=num_splits, workspace=workspace, **common)
    if num_seqs > num_decodes and gathered_prefill is not None:
        _gathered_prefill(
            query, kv_cache, output, query_start_loc, seq_lens, block_table, plan=gathered_prefill,
            block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=softmax_scale,
            num_decodes=num_decodes, configs=configs, rotation=rotation,
        )
    elif num_seqs > num_decodes:
        _launch_prefill(*tensors, num_decodes=num_decodes, **common)
    return output


# --------------------------------------------------------------------------------------------
# Reference
# --------------------------------------------------------------------------------------------


def attention_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    *,
    block_size: int,
    num_kv_heads: int,
    softmax_scale: float,
    rotation: str = NONE,
) -> torch.Tensor:
    """fp32 causal attention on the dequantized cache (plain torch, for tests).

    With a rotated cache it works in the rotated space the way the kernels do: the rotated query
    is rounded to the query dtype (the kernels' ``tl.dot`` input), scores and ``P @ V`` use the
    stored rotated rows, and the output is rotated back in fp32. Rows outside every sequence,
    and rows that see no KV position, are 0.
    """
    rotate = check_rotation(rotation)
    num_tokens, num_q_heads, head_dim = query.shape
    group = num_q_heads // num_kv_heads
    out = torch.zeros((num_tokens, num_q_heads, head_dim), dtype=torch.float32, device=query.device)
    starts = query_start_loc.tolist()
    lengths = seq_lens.tolist()
    for seq, seq_len in enumerate(lengths):
        start, end = starts[seq], starts[seq + 1]
        query_len = end - start
        if query_len <= 0 or seq_len <= 0:
            continue
        k, v = gather_reference(kv_cache, block_table[seq], seq_len, block_size, num_kv_heads, head_dim)
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end]
        q = (hadamard_reference(q).to(q.dtype) if rotate else q).float()  # [Lq, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale
        query_positions = torch.arange(seq_len - query_len, seq_len, device=query.device)
        visible = torch.arange(seq_len, device=query.device)[None, :] <= query_positions[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see nothing -> 0
        seq_out = torch.einsum("hqk,khd->qhd", probs, v)
        out[start:end] = hadamard_reference(seq_out) if rotate else seq_out  # H is its own inverse
    return out
