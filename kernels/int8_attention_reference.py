"""fp32 torch reference of :func:`int8_paged_attention.paged_attention_int8` (for tests, the
self-test and the self-tuner's correctness check)."""

from __future__ import annotations

import torch

from .int8_kv_layout import gather_reference
from .kv_rotation import NONE, check_rotation, hadamard_reference

__all__ = ["attention_reference"]


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
