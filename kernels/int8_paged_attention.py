"""Paged attention over Govinda's INT8 KV cache (layout: :mod:`int8_kv_layout`): the host side.

One entry point, :func:`paged_attention_int8`, serves a mixed batch whose first
``num_decodes`` sequences are single-token decodes (vLLM orders them first):

* decodes -> the split-KV decode kernel and its reduce kernel (:mod:`int8_decode_attention`),
  partial results in a :class:`DecodeWorkspace`;
* the rest -> the Triton prefill kernel (:mod:`int8_prefill_attention`), or, with a
  :class:`GatheredPrefill`, gather-dequantize (:mod:`int8_kv_gather`) + a bf16 varlen kernel.

Launch configs (:mod:`launch_configs`) are passed in (``configs``; default: the device's
table) and only read. The fp32 reference is :mod:`int8_attention_reference` (re-exported here,
so a caller holds one module for the attention API).

Numerics: int8 K/V tiles are converted to the query dtype (exact for |q| <= 127) and fed to
``tl.dot`` with fp32 accumulation. Scales are never multiplied into the tiles: the K scale
multiplies the score columns (``S[:, n] *= k_scale[n]``) and the V scale the probability
columns (``P[:, n] *= v_scale[n]``) before ``P`` is rounded to the query dtype. Softmax runs in
base 2 with ``log2(e)`` folded into the softmax scale.

Rotation (``rotation="hadamard"``, cache written by the store kernel with the same rotation):
the unrotated kernels run on rotated rows. A row pass (:mod:`kv_rotation`) rotates the query
rows once into the output rows, where the kernels read them. The decode's
reduce kernel rotates each output row back as it merges it (so a rotated decode always takes
the reduce, even with one split); the Triton prefill works in place on its rows (each program
reads its own query tile before it writes the same tile) and a second pass rotates them back.
A pass over the rows costs about what reading and writing them does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import triton
import triton.language as tl

from .int8_attention_reference import attention_reference
from .int8_decode_attention import MAX_SLICES, decode_reduce_kernel, decode_split_kernel
from .int8_kv_gather import gather_kv_int8
from .int8_kv_layout import page_offsets
from .int8_kv_store import float32_view
from .int8_prefill_attention import prefill_attention_kernel
from .kv_rotation import NONE, check_rotation, log2_exact, normalizer, rotate_decode_rows, rotate_token_rows
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
# The decode's reduce: up to this many partial values per output row (splits x head_dim), one
# program merges (rotated: and rotates) a whole row; past it, head-dim slices merge in parallel
# (rotated: the last of a row rotates it). Unrotated, whole rows only once a step has a row per
# SM: fewer, fuller programs for batched steps, slices keep batch 1 spread
# (reports/h200/decode-bandwidth.md, top section).
WHOLE_ROW_REDUCE_ELEMENTS = 16384


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
    accumulator ``[head_dim]``, the base-2 running max and the exp-sum. ``row_count`` (zero
    between launches) counts the merged slices of each output row of a rotated decode.
    """

    partial_acc: torch.Tensor  # fp32 [max_entries * num_q_heads, head_dim]
    partial_max: torch.Tensor  # fp32 [max_entries * num_q_heads]
    partial_sum: torch.Tensor  # fp32 [max_entries * num_q_heads]
    row_count: torch.Tensor  # int32 [max_entries * num_q_heads]
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
        ``num_decodes * num_splits`` over all batch sizes (a single split counts: a rotated
        decode writes it there for the reduce kernel). ``num_kv_heads`` (default 1 = the
        worst case) tightens the bound. ``configs`` must be the launch configs the decodes
        will run with (their split policy sizes the buffer).
        """
        device = torch.device(device)
        max_entries = 1
        for num_decodes in range(1, max(int(max_num_seqs), 1) + 1):
            splits = decode_splits_for(num_decodes, num_kv_heads, device, configs)
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
            row_count=torch.zeros((rows,), dtype=torch.int32, device=device),
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


class _Step(NamedTuple):
    """The tensors of one call, in the order both attention kernels take them."""

    query: torch.Tensor
    output: torch.Tensor
    kv_cache: torch.Tensor
    cache_f32: torch.Tensor  # the same bytes as float32 (the scale regions)
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor

    def strides(self) -> tuple:
        """The stride arguments both attention kernels take, in their order."""
        return (*self.query.stride(), *self.output.stride(), self.kv_cache.stride(0), self.cache_f32.stride(0),
                self.block_table.stride(0))


def _page_constexprs(block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> dict:
    """The constexprs both attention kernels take: where V and the scales start in a page
    (scales in fp32 words) and the dot's input dtype."""
    offsets = page_offsets(block_size, num_kv_heads, head_dim)
    return dict(
        V_DATA_OFFSET=offsets.v_data, K_SCALE_OFFSET_F32=offsets.k_scale // 4, V_SCALE_OFFSET_F32=offsets.v_scale // 4,
        DOT_DTYPE=_DOT_DTYPES[dtype], UPCAST_DOT=interpreting(),
    )


