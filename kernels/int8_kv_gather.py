"""Gather-dequantize: the INT8 pages of some sequences -> contiguous bf16/fp16 K and V.

Feeds a bf16 varlen attention kernel (FA3 on Hopper) with exactly the values the INT8 decode
kernels see: sequence ``s`` of the batch (its whole context, ``seq_lens[s]`` tokens) lands in rows
``[cu_seqlens_k[s], cu_seqlens_k[s + 1])`` of ``key_out``/``value_out [total_k, H, D]``.

Each value is ``round_to_out_dtype(q * scale)`` with the product in fp32; with a rotated cache
(``rotation="hadamard"``) the fp32 row ``q * scale`` is rotated back first (:mod:`kv_rotation`,
``H`` is its own inverse), so the consumer needs no rotation of the query or the output. The
kernel and :func:`gather_kv_reference` do the same IEEE operations in the same order, so they agree
bit for bit.

Grid ``(num_seqs, cdiv(max_seqlen_k, BLOCK_T), num_kv_heads)``: ``max_seqlen_k`` is a host
integer the caller already has (no device read to size the launch); programs past their
sequence's end return at once. The sequences are rows ``first_seq...`` of the batch's own
``seq_lens`` / ``block_table``, passed whole with ``first_seq`` as an unspecialized integer:
sliced tensors would move the base pointers off their 16-byte alignment whenever the number of
decodes ahead of the prefills is not a multiple of four, and Triton would compile another
specialization while a request waits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .int8_kv_layout import gather_reference, page_offsets
from .int8_kv_store import float32_view
from .kv_rotation import NONE, check_rotation, hadamard_reference, hadamard_rows, log2_exact, normalizer

__all__ = ["gather_kv_int8", "gather_kv_reference", "varlen_attention_reference"]

DEFAULT_BLOCK_T = 64


@triton.jit
def _rounded(x, OUT_BF16: tl.constexpr):
    """fp32 ``x`` rounded to nearest-even in the output dtype; bf16 as its bit pattern in int16.

    bf16 is rounded with integer ops because Triton's CPU interpreter truncates fp32 -> bf16
    casts; the GPU path uses the same ops, so both produce the reference's bits (finite inputs).
    """
    if OUT_BF16:  # a constexpr branch: the two results may differ in type
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + (0x7FFF + ((bits >> 16) & 1))
        rounded = (bits >> 16).to(tl.int16)
    else:
        rounded = x.to(tl.float16)
    return rounded


@triton.jit(do_not_specialize=["first_seq"])
def _gather_kv_kernel(
    cache_ptr,
    cache_f32_ptr,
    block_table_ptr,
    seq_lens_ptr,
    cu_seqlens_k_ptr,
    key_out_ptr,
    value_out_ptr,
    first_seq,
    stride_cache_block,
    stride_cache_block_f32,
    stride_block_table,
    stride_out_token,
    stride_out_head,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    V_DATA_OFFSET: tl.constexpr,
    K_SCALE_OFFSET_F32: tl.constexpr,
    V_SCALE_OFFSET_F32: tl.constexpr,
    ROTATE: tl.constexpr,
    LOG2_HEAD_DIM: tl.constexpr,
    ROTATION_NORM: tl.constexpr,
    OUT_BF16: tl.constexpr,  # outputs are int16 views of bf16 tensors
):
    seq = tl.program_id(0)  # the output's sequence; the batch's is first_seq + seq
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    batch_seq = (first_seq + seq).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + batch_seq)
    if tile * BLOCK_T >= seq_len:
        return
    positions = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    valid = positions < seq_len
    dims = tl.arange(0, HEAD_DIM)
    block = tl.load(block_table_ptr + batch_seq * stride_block_table + positions // BLOCK_SIZE, mask=valid, other=0)
    block = block.to(tl.int64)
    row = kv_head * BLOCK_SIZE + positions % BLOCK_SIZE  # (head, token) row inside the page
    data = cache_ptr + (block * stride_cache_block + row * HEAD_DIM)[:, None] + dims[None, :]
    scales = cache_f32_ptr + block * stride_cache_block_f32 + row
    k = tl.load(data, mask=valid[:, None], other=0).to(tl.float32)
    v = tl.load(data + V_DATA_OFFSET, mask=valid[:, None], other=0).to(tl.float32)
    k = k * tl.load(scales + K_SCALE_OFFSET_F32, mask=valid, other=0.0)[:, None]
    v = v * tl.load(scales + V_SCALE_OFFSET_F32, mask=valid, other=0.0)[:, None]
    if ROTATE:
        k = hadamard_rows(k, BLOCK_T, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
        v = hadamard_rows(v, BLOCK_T, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
    out_rows = tl.load(cu_seqlens_k_ptr + seq).to(tl.int64) + positions
    offsets = (out_rows * stride_out_token + kv_head * stride_out_head)[:, None] + dims[None, :]
    tl.store(key_out_ptr + offsets, _rounded(k, OUT_BF16), mask=valid[:, None])
    tl.store(value_out_ptr + offsets, _rounded(v, OUT_BF16), mask=valid[:, None])


def _check_outputs(key_out: torch.Tensor, value_out: torch.Tensor, num_kv_heads: int, head_dim: int) -> None:
    for name, out in (("key_out", key_out), ("value_out", value_out)):
        if out.dim() != 3 or out.shape[1:] != (num_kv_heads, head_dim) or out.stride(2) != 1:
            raise ValueError(f"{name} must be [total_k, {num_kv_heads}, {head_dim}] with unit last stride, got {tuple(out.shape)}")
        if out.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{name} must be bf16 or fp16, got {out.dtype}")
    if key_out.shape != value_out.shape or key_out.stride() != value_out.stride() or key_out.dtype != value_out.dtype:
        raise ValueError("key_out and value_out must have one shape, stride and dtype")


def gather_kv_int8(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    key_out: torch.Tensor,
    value_out: torch.Tensor,
    *,
    block_size: int,
    num_kv_heads: int,
    max_seqlen_k: int,
    rotation: str = NONE,
    block_t: int = DEFAULT_BLOCK_T,
    launch_kwargs: dict | None = None,
    first_seq: int = 0,
) -> None:
    """Write the dequantized K/V of sequences ``first_seq ..`` of ``seq_lens`` into ``key_out``/``value_out``.

    ``block_table``/``seq_lens`` are device tensors of the batch (rows ``first_seq`` on are
    gathered); ``cu_seqlens_k`` has ``num_seqs + 1`` entries for the gathered sequences only;
    ``max_seqlen_k`` must bound their lengths.
    """
    rotate = check_rotation(rotation)
    head_dim = key_out.shape[-1]
    _check_outputs(key_out, value_out, num_kv_heads, head_dim)
    num_seqs = seq_lens.shape[0] - first_seq
    if first_seq < 0 or block_table.shape[0] < seq_lens.shape[0]:
        raise ValueError(f"first_seq {first_seq} / block_table rows {block_table.shape[0]} do not fit {seq_lens.shape[0]} sequences")
    if num_seqs <= 0 or max_seqlen_k <= 0:
        return
    offsets = page_offsets(block_size, num_kv_heads, head_dim)
    cache_f32 = float32_view(kv_cache)
    out_bf16 = key_out.dtype == torch.bfloat16
    if out_bf16:
        key_out, value_out = key_out.view(torch.int16), value_out.view(torch.int16)
    _gather_kv_kernel[(num_seqs, triton.cdiv(max_seqlen_k, block_t), num_kv_heads)](
        kv_cache,
        cache_f32,
        block_table,
        seq_lens,
        cu_seqlens_k,
        key_out,
        value_out,
        first_seq,
        kv_cache.stride(0),
        cache_f32.stride(0),
        block_table.stride(0),
        key_out.stride(0),
        key_out.stride(1),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_T=block_t,
        V_DATA_OFFSET=offsets.v_data,
        K_SCALE_OFFSET_F32=offsets.k_scale // 4,
        V_SCALE_OFFSET_F32=offsets.v_scale // 4,
        ROTATE=rotate,
        LOG2_HEAD_DIM=log2_exact(head_dim),
        ROTATION_NORM=normalizer(head_dim),
        OUT_BF16=out_bf16,
        **(launch_kwargs or {"num_warps": 4}),
    )


def gather_kv_reference(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: list[int],
    *,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    rotation: str = NONE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch :func:`gather_kv_int8`: K and V ``[sum(seq_lens), H, D]`` in ``dtype``."""
    rotate = check_rotation(rotation)
    keys, values = [], []
    for seq, seq_len in enumerate(seq_lens):
        k, v = gather_reference(kv_cache, block_table[seq], seq_len, block_size, num_kv_heads, head_dim)
        if rotate:
            k, v = hadamard_reference(k), hadamard_reference(v)
        keys.append(k.to(dtype))
        values.append(v.to(dtype))
    empty = torch.empty((0, num_kv_heads, head_dim), dtype=dtype, device=kv_cache.device)
    return (torch.cat(keys) if keys else empty), (torch.cat(values) if values else empty)


