"""Quantize-on-write: store new K/V tokens into Govinda's INT8 paged KV cache.

The page layout and the quantization rule live in :mod:`int8_kv_layout`; this module is the
Triton implementation of :func:`int8_kv_layout.store_reference` and is bit-exact against it:

* the scale is ``max(absmax / 127, SCALE_FLOOR)`` with an IEEE float32 division (``div_rn``;
  Triton's plain ``/`` is an approximate division on NVIDIA);
* ``x / scale`` is again ``div_rn``, clamped to [-127, 127], then rounded half-to-even with
  integer arithmetic (truncate, compare the exact remainder with 0.5). That avoids libdevice
  (absent in the interpreter, ``rint`` absent on HIP) and any reliance on the compiler keeping
  a magic-number rounding trick intact.

With ``rotation="hadamard"`` each row is first rotated in fp32 by :mod:`kv_rotation`'s
butterfly (the same operations as its torch reference, so still bit-exact).

One program handles ``block_m`` tokens of one kv head (the store config's rows per program;
the GPU tables keep one) for both K and V; padded slots (< 0) and tokens past the end are masked
and touch no memory. No host synchronisation and no allocation: graph-capturable.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .int8_kv_layout import QMAX, SCALE_FLOOR, page_offsets, store_reference
from .kv_rotation import NONE, check_rotation, hadamard_rows, log2_exact, normalizer
from .launch_configs import KernelConfig, get_launch_configs

__all__ = ["store_kv_int8", "store_reference"]


@triton.jit
def _quantize_rows(x, QMAX_C: tl.constexpr, SCALE_FLOOR_C: tl.constexpr):
    """Per-row symmetric int8 quantization of fp32 ``x [R, D]``; returns ``(int8 [R, D], fp32 scale [R])``."""
    absmax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(tl.math.div_rn(absmax, QMAX_C * 1.0), SCALE_FLOOR_C)
    y = tl.math.div_rn(x, tl.zeros_like(x) + scale[:, None])
    # Clamping before rounding equals rounding before clamping because the bounds are integers.
    y = tl.minimum(tl.maximum(y, -QMAX_C * 1.0), QMAX_C * 1.0)
    truncated = y.to(tl.int32)  # rounds toward zero
    remainder = y - truncated.to(tl.float32)  # exact: both share the same binade or truncated is 0
    magnitude = tl.abs(remainder)
    is_odd = (truncated & 1) != 0
    round_away = (magnitude > 0.5) | ((magnitude == 0.5) & is_odd)
    step = tl.where(remainder > 0, 1, -1)
    q = truncated + tl.where(round_away, step, 0)
    return q.to(tl.int8), scale


# The token count varies per step: one compiled kernel for all of them (no ==1 / %16 variants).
@triton.jit(do_not_specialize=["num_tokens"])
def _store_kv_int8_kernel(
    key_ptr,
    value_ptr,
    cache_ptr,  # int8 view of the cache
    cache_f32_ptr,  # float32 view of the same bytes (for the scale regions)
    slot_mapping_ptr,
    num_tokens,
    stride_key_token,
    stride_key_head,
    stride_key_dim,
    stride_value_token,
    stride_value_head,
    stride_value_dim,
    stride_cache_block,  # bytes between pages
    stride_cache_block_f32,  # the same distance in float32 elements
    BLOCK_T: tl.constexpr,  # tokens per program
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_DATA_OFFSET: tl.constexpr,  # bytes
    K_SCALE_OFFSET_F32: tl.constexpr,  # float32 elements
    V_SCALE_OFFSET_F32: tl.constexpr,
    QMAX_C: tl.constexpr,
    SCALE_FLOOR_C: tl.constexpr,
    ROTATE: tl.constexpr,
    LOG2_HEAD_DIM: tl.constexpr,
    ROTATION_NORM: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    in_range = tokens < num_tokens
    slots = tl.load(slot_mapping_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
    live = slots >= 0
    block = slots // BLOCK_SIZE
    offset_in_block = slots % BLOCK_SIZE
    dims = tl.arange(0, HEAD_DIM)
    rows_live = live[:, None]

    tokens_64 = tokens.to(tl.int64)[:, None]
    k = tl.load(key_ptr + tokens_64 * stride_key_token + head * stride_key_head + dims[None, :] * stride_key_dim,
                mask=rows_live, other=0.0)
    v = tl.load(value_ptr + tokens_64 * stride_value_token + head * stride_value_head + dims[None, :] * stride_value_dim,
                mask=rows_live, other=0.0)
    k = k.to(tl.float32)
    v = v.to(tl.float32)
    if ROTATE:
        k = hadamard_rows(k, BLOCK_T, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
        v = hadamard_rows(v, BLOCK_T, HEAD_DIM, LOG2_HEAD_DIM, ROTATION_NORM)
    k_q, k_scale = _quantize_rows(k, QMAX_C, SCALE_FLOOR_C)
    v_q, v_scale = _quantize_rows(v, QMAX_C, SCALE_FLOOR_C)

    row = head * BLOCK_SIZE + offset_in_block  # (head, token) index inside the page
    k_row_ptr = cache_ptr + block * stride_cache_block + row * HEAD_DIM
    tl.store(k_row_ptr[:, None] + dims[None, :], k_q, mask=rows_live)
    tl.store(k_row_ptr[:, None] + V_DATA_OFFSET + dims[None, :], v_q, mask=rows_live)
    scale_base = cache_f32_ptr + block * stride_cache_block_f32 + row
    tl.store(scale_base + K_SCALE_OFFSET_F32, k_scale, mask=live)
    tl.store(scale_base + V_SCALE_OFFSET_F32, v_scale, mask=live)


def float32_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The raw cache's bytes as float32 (pages are a multiple of 4 bytes)."""
    if kv_cache.stride(-1) != 1:
        raise ValueError("the KV cache's byte dimension must be contiguous")
    return kv_cache.view(torch.float32)