def decode_slice(head_dim: int, config) -> int:
    """The head_dim slice the decode kernel works in for ``config`` (its ``d_slice``, 0 = whole),
    within the kernel's bounds: at most ``MAX_SLICES`` slices, at least 16 wide."""
    width = min(config.d_slice or head_dim, head_dim)
    if head_dim % width:
        width = head_dim
    return max(width, head_dim // MAX_SLICES, MIN_DOT_DIM)


def _reduce_form(num_decodes, num_q_heads, head_dim, num_splits, num_sms, rotate, reduce) -> tuple:
    """``(BLOCK_D, SPLIT_CHUNK)`` of the reduce launch: head-dim slices of ``reduce.block_n``
    merging ``reduce.block_m`` splits at a time (fixed, not sized to num_splits: a constexpr that
    followed the decode count would compile a new reduce kernel for each mixed batch's count while
    a request waits), or whole rows (see ``WHOLE_ROW_REDUCE_ELEMENTS``) with the chunk cut to keep
    the table's tile size. A function of the decode count only, so each form is compiled while
    CUDA graphs are captured. ``reduce`` is the table's reduce config."""
    if num_splits * head_dim <= WHOLE_ROW_REDUCE_ELEMENTS and (rotate or num_decodes * num_q_heads >= num_sms):
        return head_dim, max(1, reduce.block_m * min(reduce.block_n, head_dim) // head_dim)
    return min(reduce.block_n, head_dim), reduce.block_m


def _l2_prefetch(config) -> dict:
    """``L2_PREFETCH`` for the decode launch: the config's depth on NVIDIA; never on AMD (no such
    instruction) or under the interpreter (no inline assembly)."""
    depth = config.l2_prefetch
    if depth <= 0 or interpreting() or torch.version.hip is not None:
        return {}
    return {"L2_PREFETCH": depth}


def _launch_decode(
    step: _Step,
    *,
    block_size: int,
    num_kv_heads: int,
    qk_scale: float,
    num_decodes: int,
    num_splits: int,
    num_sms: int,
    workspace: Optional[DecodeWorkspace],
    configs: ArchLaunchConfigs,
    rotate: bool,
) -> None:
    num_tokens, num_q_heads, head_dim = step.query.shape
    group = num_q_heads // num_kv_heads
    config = configs.decode_config(head_dim)
    if rotate:
        # The decodes' query rows, rotated once into their output rows, where the split kernel
        # reads them (every split of a row needs the whole rotated query); the reduce kernel
        # overwrites those rows with the output, rotated back once per row.
        rotate_decode_rows(step.query, step.output, step.query_start_loc, step.seq_lens, num_decodes)
        step = step._replace(query=step.output)
    write_output = num_splits == 1 and not rotate
    if write_output:
        partial_acc = partial_max = partial_sum = row_count = step.output  # unused by the kernel
    else:
        if workspace is None:  # eager use: exactly this batch's size
            workspace = DecodeWorkspace.with_entries(num_decodes * num_splits, num_q_heads, head_dim, step.query.device)
        workspace.check_fits(num_decodes, num_splits, num_q_heads, head_dim)
        partial_acc, partial_max, partial_sum = workspace.partial_acc, workspace.partial_max, workspace.partial_sum
        row_count = workspace.row_count
    decode_split_kernel[(num_decodes, num_kv_heads, num_splits)](
        *step,
        partial_acc,
        partial_max,
        partial_sum,
        qk_scale,
        num_tokens,
        num_splits,
        *step.strides(),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        GROUP_PAD=max(MIN_DOT_DIM, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_N=config.block_n,
        D_SLICE=decode_slice(head_dim, config),
        MIN_TILES_PER_SPLIT=configs.decode_splits.min_tiles_per_split,
        WRITE_OUTPUT=write_output,
        **_page_constexprs(block_size, num_kv_heads, head_dim, step.query.dtype),
        **_l2_prefetch(config),
        **config.launch_kwargs(),
    )
    if write_output:
        return
    block_d, split_chunk = _reduce_form(num_decodes, num_q_heads, head_dim, num_splits, num_sms, rotate, configs.reduce)
    output = step.output
    decode_reduce_kernel[(num_decodes, num_q_heads, head_dim // block_d)](
        output,
        partial_acc,
        partial_max,
        partial_sum,
        row_count,
        step.query_start_loc,
        step.seq_lens,
        num_tokens,
        num_splits,
        output.stride(0),
        output.stride(1),
        output.stride(2),
        NUM_Q_HEADS=num_q_heads,
        HEAD_DIM=head_dim,
        BLOCK_N=config.block_n,
        MIN_TILES_PER_SPLIT=configs.decode_splits.min_tiles_per_split,
        SPLIT_CHUNK=split_chunk,
        BLOCK_D=block_d,
        ROTATE=rotate,
        LOG2_HEAD_DIM=log2_exact(head_dim),
        ROTATION_NORM=normalizer(head_dim),
        **configs.reduce.launch_kwargs(),
    )


def _launch_prefill(
    step: _Step,
    *,
    block_size: int,
    num_kv_heads: int,
    qk_scale: float,
    num_decodes: int,
    configs: ArchLaunchConfigs,
    rotate: bool,
) -> None:
    num_tokens, num_q_heads, head_dim = step.query.shape
    num_seqs = step.seq_lens.shape[0]
    config = configs.prefill_config(head_dim)
    # Upper bound on sum(cdiv(query_len, BLOCK_M)) over the prefills without reading query_start_loc.
    num_q_blocks = num_tokens // config.block_m + (num_seqs - num_decodes)
    if rotate:  # the prefill rows of ``output`` hold the rotated query until the kernel overwrites them
        rotate_token_rows(step.query, step.output, step.query_start_loc, num_decodes, num_seqs)
        step = step._replace(query=step.output)
    prefill_attention_kernel[(num_q_heads, num_q_blocks)](
        *step,
        qk_scale,
        num_decodes,
        num_seqs,
        num_q_blocks,
        *step.strides(),
        GROUP=num_q_heads // num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        **_page_constexprs(block_size, num_kv_heads, head_dim, step.query.dtype),
        **config.launch_kwargs(),
    )
    if rotate:
        rotate_token_rows(step.output, step.output, step.query_start_loc, num_decodes, num_seqs)


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
    step: _Step,
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
    query, output, kv_cache, _, query_start_loc, seq_lens, block_table = step
    head_dim = query.shape[2]
    # Transient: mixed batches are never captured as full CUDA graphs (the builder's support level).
    keys, values = torch.empty((2, plan.total_k, num_kv_heads, head_dim), dtype=query.dtype, device=query.device)
    gather_kv_int8(
        kv_cache, block_table, seq_lens, plan.cu_seqlens_k, keys, values,
        block_size=block_size, num_kv_heads=num_kv_heads, max_seqlen_k=plan.max_seqlen_k, rotation=rotation,
        block_t=configs.gather.block_n, launch_kwargs=configs.gather.launch_kwargs(), first_seq=num_decodes,
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
    step = _Step(query, output, kv_cache, cache_f32, query_start_loc, seq_lens, block_table)
    if num_decodes > 0:
        num_sms = sm_count(query.device, configs)
        num_splits = decode_num_splits(num_decodes, num_kv_heads, num_sms, configs.decode_splits)
        _launch_decode(step, num_decodes=num_decodes, num_splits=num_splits, num_sms=num_sms, workspace=workspace, **common)
    if num_seqs > num_decodes and gathered_prefill is not None:
        _gathered_prefill(
            step, plan=gathered_prefill, block_size=block_size, num_kv_heads=num_kv_heads, softmax_scale=softmax_scale,
            num_decodes=num_decodes, configs=configs, rotation=rotation,
        )
    elif num_seqs > num_decodes:
        _launch_prefill(step, num_decodes=num_decodes, **common)
    return output