def varlen_attention_reference(q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale):
    """fp32 causal varlen attention with FA's calling convention (``GatheredPrefill``) and mask:
    bottom-right aligned, i.e. the queries are the last ``len_q`` of ``len_k`` positions. Writes
    ``out`` rows ``[0, cu_seqlens_q[-1])`` in its dtype. Plain torch, for tests on the CPU."""
    group = q.shape[1] // k.shape[1]
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if max(b - a for a, b in zip(starts_q, starts_q[1:])) > max_seqlen_q or max(
        b - a for a, b in zip(starts_k, starts_k[1:])
    ) > max_seqlen_k:
        raise ValueError("max_seqlen_q / max_seqlen_k do not bound the sequence lengths")
    for seq in range(len(starts_q) - 1):
        rows = slice(starts_q[seq], starts_q[seq + 1])
        qs = q[rows].float()
        ks = k[starts_k[seq] : starts_k[seq + 1]].float().repeat_interleave(group, dim=1)
        vs = v[starts_k[seq] : starts_k[seq + 1]].float().repeat_interleave(group, dim=1)
        len_q, len_k = qs.shape[0], ks.shape[0]
        if len_q == 0:
            continue
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * softmax_scale
        visible = torch.arange(len_k, device=q.device)[None, :] <= torch.arange(len_k - len_q, len_k, device=q.device)[:, None]
        probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = torch.einsum("hqk,khd->qhd", probs, vs).to(out.dtype)