def store_kv_int8(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    block_size: int,
    config: Optional[KernelConfig] = None,
    rotation: str = NONE,
) -> None:
    """Quantize ``key``/``value`` ``[T, H, D]`` into ``kv_cache`` at ``slot_mapping`` (slot < 0: skip).

    Processes ``min(T, len(slot_mapping))`` tokens; ``key``/``value`` may be strided views.
    ``config`` overrides the device table's store entry. ``rotation`` (see :mod:`kv_rotation`)
    rotates each row before quantizing.
    """
    rotate = check_rotation(rotation)
    if key.dim() != 3 or value.shape != key.shape:
        raise ValueError(f"key/value must both be [T, H, D], got {tuple(key.shape)} and {tuple(value.shape)}")
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    offsets = page_offsets(block_size, num_kv_heads, head_dim)
    if kv_cache.dtype != torch.int8 or kv_cache.dim() != 2 or kv_cache.shape[1] != offsets.page:
        raise ValueError(
            f"expected an int8 cache [num_blocks, {offsets.page}], got {tuple(kv_cache.shape)} {kv_cache.dtype}"
        )
    num_tokens = min(key.shape[0], slot_mapping.shape[0])
    if num_tokens == 0:
        return
    cache_f32 = float32_view(kv_cache)
    config = config or get_launch_configs(kv_cache.device).store
    rows = config.block_m
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"the store config's block_m (tokens per program) must be a power of two >= 1, got {rows}")
    _store_kv_int8_kernel[(triton.cdiv(num_tokens, rows), num_kv_heads)](
        key,
        value,
        kv_cache,
        cache_f32,
        slot_mapping,
        num_tokens,
        key.stride(0),
        key.stride(1),
        key.stride(2),
        value.stride(0),
        value.stride(1),
        value.stride(2),
        kv_cache.stride(0),
        cache_f32.stride(0),
        BLOCK_T=rows,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        V_DATA_OFFSET=offsets.v_data,
        K_SCALE_OFFSET_F32=offsets.k_scale // 4,
        V_SCALE_OFFSET_F32=offsets.v_scale // 4,
        QMAX_C=QMAX,
        SCALE_FLOOR_C=SCALE_FLOOR,
        ROTATE=rotate,
        LOG2_HEAD_DIM=log2_exact(head_dim),
        ROTATION_NORM=normalizer(head_dim),
        **config.launch_kwargs(),
    )
