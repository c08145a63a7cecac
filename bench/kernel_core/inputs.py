"""Inputs of the kernel benches: layer geometries, realistic Q/K/V, paged layouts and
per-step metadata as vLLM builds it."""

from __future__ import annotations

import dataclasses
from typing import Any, List, Sequence


@dataclasses.dataclass(frozen=True)
class Geometry:
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_name: str = "bfloat16"

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype_name)

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


QWEN35_27B = Geometry(num_q_heads=24, num_kv_heads=4, head_dim=256)
DENSE_D128 = Geometry(num_q_heads=32, num_kv_heads=8, head_dim=128)  # a Llama-8B layer
# --fa3 --geometry: (geometry, our INT8 block size, vLLM's bf16 block size) as vLLM picks them.
FA3_GEOMETRIES = {"qwen35": (QWEN35_27B, 1552, 800), "dense128": (DENSE_D128, 16, 16)}
# Smoke: same GQA ratio (6) with two KV heads so head indexing is exercised, tiny head_dim.
# float16 because Triton 3.6's interpreter gets bf16 tl.dot wrong (garbage, not rounding error),
# which would make every attention kernel's CPU output meaningless.
SMOKE_GEOMETRY = Geometry(num_q_heads=12, num_kv_heads=2, head_dim=64, dtype_name="float16")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def realistic_qkv(
    num_tokens: int,
    num_queries: int,
    geometry: Geometry,
    device,
    generator,
    dtype=None,
    positions=None,
):
    """K and V ``[num_tokens, Hkv, D]`` and Q ``[num_queries, Hq, D]`` in the geometry's dtype.

    Standard-normal entries plus what real post-RoPE keys look like: a few channel pairs per
    head (NeoX rotary pairs ``i``, ``i + D/2``) with a large, slowly rotating component, so a
    handful of channels dominate each key's absmax (the hard case for per-token scales). The
    queries share those channels with a moderate amplitude; values get a couple of mildly
    larger channels.
    """
    import torch

    dtype = dtype or geometry.torch_dtype
    hkv, hq, dim = geometry.num_kv_heads, geometry.num_q_heads, geometry.head_dim
    half = dim // 2
    # Small per-head parameters come from a CPU generator (no device syncs, same on any device).
    params = torch.Generator().manual_seed(generator.initial_seed())
    if positions is None:
        positions = torch.arange(num_tokens, device=device, dtype=torch.float32)
    key = torch.randn(num_tokens, hkv, dim, device=device, generator=generator)
    value = torch.randn(num_tokens, hkv, dim, device=device, generator=generator)
    query = torch.randn(num_queries, hq, dim, device=device, generator=generator)
    num_pairs = 4
    for head in range(hkv):
        channels = torch.randperm(half, generator=params)[:num_pairs].tolist()
        amplitudes = (8.0 + 8.0 * torch.rand(num_pairs, generator=params)).tolist()
        frequencies = (10.0 ** (-4.0 + torch.rand(num_pairs, generator=params))).tolist()
        phases = (6.283 * torch.rand(num_pairs, generator=params)).tolist()
        for channel, amplitude, frequency, phase in zip(channels, amplitudes, frequencies, phases):
            angle = positions * frequency + phase
            key[:, head, channel] += amplitude * torch.cos(angle)
            key[:, head, channel + half] += amplitude * torch.sin(angle)
            group = slice(head * geometry.group_size, (head + 1) * geometry.group_size)
            query[:, group, channel] += 1.0
            query[:, group, channel + half] += 0.5
        for channel in torch.randperm(dim, generator=params)[:2].tolist():
            value[:, head, channel] *= 4.0
    return key.to(dtype), value.to(dtype), query.to(dtype)


@dataclasses.dataclass
class PagedLayout:
    """Physical placement of a set of sequences in one contender's cache."""

    block_size: int
    num_blocks: int
    block_table: Any  # int32 [num_seqs, max_blocks]
    max_seq_lens: List[int]

    def slots(self, seq_index: int, start: int, stop: int):
        import torch

        positions = torch.arange(start, stop, device=self.block_table.device)
        blocks = self.block_table[seq_index].long()[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size


def make_layout(max_seq_lens: Sequence[int], block_size: int, device, generator) -> PagedLayout:
    """Random, non-contiguous physical blocks per sequence (block 0 left unused).

    ``generator`` is a CPU generator."""
    import torch

    blocks_per_seq = [cdiv(length, block_size) for length in max_seq_lens]
    total = sum(blocks_per_seq)
    physical = (torch.randperm(total, generator=generator) + 1).to(torch.int32)
    table = torch.zeros(len(max_seq_lens), max(blocks_per_seq), dtype=torch.int32)
    offset = 0
    for row, count in enumerate(blocks_per_seq):
        table[row, :count] = physical[offset : offset + count]
        offset += count
    return PagedLayout(block_size, total + 1, table.to(device), list(max_seq_lens))


@dataclasses.dataclass
class Step:
    """One attention call: vLLM's per-step metadata (decodes first, then prefill chunks)."""

    query_lens: List[int]
    seq_lens: List[int]
    query_start_loc: Any
    seq_lens_tensor: Any
    slot_mapping: Any
    num_decodes: int

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens)


def make_step(layout: PagedLayout, query_lens: Sequence[int], seq_lens: Sequence[int]) -> Step:
    import torch

    device = layout.block_table.device
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    num_decodes = 0
    for length in query_lens:
        if length != 1:
            break
        num_decodes += 1
    slot_mapping = torch.cat(
        [layout.slots(i, seq - q, seq) for i, (q, seq) in enumerate(zip(query_lens, seq_lens))]
    )
    return Step(
        query_lens=list(query_lens),
        seq_lens=list(seq_lens),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens_tensor=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        slot_mapping=slot_mapping,
        num_decodes=num_decodes,
    )


def attended_keys(step: Step) -> int:
    """Sum over query tokens of the keys each attends to (causal)."""
    total = 0
    for q, seq in zip(step.query_lens, step.seq_lens):
        total += q * (seq - q) + q * (q + 1) // 2
    return total


def fill_cache(contender, layout: PagedLayout, key, value, seq_offsets: Sequence[int], chunk: int = 16384) -> None:
    """Write every position of every sequence through the contender's own store path."""
    import torch

    for seq_index, length in enumerate(layout.max_seq_lens):
        base = seq_offsets[seq_index]
        for start in range(0, length, chunk):
            stop = min(length, start + chunk)
            slots = layout.slots(seq_index, start, stop)
            contender.store(key[base + start : base + stop], value[base + start : base + stop], slots)
    if torch.cuda.is_available() and key.is_cuda:
        torch.cuda.synchronize()
