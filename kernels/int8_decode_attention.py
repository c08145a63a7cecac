"""Split-KV ("flash-decoding") attention of single-token decodes over the INT8 paged cache.

:func:`decode_split_kernel`, grid ``(num_decodes, num_kv_heads, num_splits)``: one program holds
all query heads of a KV group (padded to 16 for ``tl.dot``; they are the columns of transposed
products, see the kernel) and walks a contiguous range of KV tiles computed in-kernel from
``seq_lens``, so the grid depends on ``num_decodes`` only (CUDA-graph capturable) and the time
grows with the KV bytes read. Partial (acc, max, sum) go to the host's ``DecodeWorkspace``;
:func:`decode_reduce_kernel` merges the splits that hold keys. With a single split the decode
kernel writes the output itself (unrotated; see Rotation).

Registers decide how many programs an SM / CU keeps in flight, and with them how many KV bytes
are requested at a time, so head_dim is cut into ``D_SLICE``-wide slices (at most four): each
slice of K is loaded, converted and multiplied on its own (``S^T += K_j Q_j^T``), each slice of
V feeds its own accumulator (``O_j^T += V_j^T P^T``). A whole-head tile's K and V come in one
load (one memory latency per tile) and its softmax sum stays per (token, head) until the end
(one cross-warp reduction per tile). No tile is ever converted whole to a wider dtype.
Launched with ``num_stages > 1`` the tile loop is software-pipelined by Triton: cp.async into
shared memory on NVIDIA, the stream pipeliner's LDS buffers on AMD. ``L2_PREFETCH`` (NVIDIA
only, a tuning candidate at D <= 128) asks the L2 for the K/V rows and scales of the tile that
many iterations ahead (PTX ``prefetch.global.L2``), so a tile's load finds its lines on the way.

Rotation (``ROTATE``, reduce kernel only): with the cache holding Hadamard-rotated rows, the
host rotates the decodes' query rows once before the split kernel (which is the unrotated one:
every split of a row would otherwise rotate the same query again, on its critical path, and
building the rotation in the prologue miscompiled on sm90 in several forms,
reports/h200/decode-bandwidth.md). The output is rotated back once per (decode, head), in fp32
with :func:`kv_rotation.hadamard_rows`, by the reduce kernel: its programs either hold a whole
row (few splits: cheap enough) or merge head-dim slices of it as unrotated, park them in the
workspace, and the last one to finish a row (an atomic count per row) rotates the whole row
(many splits: the reduce keeps its parallelism). So a rotated decode always goes through the
reduce, even with a single split.

Launched by :mod:`int8_paged_attention`, which picks the tile, slice and split count.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .int8_attention_tiles import dot_operand
from .kv_rotation import hadamard_rows

__all__ = ["decode_split_kernel", "decode_reduce_kernel", "MAX_SLICES"]

# Slices per head (the kernel unrolls up to four accumulators).
MAX_SLICES = 4


@triton.jit
def _query_slice(query_ptr, token, heads, col_valid, stride_q_token, stride_q_head, stride_q_dim,
                 j: tl.constexpr, D_SLICE: tl.constexpr, DOT_DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """Slice ``j`` of the group's query rows, transposed: ``[D_SLICE, GROUP_PAD]``."""
    dims = j * D_SLICE + tl.arange(0, D_SLICE)
    q_t = tl.load(
        query_ptr + token * stride_q_token + heads[None, :] * stride_q_head + dims[:, None] * stride_q_dim,
        mask=col_valid[None, :],
        other=0.0,
    )
    return dot_operand(q_t, DOT_DTYPE, UPCAST_DOT)


@triton.jit
def _scores_slice(s_t, k, k_ptrs, valid, q_t, j: tl.constexpr, D_SLICE: tl.constexpr, ONE_LOAD: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr):
    if not ONE_LOAD:
        k = tl.load(k_ptrs + j * D_SLICE, mask=valid[:, None], other=0)  # int8 [BLOCK_N, D_SLICE]
    return tl.dot(dot_operand(k, DOT_DTYPE, UPCAST_DOT), q_t, s_t)


@triton.jit
def _values_slice(acc_t, v, v_ptrs, valid, p_t, alpha, j: tl.constexpr, D_SLICE: tl.constexpr, ONE_LOAD: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, UPCAST_DOT: tl.constexpr):
    if not ONE_LOAD:
        v = tl.load(v_ptrs + j * D_SLICE, mask=valid[:, None], other=0)  # int8 [BLOCK_N, D_SLICE]
    return tl.dot(tl.trans(dot_operand(v, DOT_DTYPE, UPCAST_DOT)), p_t, acc_t * alpha[None, :])


