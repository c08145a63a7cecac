"""Orthonormal Walsh-Hadamard rotation of K/V (and of the query and output) along head_dim.

Quantizing ``H x`` instead of ``x`` spreads a row's outlier channels over every element, so the
per-row absmax scale fits the row better; ``H`` is orthonormal and symmetric (``H H = I``), so
``(H q) . (H k) = q . k`` and ``H sum_n p_n (H v_n) = sum_n p_n v_n``: with K and V stored
rotated, attention rotates the query on the way in and the output on the way out, and nothing
else changes (same bytes, same page layout).

``H`` is the Sylvester-ordered Hadamard matrix scaled by ``1 / sqrt(D)``. Both the Triton helper
and the torch reference compute it with the same fp32 butterfly ("constant geometry": every
stage maps ``x[i], x[i + D/2]`` to ``y[2i] = x[i] + x[i + D/2]``, ``y[2i + 1] = x[i] - x[i + D/2]``,
``log2(D)`` stages, then one multiply by the fp32 constant ``1 / sqrt(D)``). Additions and one
multiply in a fixed order are IEEE-exact operations, so kernel and reference agree bit for bit;
the rotation costs ``D log2(D)`` additions per row and needs no matrix in memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NONE = "none"
HADAMARD = "hadamard"
ROTATIONS = (NONE, HADAMARD)


def check_rotation(rotation: str) -> bool:
    """True for the Hadamard rotation, False for none; anything else is a clear error."""
    if rotation not in ROTATIONS:
        raise ValueError(f"unknown KV rotation {rotation!r}; use one of {ROTATIONS}")
    return rotation == HADAMARD


def log2_exact(head_dim: int) -> int:
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    return head_dim.bit_length() - 1


def normalizer(head_dim: int) -> float:
    """``1 / sqrt(head_dim)`` as the fp32 value both implementations multiply by."""
    return float(torch.tensor(head_dim**-0.5, dtype=torch.float32))


@triton.jit
def hadamard_rows(x, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, LOG2_HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """Rotate every row of fp32 ``x [ROWS, HEAD_DIM]`` by the orthonormal Hadamard matrix."""
    for _ in tl.static_range(LOG2_HEAD_DIM):
        halves = tl.permute(tl.reshape(x, (ROWS, 2, HEAD_DIM // 2)), (0, 2, 1))
        low, high = tl.split(halves)
        x = tl.reshape(tl.join(low + high, low - high), (ROWS, HEAD_DIM))
    return x * NORM


def hadamard_reference(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``x [..., D]`` rotated along its last dimension, exactly as :func:`hadamard_rows` does."""
    head_dim = x.shape[-1]
    stages = log2_exact(head_dim)
    y = x.float()
    for _ in range(stages):
        low, high = y[..., : head_dim // 2], y[..., head_dim // 2 :]
        y = torch.stack((low + high, low - high), dim=-1).reshape(y.shape)
    return y * normalizer(head_dim)


def hadamard_matrix(head_dim: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """The same rotation as a ``[D, D]`` matrix (symmetric: ``x @ H`` rotates rows of ``x``)."""
    return hadamard_reference(torch.eye(head_dim, dtype=torch.float32)).to(device=device, dtype=dtype)


# Rows of ``[BLOCK_ROWS, head_dim]`` one program of the pre/post rotation kernel rotates: a
# 16 KB fp32 tile at D=256, enough bytes in flight for a memory-bound pass.
ROTATE_TILE_ELEMENTS = 4096
ROTATE_NUM_WARPS = 4


@triton.jit
def _rotate_rows_at(src_ptr, dst_ptr, tokens, heads, valid, stride_src_token, stride_src_head, stride_src_dim,
                    stride_dst_token, stride_dst_head, stride_dst_dim, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    LOG2_HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """``dst[tokens[i], heads[i]] = H src[tokens[i], heads[i]]`` for the ``valid`` of ``ROWS`` rows."""
    dims = tl.arange(0, HEAD_DIM)
    x = tl.load(
        src_ptr + tokens[:, None] * stride_src_token + heads[:, None] * stride_src_head + dims[None, :] * stride_src_dim,
        mask=valid[:, None],
        other=0.0,
    )
    x = hadamard_rows(x.to(tl.float32), ROWS, HEAD_DIM, LOG2_HEAD_DIM, NORM)
    tl.store(
        dst_ptr + tokens[:, None] * stride_dst_token + heads[:, None] * stride_dst_head + dims[None, :] * stride_dst_dim,
        x.to(dst_ptr.dtype.element_ty),
        mask=valid[:, None],
    )


def _row_pass_arguments(name: str, src: torch.Tensor, dst: torch.Tensor) -> tuple:
    """``(strides, constexprs)`` of a row-pass launch over ``[T, heads, D]`` tensors of one shape."""
    if dst.shape != src.shape:
        raise ValueError(f"{name}: dst {tuple(dst.shape)} != src {tuple(src.shape)}")
    head_dim = src.shape[2]
    strides = (*src.stride(), *dst.stride())
    constexprs = dict(NUM_HEADS=src.shape[1], HEAD_DIM=head_dim, LOG2_HEAD_DIM=log2_exact(head_dim),
                      NORM=normalizer(head_dim), num_warps=ROTATE_NUM_WARPS, num_stages=1)
    return strides, constexprs


# The sequence range changes with every mixed batch: one compiled kernel for all of them.
@triton.jit(do_not_specialize=["first_seq", "last_seq"])
def _rotate_token_rows_kernel(
    src_ptr,
    dst_ptr,
    query_start_loc_ptr,
    first_seq,
    last_seq,
    stride_src_token,
    stride_src_head,
    stride_src_dim,
    stride_dst_token,
    stride_dst_head,
    stride_dst_dim,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    LOG2_HEAD_DIM: tl.constexpr,
    NORM: tl.constexpr,
):
    # The token range is read on the device: the launch needs no host copy of the metadata.
    start = tl.load(query_start_loc_ptr + first_seq)
    end = tl.load(query_start_loc_ptr + last_seq)
    first_row = tl.program_id(0) * BLOCK_ROWS
    if start + first_row // NUM_HEADS >= end:
        return
    rows = first_row + tl.arange(0, BLOCK_ROWS)  # (token, head) pairs
    tokens = start.to(tl.int64) + rows // NUM_HEADS
    _rotate_rows_at(src_ptr, dst_ptr, tokens, rows % NUM_HEADS, tokens < end, stride_src_token, stride_src_head,
                    stride_src_dim, stride_dst_token, stride_dst_head, stride_dst_dim, BLOCK_ROWS, HEAD_DIM,
                    LOG2_HEAD_DIM, NORM)


def rotate_token_rows(
    src: torch.Tensor, dst: torch.Tensor, query_start_loc: torch.Tensor, first_seq: int, last_seq: int
) -> None:
    """``dst[t, h] = H src[t, h]`` (fp32 math, one rounding to ``dst``'s dtype) for the tokens
    ``query_start_loc[first_seq] <= t < query_start_loc[last_seq]``; other rows stay untouched.

    ``src`` and ``dst`` are ``[T, heads, D]`` of the same shape (any strides) and may be the same
    tensor: each program reads and writes only its own rows. The first ``first_seq`` sequences
    must have one token each (the decodes of :func:`int8_paged_attention.paged_attention_int8`):
    the grid covers ``T - first_seq`` tokens, and the bounds are read on the device, so the launch
    allocates nothing and never synchronizes (CUDA-graph safe).
    """
    strides, constexprs = _row_pass_arguments("rotate_token_rows", src, dst)
    num_tokens, num_heads, head_dim = src.shape
    max_rows = max(num_tokens - first_seq, 0) * num_heads
    if max_rows == 0:
        return
    block_rows = max(1, ROTATE_TILE_ELEMENTS // head_dim)
    _rotate_token_rows_kernel[(triton.cdiv(max_rows, block_rows),)](
        src, dst, query_start_loc, first_seq, last_seq, *strides, BLOCK_ROWS=block_rows, **constexprs
    )


@triton.jit(do_not_specialize=["num_tokens"])
def _rotate_decode_rows_kernel(
    src_ptr,
    dst_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    num_tokens,
    stride_src_token,
    stride_src_head,
    stride_src_dim,
    stride_dst_token,
    stride_dst_head,
    stride_dst_dim,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    LOG2_HEAD_DIM: tl.constexpr,
    NORM: tl.constexpr,
):
    seq = tl.program_id(0)
    start = tl.load(query_start_loc_ptr + seq)
    end = tl.load(query_start_loc_ptr + seq + 1)
    seq_len = tl.load(seq_lens_ptr + seq)
    # The rows the decode kernels write, and no others: padding (query_len 0) and a decode
    # without KV keep their rows as they are.
    if (end - start != 1) | (start < 0) | (start >= num_tokens) | (seq_len <= 0):
        return
    heads = tl.program_id(1) * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)
    tokens = tl.zeros([BLOCK_HEADS], dtype=tl.int64) + start  # one token, a row per head
    _rotate_rows_at(src_ptr, dst_ptr, tokens, heads, heads < NUM_HEADS, stride_src_token, stride_src_head,
                    stride_src_dim, stride_dst_token, stride_dst_head, stride_dst_dim, BLOCK_HEADS, HEAD_DIM,
                    LOG2_HEAD_DIM, NORM)


def rotate_decode_rows(
    src: torch.Tensor, dst: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_decodes: int
) -> None:
    """``dst[t, h] = H src[t, h]`` (fp32 math, one rounding to ``dst``'s dtype) for the token of
    each of the first ``num_decodes`` sequences that is a decode the decode kernels serve (query
    length 1, ``seq_len > 0``); every other row stays untouched.

    Same shapes and aliasing rules as :func:`rotate_token_rows`; one program per (decode, group
    of heads), the bounds read on the device (CUDA-graph safe, nothing allocated).
    """
    strides, constexprs = _row_pass_arguments("rotate_decode_rows", src, dst)
    num_tokens, num_heads, head_dim = src.shape
    if num_decodes <= 0 or num_tokens == 0:
        return
    block_heads = min(triton.next_power_of_2(num_heads), max(1, ROTATE_TILE_ELEMENTS // head_dim))
    _rotate_decode_rows_kernel[(num_decodes, triton.cdiv(num_heads, block_heads))](
        src, dst, query_start_loc, seq_lens, num_tokens, *strides, BLOCK_HEADS=block_heads, **constexprs
    )
