"""The one place that defines Govinda's INT8 KV-cache page layout and its quantizer.

Every other module (the Triton kernels, the vLLM integration, the accuracy study, the tests)
derives offsets, shapes and the quantization rule from here.

Page layout
-----------
vLLM hands an attention layer a raw ``int8`` tensor; block ``b`` of a layer must occupy bytes
``[b * page, (b + 1) * page)`` because hybrid models (Qwen3.5: attention + Gated-DeltaNet) share
that tensor with the mamba state. For ``B`` tokens per block, ``H`` KV heads and head size ``D``
one page is ``2 * B * H * (D + 4)`` bytes -- the same bytes per token as upstream's
``int8_per_token_head`` -- split into four regions::

    offset 0            K data   int8     [H, B, D]   head-major: one head's tokens are contiguous
    offset B*H*D        V data   int8     [H, B, D]
    offset 2*B*H*D      K scale  float32  [H, B]      one scale per (token, head)
    offset 2*B*H*D+4*B*H V scale float32  [H, B]

Data rows are ``D`` bytes and start on ``D``-byte boundaries (upstream interleaves a 4-byte
scale after every row, i.e. 260-byte rows at D=256, which breaks wide vector loads);
the scale regions start on a ``2*B*H*D``-byte boundary, so they are 16-byte aligned.

Rotation
--------
With the Hadamard rotation (:mod:`kv_rotation`) a page holds the quantized *rotated* rows
``H x``; the layout and the byte count are the same. :func:`store_reference` takes the rotation,
:func:`gather_reference` returns what the page holds (rotated rows when rotated).

Quantization
------------
Symmetric, per (token, head): ``scale = max(absmax(x) / 127, SCALE_FLOOR)`` in float32,
``q = round_half_to_even(x / scale)`` clamped to [-127, 127]; dequantization is ``q * scale``.
The division is an IEEE float32 division and the rounding is round-half-to-even, so the Triton
store kernel is bit-exact against :func:`quantize_reference`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .kv_rotation import NONE, check_rotation, hadamard_reference

SCALE_BYTES = 4
QMAX = 127
# Smallest scale: keeps an all-zero row finite (0 / floor = 0) and is far below any
# activation magnitude a real model puts into K or V.
SCALE_FLOOR = 1e-8


def page_bytes(block_size: int, num_kv_heads: int, head_dim: int) -> int:
    """Bytes of one KV-cache block (K + V data and their fp32 scales)."""
    return 2 * block_size * num_kv_heads * (head_dim + SCALE_BYTES)


def bytes_per_token(num_kv_heads: int, head_dim: int) -> int:
    return page_bytes(1, num_kv_heads, head_dim)


def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """Shape of one layer's raw int8 cache: one row of bytes per block."""
    return (num_blocks, page_bytes(block_size, num_kv_heads, head_dim))


class PageOffsets(NamedTuple):
    """Byte offsets of the four regions inside a page (see the module docstring)."""

    k_data: int
    v_data: int
    k_scale: int
    v_scale: int
    page: int


def page_offsets(block_size: int, num_kv_heads: int, head_dim: int) -> PageOffsets:
    data = block_size * num_kv_heads * head_dim
    scales = block_size * num_kv_heads * SCALE_BYTES
    return PageOffsets(
        k_data=0,
        v_data=data,
        k_scale=2 * data,
        v_scale=2 * data + scales,
        page=page_bytes(block_size, num_kv_heads, head_dim),
    )


class CacheViews(NamedTuple):
    """Strided views into one layer's raw cache; they alias its storage."""

    k_data: torch.Tensor  # int8    [num_blocks, H, B, D]
    v_data: torch.Tensor  # int8    [num_blocks, H, B, D]
    k_scale: torch.Tensor  # float32 [num_blocks, H, B]
    v_scale: torch.Tensor  # float32 [num_blocks, H, B]


def split_cache(kv_cache: torch.Tensor, block_size: int, num_kv_heads: int, head_dim: int) -> CacheViews:
    """Views of the four page regions of a raw ``[num_blocks, page]`` int8 cache."""
    offsets = page_offsets(block_size, num_kv_heads, head_dim)
    if kv_cache.dtype != torch.int8 or kv_cache.dim() != 2 or kv_cache.shape[1] != offsets.page:
        raise ValueError(
            f"expected an int8 cache of shape [num_blocks, {offsets.page}], "
            f"got {tuple(kv_cache.shape)} {kv_cache.dtype}"
        )
    num_blocks = kv_cache.shape[0]
    data_shape = (num_blocks, num_kv_heads, block_size, head_dim)
    scale_shape = (num_blocks, num_kv_heads, block_size)
    n_data = block_size * num_kv_heads * head_dim
    n_scale_bytes = block_size * num_kv_heads * SCALE_BYTES

    def region(start: int, length: int) -> torch.Tensor:
        return kv_cache[:, start : start + length]

    return CacheViews(
        k_data=region(offsets.k_data, n_data).view(data_shape),
        v_data=region(offsets.v_data, n_data).view(data_shape),
        k_scale=region(offsets.k_scale, n_scale_bytes).view(torch.float32).view(scale_shape),
        v_scale=region(offsets.v_scale, n_scale_bytes).view(torch.float32).view(scale_shape),
    )


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., D]`` per row: returns ``(int8 [..., D], float32 scale [...])``."""
    xf = x.float()
    scale = (xf.abs().amax(dim=-1) / QMAX).clamp_min(SCALE_FLOOR)
    # torch.round is round-half-to-even.
    q = torch.round(xf / scale.unsqueeze(-1)).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_reference(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.unsqueeze(-1)


def store_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    rotation: str = NONE,
) -> None:
    """Quantize ``key``/``value`` ``[T, H, D]`` (rotated first if asked) into the cache; slots < 0 are skipped."""
    rotate = check_rotation(rotation)
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    views = split_cache(kv_cache, block_size, num_kv_heads, head_dim)
    slots = slot_mapping.long()
    valid = slots >= 0
    slots = slots[valid]
    blocks, offsets = slots // block_size, slots % block_size
    for src, data, scales in ((key, views.k_data, views.k_scale), (value, views.v_data, views.v_scale)):
        rows = src[valid]
        q, s = quantize_reference(hadamard_reference(rows) if rotate else rows)  # [n, H, D], [n, H]
        data[blocks, :, offsets] = q
        scales[blocks, :, offsets] = s


def gather_reference(
    kv_cache: torch.Tensor,
    block_table_row: torch.Tensor,
    seq_len: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized float32 K and V ``[seq_len, H, D]`` of one sequence."""
    views = split_cache(kv_cache, block_size, num_kv_heads, head_dim)
    positions = torch.arange(seq_len, device=kv_cache.device)
    blocks = block_table_row.long()[positions // block_size]
    offsets = positions % block_size
    k = dequantize_reference(views.k_data[blocks, :, offsets], views.k_scale[blocks, :, offsets])
    v = dequantize_reference(views.v_data[blocks, :, offsets], views.v_scale[blocks, :, offsets])
    return k, v