@triton.jit
def _store_slice(acc_t, scale, j: tl.constexpr, output_ptr, partial_acc_ptr, token, heads, col_valid, entry,
                 stride_o_token, stride_o_head, stride_o_dim, HEAD_DIM: tl.constexpr, D_SLICE: tl.constexpr,
                 WRITE_OUTPUT: tl.constexpr):
    dims = j * D_SLICE + tl.arange(0, D_SLICE)
    acc_t = acc_t * scale[None, :]
    if WRITE_OUTPUT:
        tl.store(
            output_ptr + token * stride_o_token + heads[None, :] * stride_o_head + dims[:, None] * stride_o_dim,
            acc_t.to(output_ptr.dtype.element_ty),
            mask=col_valid[None, :],
        )
    else:
        tl.store(partial_acc_ptr + entry[None, :] * HEAD_DIM + dims[:, None], acc_t, mask=col_valid[None, :])


@triton.jit
def _split_range(seq_len, split, num_splits, BLOCK_N: tl.constexpr, MIN_TILES_PER_SPLIT: tl.constexpr):
    """Tiles ``[lo, hi)`` of one split, and how many splits of the decode hold any tile."""
    num_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(num_tiles, num_splits), MIN_TILES_PER_SPLIT)
    lo = split * tiles_per_split
    hi = tl.minimum(lo + tiles_per_split, num_tiles)
    return lo, hi, tl.minimum(tl.cdiv(num_tiles, tiles_per_split), num_splits)


@triton.jit
def _prefetch_l2(ptrs, mask):
    """Ask the L2 for the lines at ``ptrs`` (NVIDIA PTX ``prefetch.global.L2``; no data comes back)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )


@triton.jit
def _prefetch_tile(tile, tile_hi, seq_len, kv_head, block_table_row, cache_ptr, cache_f32_ptr,
                   stride_cache_block, stride_cache_block_f32, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr, V_DATA_OFFSET: tl.constexpr, K_SCALE_OFFSET_F32: tl.constexpr,
                   V_SCALE_OFFSET_F32: tl.constexpr):
    """Put the K and V rows and the scales of ``tile`` on their way to the L2 (nothing past the split).

    A program waits out each tile's memory latency before it can use the tile; lines already
    requested by an earlier iteration arrive from the L2 instead (reports/h200/decode-bandwidth.md).
    """
    LINE: tl.constexpr = 128
    LINES: tl.constexpr = max(1, HEAD_DIM // LINE)
    positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = (positions < seq_len) & (tile < tile_hi)
    block = tl.load(block_table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    row = kv_head * BLOCK_SIZE + positions % BLOCK_SIZE
    data = cache_ptr + block * stride_cache_block + row * HEAD_DIM
    line_ptrs = data[:, None] + tl.arange(0, LINES)[None, :] * LINE
    _prefetch_l2(line_ptrs, valid[:, None])
    _prefetch_l2(line_ptrs + V_DATA_OFFSET, valid[:, None])
    # fp32 scales: one 128-byte line holds 32 consecutive rows' scales.
    scales = cache_f32_ptr + block * stride_cache_block_f32 + row
    first = valid & ((row % 32 == 0) | (tl.arange(0, BLOCK_N) == 0))
    _prefetch_l2(scales + K_SCALE_OFFSET_F32, first)
    _prefetch_l2(scales + V_SCALE_OFFSET_F32, first)


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
    D_SLICE: tl.constexpr,  # HEAD_DIM / D_SLICE slices, at most MAX_SLICES
    MIN_TILES_PER_SPLIT: tl.constexpr,
    V_DATA_OFFSET: tl.constexpr,
    K_SCALE_OFFSET_F32: tl.constexpr,
    V_SCALE_OFFSET_F32: tl.constexpr,
    WRITE_OUTPUT: tl.constexpr,  # single split: normalise and write the output directly
    DOT_DTYPE: tl.constexpr,  # the query dtype (tl.bfloat16 / tl.float16)
    UPCAST_DOT: tl.constexpr,
    L2_PREFETCH: tl.constexpr = 0,  # NVIDIA only: tiles requested into the L2 ahead of the one in use
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    NUM_SLICES: tl.constexpr = HEAD_DIM // D_SLICE

    query_start = tl.load(query_start_loc_ptr + seq)
    query_end = tl.load(query_start_loc_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    # CUDA-graph padding (query_len 0) or a malformed entry: touch nothing.
    if (query_end - query_start != 1) | (query_start < 0) | (query_start >= num_tokens):
        return
    tile_lo, tile_hi, _ = _split_range(seq_len, split, num_splits, BLOCK_N, MIN_TILES_PER_SPLIT)
    # Past the last split that holds a tile the reduce kernel reads nothing: no entry to write.
    if tile_lo >= tile_hi:
        return

    # The group's query heads are the columns: everything below is transposed
    # (S^T = K Q^T, O^T = V^T P^T) so that the KV tile -- the big operand -- is the left-hand
    # one and M = BLOCK_N / D_SLICE is large enough for wgmma on sm90 (with the group as M,
    # Triton fell back to mma.sync and read the int8 V tile from shared memory byte by byte).
    cols = tl.arange(0, GROUP_PAD)
    col_valid = cols < GROUP
    heads = kv_head * GROUP + cols
    token = query_start.to(tl.int64)
    entry = (seq.to(tl.int64) * num_splits + split) * NUM_Q_HEADS + heads

    block_table_row = block_table_ptr + seq.to(tl.int64) * stride_block_table

    q0 = _query_slice(query_ptr, token, heads, col_valid, stride_q_token, stride_q_head, stride_q_dim, 0, D_SLICE, DOT_DTYPE, UPCAST_DOT)
    q1 = q0
    q2 = q0
    q3 = q0
    if NUM_SLICES > 1:
        q1 = _query_slice(query_ptr, token, heads, col_valid, stride_q_token, stride_q_head, stride_q_dim, 1, D_SLICE, DOT_DTYPE, UPCAST_DOT)
    if NUM_SLICES > 2:
        q2 = _query_slice(query_ptr, token, heads, col_valid, stride_q_token, stride_q_head, stride_q_dim, 2, D_SLICE, DOT_DTYPE, UPCAST_DOT)
        q3 = _query_slice(query_ptr, token, heads, col_valid, stride_q_token, stride_q_head, stride_q_dim, 3, D_SLICE, DOT_DTYPE, UPCAST_DOT)

    # The first tiles' requests, after the query's.
    for ahead in tl.static_range(L2_PREFETCH):
        _prefetch_tile(tile_lo + ahead, tile_hi, seq_len, kv_head, block_table_row, cache_ptr, cache_f32_ptr,
                       stride_cache_block, stride_cache_block_f32, BLOCK_SIZE, HEAD_DIM, BLOCK_N, V_DATA_OFFSET,
                       K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    l_t = tl.zeros([BLOCK_N, GROUP_PAD], dtype=tl.float32)
    acc0 = tl.zeros([D_SLICE, GROUP_PAD], dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    slice_dims = tl.arange(0, D_SLICE)
    kv_offsets = tl.arange(0, 2) * V_DATA_OFFSET
    # A whole-head tile is requested in one load; sliced ones slice by slice, where each
    # product waits (reports/h200/decode-bandwidth.md: at D=256 that measured faster at batch 1).
    ONE_LOAD: tl.constexpr = NUM_SLICES == 1
    for tile in range(tile_lo, tile_hi):  # software-pipelined when launched with num_stages > 1
        # Every token is looked up in the block table on its own, so a tile may straddle pages
        # (block sizes need not be multiples of the tile); a page holds one head's tokens as
        # contiguous HEAD_DIM-byte rows (kernels/int8_kv_layout.py).
        positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        valid = positions < seq_len
        block = tl.load(block_table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        row = kv_head * BLOCK_SIZE + positions % BLOCK_SIZE
        scale_offsets = block * stride_cache_block_f32 + row
        k_scale = tl.load(cache_f32_ptr + scale_offsets + K_SCALE_OFFSET_F32, mask=valid, other=0.0)
        v_scale = tl.load(cache_f32_ptr + scale_offsets + V_SCALE_OFFSET_F32, mask=valid, other=0.0)
        data_offsets = block * stride_cache_block + row * HEAD_DIM
        k_ptrs = cache_ptr + data_offsets[:, None] + slice_dims[None, :]
        v_ptrs = k_ptrs + V_DATA_OFFSET
        k_tile = tl.zeros([BLOCK_N, D_SLICE], dtype=tl.int8)  # sliced tiles load inside the products
        v_tile = k_tile
        if ONE_LOAD:
            # K and V in one load: Triton places the layout conversion behind a dot operand
            # right after the op that produced the value, and that conversion waits for the
            # data, so a separate V load would be issued only once K has arrived.
            kv_tile = tl.load(k_ptrs[:, None, :] + kv_offsets[None, :, None], mask=valid[:, None, None], other=0)
            k_tile, v_tile = tl.split(tl.permute(kv_tile, [0, 2, 1]))  # int8 [BLOCK_N, HEAD_DIM] each
        if L2_PREFETCH > 0:
            _prefetch_tile(tile + L2_PREFETCH, tile_hi, seq_len, kv_head, block_table_row, cache_ptr, cache_f32_ptr,
                           stride_cache_block, stride_cache_block_f32, BLOCK_SIZE, HEAD_DIM, BLOCK_N, V_DATA_OFFSET,
                           K_SCALE_OFFSET_F32, V_SCALE_OFFSET_F32)

        s_t = tl.zeros([BLOCK_N, GROUP_PAD], dtype=tl.float32)
        s_t = _scores_slice(s_t, k_tile, k_ptrs, valid, q0, 0, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
        if NUM_SLICES > 1:
            s_t = _scores_slice(s_t, k_tile, k_ptrs, valid, q1, 1, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
        if NUM_SLICES > 2:
            s_t = _scores_slice(s_t, k_tile, k_ptrs, valid, q2, 2, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
            s_t = _scores_slice(s_t, k_tile, k_ptrs, valid, q3, 3, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
        s_t = s_t * (k_scale * qk_scale)[:, None]
        s_t = tl.where(valid[:, None], s_t, float("-inf"))
        # Every tile of a split's range holds a valid position, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s_t, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        if ONE_LOAD:
            # The softmax sum stays per (token, head) until the end: one cross-warp reduction
            # per tile (the max) instead of two. Sliced tiles sum per head: the extra
            # [BLOCK_N, GROUP_PAD] accumulator spills under their 128-register cap.
            l_t = l_t * alpha[None, :] + p_t
        else:
            l_i = l_i * alpha + tl.sum(p_t, axis=0)
        p_t = dot_operand(p_t * v_scale[:, None], DOT_DTYPE, UPCAST_DOT)
        acc0 = _values_slice(acc0, v_tile, v_ptrs, valid, p_t, alpha, 0, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
        if NUM_SLICES > 1:
            acc1 = _values_slice(acc1, v_tile, v_ptrs, valid, p_t, alpha, 1, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
        if NUM_SLICES > 2:
            acc2 = _values_slice(acc2, v_tile, v_ptrs, valid, p_t, alpha, 2, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
            acc3 = _values_slice(acc3, v_tile, v_ptrs, valid, p_t, alpha, 3, D_SLICE, ONE_LOAD, DOT_DTYPE, UPCAST_DOT)
        m_i = m_new
    if ONE_LOAD:
        l_i = tl.sum(l_t, axis=0)

    scale = 1.0 / l_i if WRITE_OUTPUT else tl.full([GROUP_PAD], 1.0, tl.float32)
    _store_slice(acc0, scale, 0, output_ptr, partial_acc_ptr, token, heads, col_valid, entry,
                 stride_o_token, stride_o_head, stride_o_dim, HEAD_DIM, D_SLICE, WRITE_OUTPUT)
    if NUM_SLICES > 1:
        _store_slice(acc1, scale, 1, output_ptr, partial_acc_ptr, token, heads, col_valid, entry,
                     stride_o_token, stride_o_head, stride_o_dim, HEAD_DIM, D_SLICE, WRITE_OUTPUT)
    if NUM_SLICES > 2:
        _store_slice(acc2, scale, 2, output_ptr, partial_acc_ptr, token, heads, col_valid, entry,
                     stride_o_token, stride_o_head, stride_o_dim, HEAD_DIM, D_SLICE, WRITE_OUTPUT)
        _store_slice(acc3, scale, 3, output_ptr, partial_acc_ptr, token, heads, col_valid, entry,
                     stride_o_token, stride_o_head, stride_o_dim, HEAD_DIM, D_SLICE, WRITE_OUTPUT)
    if not WRITE_OUTPUT:
        tl.store(partial_max_ptr + entry, m_i, mask=col_valid)
        tl.store(partial_sum_ptr + entry, l_i, mask=col_valid)


@triton.jit
def _rotated_row(row, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """``H row`` of one fp32 row ``[HEAD_DIM]``, rotated as copies filling at least 128 elements
    (a 4-warp program's lanes): a 64-element row alone faulted on sm90 (Triton 3.6) in the
    butterfly's reshapes (reports/h200/decode-bandwidth.md)."""
    COPIES: tl.constexpr = max(1, 128 // HEAD_DIM)
    rows = tl.broadcast_to(row[None, :], (COPIES, HEAD_DIM))
    return tl.max(hadamard_rows(rows, COPIES, HEAD_DIM, LOG2_HEAD_DIM, NORM), axis=0)  # equal copies


@triton.jit(do_not_specialize=["num_tokens", "num_splits"])
def decode_reduce_kernel(
    output_ptr,
    partial_acc_ptr,
    partial_max_ptr,
    partial_sum_ptr,
    row_count_ptr,  # int32 [entries * NUM_Q_HEADS], zero between launches (ROTATE only)
    query_start_loc_ptr,
    seq_lens_ptr,
    num_tokens,
    num_splits,
    stride_o_token,
    stride_o_head,
    stride_o_dim,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,  # the decode kernel's KV tile: which splits hold keys
    MIN_TILES_PER_SPLIT: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ROTATE: tl.constexpr,  # rotate each merged row back
    LOG2_HEAD_DIM: tl.constexpr,
    ROTATION_NORM: tl.constexpr,
):
    """Merge the splits of one (decode, query head, head-dim slice).

    Only the splits that hold a tile wrote an entry (the decode kernel's split arithmetic,
    :func:`_split_range`), so a short context reads only its own few entries however many
    splits the grid has. Online rescaling across chunks (one chunk when SPLIT_CHUNK covers them).
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    dim_block = tl.program_id(2)

    query_start = tl.load(query_start_loc_ptr + seq)
    query_end = tl.load(query_start_loc_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    is_decode = (query_end - query_start == 1) & (query_start >= 0) & (query_start < num_tokens)
    _, _, used_splits = _split_range(seq_len, 0, num_splits, BLOCK_N, MIN_TILES_PER_SPLIT)

    chunk = tl.arange(0, SPLIT_CHUNK)
    dims = dim_block * BLOCK_D + tl.arange(0, BLOCK_D)
    first_entry = seq.to(tl.int64) * num_splits
    # A padding entry's workspace rows were never written: read none of them.
    splits_to_read = tl.where(is_decode, used_splits, 0)
    running_max = tl.full([], float("-inf"), dtype=tl.float32)
    total = tl.full([], 0.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, splits_to_read, SPLIT_CHUNK):
        split = start + chunk
        in_range = split < splits_to_read
        entry = (first_entry + split) * NUM_Q_HEADS + head
        split_max = tl.load(partial_max_ptr + entry, mask=in_range, other=float("-inf"))
        split_sum = tl.load(partial_sum_ptr + entry, mask=in_range, other=0.0)
        part = tl.load(
            partial_acc_ptr + entry[:, None] * HEAD_DIM + dims[None, :], mask=in_range[:, None], other=0.0
        )
        new_max = tl.maximum(running_max, tl.max(split_max, axis=0))
        weight = tl.exp2(split_max - new_max)  # 0 outside the range
        rescale = tl.exp2(running_max - new_max)
        total = total * rescale + tl.sum(weight * split_sum, axis=0)
        acc = acc * rescale + tl.sum(part * weight[:, None], axis=0)
        running_max = new_max

    has_keys = total > 0.0  # seq_len 0 (or padding): leave the row alone
    out = acc / tl.where(has_keys, total, 1.0)
    out_row = output_ptr + query_start.to(tl.int64) * stride_o_token + head * stride_o_head
    if ROTATE and BLOCK_D < HEAD_DIM:
        # Every program of a row reads the same split maxima and sums, so all agree on whether
        # the row is written; none of a row that is not touches the count.
        if is_decode & has_keys:
            # Park the merged slice in split 0's entry: its dims were read by this program only.
            parked = partial_acc_ptr + (first_entry * NUM_Q_HEADS + head) * HEAD_DIM
            tl.store(parked + dims, out)
            tl.debug_barrier()  # every thread's slice stored before the count is released
            count = row_count_ptr + seq.to(tl.int64) * NUM_Q_HEADS + head
            finished = tl.atomic_add(count, 1, sem="acq_rel", scope="gpu")
            if finished == HEAD_DIM // BLOCK_D - 1:  # the row's last slice: rotate the whole row
                tl.store(count, 0)  # zero again for the next launch
                row_dims = tl.arange(0, HEAD_DIM)
                row = tl.load(parked + row_dims, cache_modifier=".cg")  # from L2: other programs' slices
                row = _rotated_row(row, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
                tl.store(out_row + row_dims * stride_o_dim, row.to(output_ptr.dtype.element_ty))
    else:
        if ROTATE:  # this program holds the whole row
            out = _rotated_row(out, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
        tl.store(out_row + dims * stride_o_dim, out.to(output_ptr.dtype.element_ty),
                 mask=dims < tl.where(is_decode & has_keys, HEAD_DIM, 0))
