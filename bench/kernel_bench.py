#!/usr/bin/env python3
"""Side-by-side H200 benchmark of Govinda's INT8 KV-cache kernels against vLLM's own.

One layer of Qwen3.5-27B full attention (24 query heads, 4 KV heads, head_dim 256, bf16).
Contenders:

* ``ours_bs1552`` / ``ours_bs16`` -- ``paged_attention_int8`` and ``store_kv_int8`` on our page
  layout (``kernels/int8_kv_layout.py``); 1552 is the hybrid block size vLLM picks for Qwen3.5
  with a 2080-byte-per-token cache, 16 is a reference point.
* ``vllm_bf16_bs800`` -- vLLM's TRITON_ATTN backend on a bf16 cache (block size 800, what vLLM
  picks for Qwen3.5 in bf16).
* ``vllm_int8pth_bs1552`` -- vLLM's upstream ``--kv-cache-dtype int8_per_token_head`` on the
  same backend (same bytes per token as ours, hence the same hybrid block size).

The vLLM contenders are driven through ``TritonAttentionImpl.forward`` and
``TritonAttentionImpl.do_kv_cache_update`` with a ``TritonAttentionMetadata`` built the way
``TritonAttentionMetadataBuilder`` builds it (3D split-softmax segment buffers included), on a
cache tensor shaped and strided by ``TritonAttentionBackend`` -- i.e. the very kernels and
arguments a vLLM server runs, without a model around them.

Sections (``--sections``, run in this order): ``copy`` (device-to-device copy bandwidth, the
yardstick for every "fraction of copy bandwidth"), ``decode`` (batch 1 at 4K-32K, batch 8 at
8K), ``store`` (quantize-and-store / write cost per token), ``prefill`` (6K/12K/24K tokens one
shot, and as 2K-token chunks over the cached prefix). Timing modes: ``graph`` (replays of a
CUDA graph holding the call, as vLLM runs decode), ``eager`` (the Python call) -- both through
``triton.testing.do_bench`` with the L2 flushed before every rep -- and ``loop`` (back-to-back
eager calls, L2 warm, shows host launch overhead). Prefill is timed eager only.

Every section, case and contender is wrapped: a failure is recorded in the JSON (written after
every section) and the run goes on; ``--time-budget-s`` stops starting new cases once spent.
``--smoke`` runs tiny shapes (fp16) on the CPU under ``TRITON_INTERPRET=1`` to validate every
call signature, vLLM's kernels included (no CUDA graphs, no timings).

``--rotation`` compares our kernels with and without the Hadamard KV rotation instead
(``GOVINDA_KV_ROTATION``): ``ours_bs1552`` (none), ``ours_rot_bs1552`` (what ships: the rotation
fused into the store and decode kernels, the prefill between two Triton row-rotation passes) and
``ours_rotpp_bs1552`` (unrotated kernels with the rotation as bf16 torch matmuls before and after
every kernel: the alternative design), at decode 4K/32K,
prefill 6K/24K and store 1/2048 tokens; ratios are ``time_ratios[mode]["<name>_over_unrotated"]``.

``--fa3`` compares against FlashAttention-3 instead (issue #15): ``fa3_bf16_bs<B>`` (vLLM's shipped
FA3, ``vllm.vllm_flash_attn.flash_attn_varlen_func(..., fa_version=3)``, on a paged bf16 cache with
vLLM's block size for the geometry), ``ours_bs<B>`` (our INT8 kernels, Triton prefill) and
``ours_fa3_bs<B>`` (prefill = gather-dequantize the INT8 pages + FA3, what ``GOVINDA_PREFILL_KERNEL=fa3``
runs; decode is the same INT8 kernel, so it is timed on prefill only); every contender's output is
compared with fp32 attention on the original (unquantized) K/V, on up to 64 query rows per step.
``--geometry`` picks the layer: ``qwen35`` (24 q / 4 kv heads, D=256, block 1552 ours / 800 bf16)
or ``dense128`` (a Llama-8B layer: 32 q / 8 kv heads, D=128, block 16). Ratios are
``time_ratios[mode]["<name>_over_fa3"]``.

Run from the repository root (H200)::

    PYTHONPATH=$PWD:/tmp/site python3 bench/kernel_bench.py --out reports/kernel_bench_h200.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Run order: copy first (the others' bandwidth fractions refer to it), the long prefill last.
ALL_SECTIONS = ("copy", "decode", "store", "prefill")
_START = time.time()


def log(message: str) -> None:
    print(f"[{time.time() - _START:7.1f}s] {message}", flush=True)


def prepare_environment(smoke: bool) -> None:
    """Must run before torch/triton/vLLM are imported."""
    # The vLLM contenders must be stock vLLM: keep the Govinda overlay (installed by the repo's
    # sitecustomize, started when vLLM is imported) off unless the caller asked otherwise. Our
    # kernels are imported directly from kernels/ and do not need it.
    os.environ.setdefault("GOVINDA_DISABLE", "1")
    if not smoke:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    # vLLM swaps Triton for a placeholder when it finds no active GPU driver, except when
    # CUDA_VISIBLE_DEVICES is set and empty (it then assumes a worker still starting up);
    # the CPU smoke run relies on that to reach the real kernels through the interpreter.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


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


@dataclasses.dataclass
class BenchConfig:
    geometry: Geometry
    ours_block_size: int
    ours_small_block_size: Optional[int]
    bf16_block_size: int
    int8pth_block_size: int
    decode_cases: List[Tuple[int, int]]  # (batch, context)
    prefill_totals: List[int]
    prefill_chunk: int
    store_token_counts: List[int]
    copy_bytes: int
    warmup_ms: float
    rep_ms: float
    prefill_rep_ms: float


def make_config(args: argparse.Namespace) -> BenchConfig:
    if args.smoke:
        # Kept small: every Triton program runs in Python under the interpreter.
        return BenchConfig(
            geometry=SMOKE_GEOMETRY,
            ours_block_size=48,  # a non-power-of-two multiple of 16, like 1552
            ours_small_block_size=None,
            bf16_block_size=32,
            int8pth_block_size=48,
            decode_cases=[(1, 80), (2, 40)],
            prefill_totals=[64],
            prefill_chunk=32,
            store_token_counts=[1, 19],
            copy_bytes=1 << 20,
            warmup_ms=0.0,
            rep_ms=0.0,
            prefill_rep_ms=0.0,
        )
    if args.quick:
        config = BenchConfig(
            geometry=QWEN35_27B,
            ours_block_size=1552,
            ours_small_block_size=None,
            bf16_block_size=800,
            int8pth_block_size=1552,
            decode_cases=[(1, 8192), (1, 32768), (8, 8192)],
            prefill_totals=[6144],
            prefill_chunk=2048,
            store_token_counts=[1, 2048],
            copy_bytes=1 << 30,
            warmup_ms=5.0,
            rep_ms=20.0,
            prefill_rep_ms=20.0,
        )
    else:
        config = BenchConfig(
            geometry=QWEN35_27B,
            ours_block_size=1552,
            ours_small_block_size=16,
            bf16_block_size=800,
            int8pth_block_size=1552,
            decode_cases=[(1, 4096), (1, 8192), (1, 16384), (1, 32768), (8, 8192)],
            prefill_totals=[6144, 12288, 24576],
            prefill_chunk=2048,
            store_token_counts=[1, 8, 2048, 16384],
            copy_bytes=2 << 30,
            warmup_ms=10.0,
            rep_ms=40.0,
            prefill_rep_ms=30.0,
        )
    if getattr(args, "fa3", False):
        config.ours_small_block_size = None
        if not args.smoke:
            config.geometry, config.ours_block_size, config.bf16_block_size = FA3_GEOMETRIES[args.geometry]
            config.decode_cases = [(1, 4096), (1, 16384), (1, 32768), (8, 8192)]
            config.prefill_totals = [6144, 12288, 24576]
    if getattr(args, "rotation", False) and not args.smoke:
        config.ours_small_block_size = None
        config.decode_cases = [(1, 4096), (1, 32768)]
        config.prefill_totals = [6144, 24576]
        config.store_token_counts = [1, 2048]
    if args.no_bs16:
        config.ours_small_block_size = None
    if args.rep_ms is not None:
        config.rep_ms = config.prefill_rep_ms = args.rep_ms
    if args.warmup_ms is not None:
        config.warmup_ms = args.warmup_ms
    return config


# --------------------------------------------------------------------------------------------
# Loading the kernels under test
# --------------------------------------------------------------------------------------------


def load_our_kernels() -> SimpleNamespace:
    from govinda_patch.kernel_package import import_kernel

    layout = import_kernel("int8_kv_layout")
    store = import_kernel("int8_kv_store")
    attention = import_kernel("int8_paged_attention")
    try:
        arch_key = import_kernel("launch_configs").arch_key()
    except Exception as error:  # informational only
        arch_key = f"unknown ({type(error).__name__}: {error})"
    return SimpleNamespace(
        layout=layout,
        rotation=import_kernel("kv_rotation"),
        store_kv_int8=store.store_kv_int8,
        paged_attention_int8=attention.paged_attention_int8,
        DecodeWorkspace=attention.DecodeWorkspace,
        GatheredPrefill=getattr(attention, "GatheredPrefill", None),
        # Optional helper (not part of the API contract): the split count a decode batch gets.
        decode_splits_for=getattr(attention, "decode_splits_for", None),
        arch_key=arch_key,
    )


def load_vllm() -> SimpleNamespace:
    """vLLM's TRITON_ATTN backend pieces, plus whether this vLLM has int8_per_token_head."""
    import inspect

    import vllm
    from vllm.v1.attention.backends import triton_attn

    int8pth_reason = None
    if "int8_per_token_head" not in getattr(
        triton_attn.TritonAttentionBackend, "supported_kv_cache_dtypes", ()
    ):
        int8pth_reason = (
            f"vLLM {vllm.__version__}: TritonAttentionBackend does not list "
            "'int8_per_token_head' among its supported kv-cache dtypes"
        )
    else:
        try:
            from vllm.v1.kv_cache_interface import KVQuantMode

            KVQuantMode.INT8_PER_TOKEN_HEAD  # noqa: B018 - presence check
        except (ImportError, AttributeError) as error:
            int8pth_reason = f"vLLM {vllm.__version__}: no KVQuantMode.INT8_PER_TOKEN_HEAD ({error})"

    def where(obj: Any) -> str:
        try:
            return f"{inspect.getsourcefile(obj)}:{obj.__qualname__}"
        except (TypeError, AttributeError):
            return repr(obj)

    provenance = {
        "attention": where(triton_attn.TritonAttentionImpl.forward),
        "attention_kernel_wrapper": where(triton_attn.unified_attention),
        "store": where(triton_attn.TritonAttentionImpl.do_kv_cache_update),
        "store_bf16_kernel_wrapper": where(triton_attn.triton_reshape_and_cache_flash),
    }
    if int8pth_reason is None:
        provenance["store_int8pth_kernel_wrapper"] = where(
            triton_attn.triton_reshape_and_cache_flash_per_token_head_quant
        )
        provenance["int8pth_scale_views"] = where(triton_attn.TritonAttentionImpl._ensure_scale_caches)
    return SimpleNamespace(
        version=vllm.__version__,
        module=triton_attn,
        backend=triton_attn.TritonAttentionBackend,
        impl_cls=triton_attn.TritonAttentionImpl,
        metadata_cls=triton_attn.TritonAttentionMetadata,
        int8pth_unavailable_reason=int8pth_reason,
        provenance=provenance,
    )


@contextlib.contextmanager
def cpu_capability_shim(enabled: bool):
    """Smoke only: vLLM's bf16 cache writer reads the CUDA capability of the key's device for a
    tile-size heuristic; on the CPU there is none, so report an SM90 one for CPU tensors."""
    if not enabled:
        yield
        return
    import torch

    original = torch.cuda.get_device_capability

    def capability(device=None):
        if device is not None and torch.device(device).type == "cpu":
            return (9, 0)
        return original(device)

    torch.cuda.get_device_capability = capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Contenders
# --------------------------------------------------------------------------------------------


class OursContender:
    """Our kernels; ``rotation`` ``"hadamard"`` as shipped (see the module docstring), or
    ``"prepost"``: the same rotation as bf16 torch matmuls around the unrotated kernels (matrix
    preallocated, like an impl would)."""

    PREFIXES = {"none": "ours", "hadamard": "ours_rot", "prepost": "ours_rotpp"}

    def __init__(self, kernels: SimpleNamespace, geometry: Geometry, block_size: int, device, rotation: str = "none"):
        self.kernels = kernels
        self.geometry = geometry
        self.block_size = block_size
        self.device = device
        self.rotation = rotation
        self.kernel_rotation = "hadamard" if rotation == "hadamard" else "none"
        self.name = f"{self.PREFIXES[rotation]}_bs{block_size}"
        self.matrix = None
        self.cache = None
        self.workspace = None
        self.kv_bytes_per_token = kernels.layout.bytes_per_token(geometry.num_kv_heads, geometry.head_dim)
        # Launch configs passed to every call (None: the device's table); set with use_configs.
        self.configs = None

    def allocate(self, layout: PagedLayout) -> None:
        import torch

        g = self.geometry
        shape = self.kernels.layout.cache_shape(layout.num_blocks, self.block_size, g.num_kv_heads, g.head_dim)
        self.cache = torch.zeros(shape, dtype=torch.int8, device=self.device)
        self.block_table = layout.block_table
        self.max_decodes = max(len(layout.max_seq_lens), 1)
        self.use_configs(self.configs)

    def use_configs(self, configs) -> None:
        """Run with ``configs`` from now on (a workspace sized for their split policy)."""
        g = self.geometry
        self.configs = configs
        self.workspace = self.kernels.DecodeWorkspace.allocate(
            self.max_decodes, g.num_q_heads, g.head_dim, self.device, num_kv_heads=g.num_kv_heads, configs=configs
        )
        if self.rotation == "prepost":
            self.matrix = self.kernels.rotation.hadamard_matrix(g.head_dim, self.device, g.torch_dtype)

    def release(self) -> None:
        self.cache = None
        self.workspace = None
        self.matrix = None
        self.buffers = None

    def _rotated(self, x, out=None):
        """``x [..., D] @ H`` (bf16 in, fp32 accumulation, bf16 out) -- the pre/post design."""
        import torch

        flat = x.reshape(-1, x.shape[-1])
        if out is None:
            return torch.matmul(flat, self.matrix).view(x.shape)
        torch.matmul(flat, self.matrix, out=out.view(-1, x.shape[-1]))
        return out

    def store(self, key, value, slot_mapping) -> None:
        if self.rotation == "prepost":
            key, value = self._rotated(key), self._rotated(value)
        self.kernels.store_kv_int8(
            key, value, self.cache, slot_mapping, block_size=self.block_size, rotation=self.kernel_rotation
        )

    def prepare_step(self, step: Step) -> Step:
        if self.rotation == "prepost":
            import torch

            g = self.geometry
            shape = (step.num_tokens, g.num_q_heads, g.head_dim)
            # Preallocated: the timed call (and a captured graph) allocates nothing.
            self.buffers = tuple(torch.empty(shape, dtype=g.torch_dtype, device=self.device) for _ in range(2))
        return step

    def attention(self, query, output, step: Step) -> None:
        if self.rotation == "prepost":
            rotated_query, rotated_output = self.buffers
            self._attention(self._rotated(query, rotated_query), rotated_output, step)
            self._rotated(rotated_output, output)
            return
        self._attention(query, output, step)

    def _attention(self, query, output, step: Step) -> None:
        g = self.geometry
        self.kernels.paged_attention_int8(
            query,
            self.cache,
            output,
            step.query_start_loc,
            step.seq_lens_tensor,
            self.block_table,
            block_size=self.block_size,
            num_kv_heads=g.num_kv_heads,
            softmax_scale=g.softmax_scale,
            max_query_len=step.max_query_len,
            max_seq_len=step.max_seq_len,
            num_decodes=step.num_decodes,
            workspace=self.workspace,
            configs=self.configs,
            rotation=self.kernel_rotation,
            gathered_prefill=getattr(step, "gathered_prefill", None),
        )

    def dequantized_kv(self, layout: PagedLayout, seq_index: int, seq_len: int):
        g = self.geometry
        key, value = self.kernels.layout.gather_reference(
            self.cache, layout.block_table[seq_index], seq_len, self.block_size, g.num_kv_heads, g.head_dim
        )
        if self.rotation != "none":  # the page holds rotated rows
            key, value = self.kernels.rotation.hadamard_reference(key), self.kernels.rotation.hadamard_reference(value)
        return key, value


class VllmTritonContender:
    """vLLM's TRITON_ATTN backend for one kv-cache dtype ("auto" = bf16, or int8_per_token_head)."""

    def __init__(self, vllm_mod: SimpleNamespace, geometry: Geometry, block_size: int, cache_dtype: str, device):
        import torch

        self.vllm = vllm_mod
        self.geometry = geometry
        self.block_size = block_size
        self.cache_dtype = cache_dtype
        self.device = device
        label = "bf16" if cache_dtype == "auto" else "int8pth"
        self.name = f"vllm_{label}_bs{block_size}"
        if cache_dtype == "auto":
            self.torch_dtype = geometry.torch_dtype  # "auto" = the model dtype
            self.kv_bytes_per_token = 2 * geometry.num_kv_heads * geometry.head_dim * 2
        else:
            from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

            self.torch_dtype = STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]
            # K and V rows of head_dim int8 plus one fp32 scale each (vLLM pads the head dim).
            self.kv_bytes_per_token = 2 * geometry.num_kv_heads * (geometry.head_dim + 4)
        # The layer object vLLM passes to the impl: only the default (1.0) tensor scales are read.
        one = torch.tensor(1.0, dtype=torch.float32, device=device)
        self.layer = SimpleNamespace(
            _k_scale=one,
            _v_scale=one.clone(),
            _q_scale=one.clone(),
            _prob_scale=one.clone(),
            _k_scale_float=1.0,
            _v_scale_float=1.0,
            _q_scale_float=1.0,
        )
        # Builder constants: threshold for the 3D (split-softmax) decode path and its buffers.
        module = vllm_mod.module
        self.seq_threshold_3d = module.MIN_LAUNCH_GRID_SIZE_2D // geometry.num_kv_heads
        self.num_segments = module.NUM_PAR_SOFTMAX_SEGMENTS
        padded = 1 << (geometry.head_dim - 1).bit_length()
        hq = geometry.num_q_heads
        self.segm_output = torch.empty(
            (self.seq_threshold_3d, hq, self.num_segments, padded), dtype=torch.float32, device=device
        )
        self.segm_max = torch.empty((self.seq_threshold_3d, hq, self.num_segments), dtype=torch.float32, device=device)
        self.segm_expsum = torch.empty_like(self.segm_max)
        self.impl = None
        self.kv_cache = None
        self.stride_order_source = None

    def _new_impl(self):
        g = self.geometry
        return self.vllm.impl_cls(
            num_heads=g.num_q_heads,
            head_size=g.head_dim,
            scale=g.softmax_scale,
            num_kv_heads=g.num_kv_heads,
            alibi_slopes=None,
            sliding_window=None,
            kv_cache_dtype=self.cache_dtype,
        )

    def _stride_order(self, ndim: int) -> Tuple[Tuple[int, ...], str]:
        return _vllm_stride_order(self.vllm.backend, ndim)

    def allocate(self, layout: PagedLayout) -> None:
        import torch

        g = self.geometry
        shape = self.vllm.backend.get_kv_cache_shape(
            layout.num_blocks, self.block_size, g.num_kv_heads, g.head_dim, cache_dtype_str=self.cache_dtype
        )
        order, self.stride_order_source = self._stride_order(len(shape))
        physical = tuple(shape[i] for i in order)
        inverse = [order.index(i) for i in range(len(order))]
        # vLLM allocates caches zeroed and views them in the backend's stride order.
        self.kv_cache = torch.zeros(physical, dtype=self.torch_dtype, device=self.device).permute(*inverse)
        # The impl caches the per-token-head scale views of the first cache it sees.
        self.impl = self._new_impl()
        self.block_table = layout.block_table

    def release(self) -> None:
        self.kv_cache = None
        self.impl = None

    def store(self, key, value, slot_mapping) -> None:
        self.impl.do_kv_cache_update(self.layer, key, value, self.kv_cache, slot_mapping)

    def prepare_step(self, step: Step):
        """The TritonAttentionMetadata TritonAttentionMetadataBuilder.build would produce."""
        values = dict(
            num_actual_tokens=step.num_tokens,
            max_query_len=step.max_query_len,
            query_start_loc=step.query_start_loc,
            max_seq_len=step.max_seq_len,
            seq_lens=step.seq_lens_tensor,
            block_table=self.block_table,
            slot_mapping=step.slot_mapping,
            seq_threshold_3D=self.seq_threshold_3d,
            num_par_softmax_segments=self.num_segments,
            softmax_segm_output=self.segm_output,
            softmax_segm_max=self.segm_max,
            softmax_segm_expsum=self.segm_expsum,
            causal=True,
            use_cascade=False,
            common_prefix_len=0,
            cu_prefix_query_lens=None,
            prefix_kv_lens=None,
            suffix_kv_lens=None,
        )
        fields = dataclasses.fields(self.vllm.metadata_cls)
        names = {field.name for field in fields}
        missing = [
            f.name
            for f in fields
            if f.name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        ]
        if missing:
            raise RuntimeError(f"TritonAttentionMetadata needs fields this bench does not know: {missing}")
        return self.vllm.metadata_cls(**{k: v for k, v in values.items() if k in names})

    def attention(self, query, output, metadata) -> None:
        self.impl.forward(self.layer, query, None, None, self.kv_cache, metadata, output)

    def dequantized_kv(self, layout: PagedLayout, seq_index: int, seq_len: int):
        """Float32 K, V ``[seq_len, H, D]`` as stored in this cache (dequantized for int8)."""
        import torch

        g = self.geometry
        positions = torch.arange(seq_len, device=self.device)
        blocks = layout.block_table[seq_index].long()[positions // self.block_size]
        offsets = positions % self.block_size
        if self.cache_dtype == "auto":
            # Mirrors TritonAttentionImpl.forward: (B, H, N, 2*hs) -> transpose -> split.
            if self.kv_cache.dim() == 5:  # vLLM <= 0.18: (B, 2, N, H, hs)
                key_cache, value_cache = self.kv_cache.unbind(1)
            else:
                key_cache, value_cache = self.kv_cache.transpose(1, 2).split(g.head_dim, dim=-1)
            return key_cache[blocks, offsets].float(), value_cache[blocks, offsets].float()
        key_cache, value_cache = self.impl._pth_key_value_caches(self.kv_cache)
        k_scale, v_scale = self.impl._k_scale_cache, self.impl._v_scale_cache
        key = key_cache[blocks, offsets][..., : g.head_dim].float() * k_scale[blocks, offsets].unsqueeze(-1)
        value = value_cache[blocks, offsets][..., : g.head_dim].float() * v_scale[blocks, offsets].unsqueeze(-1)
        return key, value


@functools.lru_cache(maxsize=None)
def _vllm_stride_order(backend, ndim: int) -> Tuple[Tuple[int, ...], str]:
    """The backend's KV-cache stride order, and how it was obtained."""
    try:
        return tuple(backend.get_kv_cache_stride_order()), "TritonAttentionBackend.get_kv_cache_stride_order()"
    except Exception as first_error:  # vLLM 0.26 reads the layout from the current VllmConfig
        try:
            from vllm.config import VllmConfig, set_current_vllm_config

            with set_current_vllm_config(VllmConfig()):
                order = tuple(backend.get_kv_cache_stride_order())
            return order, "TritonAttentionBackend.get_kv_cache_stride_order() under a default VllmConfig"
        except Exception as second_error:
            if ndim == 4:
                # Without a KV connector vLLM's layout is NHD (see get_kv_connector_cache_layout):
                # physical (blocks, block_size, heads, 2 * head) under the logical (blocks, heads, ...).
                return (0, 2, 1, 3), f"assumed NHD default ({first_error!r}; {second_error!r})"
            return tuple(range(ndim)), f"identity ({first_error!r}; {second_error!r})"


class Fa3Contender:
    """vLLM's FlashAttention-3 on a paged bf16 cache ``[num_blocks, block_size, Hkv, D]`` (K and V
    apart, as vLLM's FLASH_ATTN backend allocates them), one varlen call per step."""

    def __init__(self, fa, geometry: Geometry, block_size: int, device):
        self.fa = fa
        self.geometry = geometry
        self.block_size = block_size
        self.device = device
        self.name = f"fa3_bf16_bs{block_size}"
        self.kv_bytes_per_token = 2 * geometry.num_kv_heads * geometry.head_dim * 2
        self.key_cache = self.value_cache = None

    def allocate(self, layout: PagedLayout) -> None:
        import torch

        g = self.geometry
        shape = (layout.num_blocks, self.block_size, g.num_kv_heads, g.head_dim)
        self.key_cache = torch.zeros(shape, dtype=g.torch_dtype, device=self.device)
        self.value_cache = torch.zeros_like(self.key_cache)
        self.block_table = layout.block_table

    def release(self) -> None:
        self.key_cache = self.value_cache = None

    def store(self, key, value, slot_mapping) -> None:
        g = self.geometry
        self.key_cache.view(-1, g.num_kv_heads, g.head_dim)[slot_mapping] = key
        self.value_cache.view(-1, g.num_kv_heads, g.head_dim)[slot_mapping] = value

    def prepare_step(self, step: Step) -> Step:
        return step

    def attention(self, query, output, step: Step) -> None:
        self.fa.flash_attn_varlen_func(
            query, self.key_cache, self.value_cache,
            max_seqlen_q=step.max_query_len, cu_seqlens_q=step.query_start_loc,
            max_seqlen_k=step.max_seq_len, seqused_k=step.seq_lens_tensor, block_table=self.block_table,
            softmax_scale=self.geometry.softmax_scale, causal=True, out=output, fa_version=3,
        )

    def dequantized_kv(self, layout: PagedLayout, seq_index: int, seq_len: int):
        import torch

        positions = torch.arange(seq_len, device=self.device)
        blocks = layout.block_table[seq_index].long()[positions // self.block_size]
        offsets = positions % self.block_size
        return self.key_cache[blocks, offsets].float(), self.value_cache[blocks, offsets].float()


class OursFa3Contender(OursContender):
    """Our INT8 cache with the prefill on gather-dequantize + FA3 (``GOVINDA_PREFILL_KERNEL=fa3``);
    the host sizes come from the step's lists, as the metadata builder takes them from its CPU copies."""

    def __init__(self, kernels: SimpleNamespace, geometry: Geometry, block_size: int, device, varlen):
        super().__init__(kernels, geometry, block_size, device)
        self.name = f"ours_fa3_bs{block_size}"
        self.varlen = varlen

    def prepare_step(self, step: Step) -> Step:
        import torch

        step = dataclasses.replace(super().prepare_step(step))
        lens, query_lens = step.seq_lens[step.num_decodes :], step.query_lens[step.num_decodes :]
        if lens:
            cu, cu_q = [0], [0]
            for length, query_len in zip(lens, query_lens):
                cu.append(cu[-1] + length)
                cu_q.append(cu_q[-1] + query_len)
            step.gathered_prefill = self.kernels.GatheredPrefill(
                varlen_attention=self.varlen,
                cu_seqlens_k=torch.tensor(cu, dtype=torch.int32, device=self.device),
                cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device=self.device),
                total_k=cu[-1], max_seqlen_k=max(lens), max_seqlen_q=max(query_lens),
                num_prefill_tokens=sum(query_lens),
            )
        return step


def build_fa3_contenders(ctx: "Context", prefill: bool) -> List[Tuple[str, Any, Optional[str]]]:
    """--fa3: FA3 bf16 (the baseline, first), ours, and ours with the FA3 prefill (prefill cases)."""
    config, geometry, device = ctx.config, ctx.config.geometry, ctx.device
    fa3_name = f"fa3_bf16_bs{config.bf16_block_size}"
    ours_name, ours_fa3_name = f"ours_bs{config.ours_block_size}", f"ours_fa3_bs{config.ours_block_size}"
    fa, why_not = (None, "FA3 needs an NVIDIA GPU (smoke run on the CPU)") if ctx.smoke else ctx.fa3
    result: List[Tuple[str, Any, Optional[str]]] = [
        (fa3_name, Fa3Contender(fa, geometry, config.bf16_block_size, device) if fa else None, why_not)
    ]
    if ctx.ours is None:
        return result + [(ours_name, None, f"our kernels not importable: {ctx.ours_error}")]
    result.append((ours_name, OursContender(ctx.ours, geometry, config.ours_block_size, device), None))
    if prefill:
        varlen = ctx.fa3_varlen if fa else None
        contender = OursFa3Contender(ctx.ours, geometry, config.ours_block_size, device, varlen) if varlen else None
        result.append((ours_fa3_name, contender, None if contender else why_not))
    return result


def build_contenders(
    ctx: "Context", include_small: bool = True, prefill: bool = False
) -> List[Tuple[str, Any, Optional[str]]]:
    """``(name, contender or None, reason when unavailable)``; the bf16 baseline comes first."""
    config, geometry, device = ctx.config, ctx.config.geometry, ctx.device
    result: List[Tuple[str, Any, Optional[str]]] = []
    if getattr(ctx.args, "fa3", False):
        return build_fa3_contenders(ctx, prefill)
    if getattr(ctx.args, "rotation", False):
        for rotation in ("none", "hadamard", "prepost"):
            name = f"{OursContender.PREFIXES[rotation]}_bs{config.ours_block_size}"
            if ctx.ours is None:
                result.append((name, None, f"our kernels not importable: {ctx.ours_error}"))
            else:
                result.append((name, OursContender(ctx.ours, geometry, config.ours_block_size, device, rotation), None))
        return result
    bf16_name = f"vllm_bf16_bs{config.bf16_block_size}"
    int8_name = f"vllm_int8pth_bs{config.int8pth_block_size}"
    if ctx.vllm is None:
        result.append((bf16_name, None, f"vLLM not importable: {ctx.vllm_error}"))
        result.append((int8_name, None, f"vLLM not importable: {ctx.vllm_error}"))
    else:
        result.append((bf16_name, VllmTritonContender(ctx.vllm, geometry, config.bf16_block_size, "auto", device), None))
        if ctx.vllm.int8pth_unavailable_reason is None:
            contender = VllmTritonContender(
                ctx.vllm, geometry, config.int8pth_block_size, "int8_per_token_head", device
            )
            result.append((int8_name, contender, None))
        else:
            result.append((int8_name, None, ctx.vllm.int8pth_unavailable_reason))
    sizes = [config.ours_block_size]
    if include_small and config.ours_small_block_size:
        sizes.append(config.ours_small_block_size)
    for size in sizes:
        name = f"ours_bs{size}"
        if ctx.ours is None:
            result.append((name, None, f"our kernels not importable: {ctx.ours_error}"))
        else:
            result.append((name, OursContender(ctx.ours, geometry, size, device), None))
    return result


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


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


class Timer:
    """``triton.testing.do_bench`` (L2 flushed before every rep, CUDA events around each call)."""

    def __init__(self, smoke: bool, warmup_ms: float):
        self.smoke = smoke
        self.warmup_ms = warmup_ms

    @staticmethod
    def _summary(times_ms: Sequence[float]) -> Dict[str, Any]:
        ordered = sorted(times_ms)
        n = len(ordered)

        def quantile(q: float) -> float:
            return ordered[min(n - 1, max(0, int(round(q * (n - 1)))))]

        return {
            "median_us": 1e3 * quantile(0.5),
            "p20_us": 1e3 * quantile(0.2),
            "p80_us": 1e3 * quantile(0.8),
            "min_us": 1e3 * ordered[0],
            "reps": n,
        }

    def eager(self, fn: Callable[[], None], rep_ms: float) -> Dict[str, Any]:
        if self.smoke:
            fn()
            return {"median_us": None, "note": "smoke: ran once under TRITON_INTERPRET, not timed"}
        import triton.testing

        times = triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=rep_ms, return_mode="all")
        return self._summary(times)

    def loop(self, fn: Callable[[], None], rep_ms: float, calls: int = 200) -> Dict[str, Any]:
        """Per-call time of back-to-back eager calls: L2 stays warm, and when the host cannot
        launch as fast as the GPU runs, the Python/launch overhead shows (as in vLLM's eager and
        piecewise-graph steps, where attention runs outside the graph)."""
        if self.smoke:
            return {"median_us": None, "note": "smoke: not timed"}
        import torch

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        wall = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        host_us = (time.perf_counter() - wall) * 1e6 / calls
        torch.cuda.synchronize()
        per_call_us = 1e3 * start.elapsed_time(end) / calls
        return {"median_us": per_call_us, "host_launch_us_per_call": host_us, "calls": calls}

    # Back-to-back calls of the loop mode (fewer for long prefills, --fa3).
    loop_calls = 200

    def measure(self, mode: str, fn: Callable[[], None], rep_ms: float) -> Dict[str, Any]:
        if mode == "loop":
            return self.loop(fn, rep_ms, calls=self.loop_calls)
        return {"graph": self.graph, "eager": self.eager}[mode](fn, rep_ms)

    def graph(self, fn: Callable[[], None], rep_ms: float) -> Dict[str, Any]:
        if self.smoke:
            return {"median_us": None, "note": "smoke: no CUDA graphs on the CPU"}
        import torch
        import triton.testing

        # Warm up (compiles the Triton kernels) on a side stream, then capture, as vLLM does.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        times = triton.testing.do_bench(graph.replay, warmup=self.warmup_ms, rep=rep_ms, return_mode="all")
        del graph
        return self._summary(times)


# --------------------------------------------------------------------------------------------
# Run context, results and JSON
# --------------------------------------------------------------------------------------------


class Context:
    def __init__(self, args: argparse.Namespace, config: BenchConfig):
        import torch

        self.args = args
        self.config = config
        self.smoke = args.smoke
        self.device = torch.device("cpu") if args.smoke else torch.device("cuda")
        self.timer = Timer(args.smoke, config.warmup_ms)
        self.copy_bw_gbps: Optional[float] = None
        self.seed = args.seed
        budget = getattr(args, "time_budget_s", 0) or 0
        self.deadline = _START + budget if budget > 0 else None
        self.payload: Optional[Dict[str, Any]] = None  # set by main(): checkpoints go to args.out
        try:
            self.ours = load_our_kernels()
            self.ours_error = None
        except Exception as error:  # recorded; the vLLM contenders still run
            self.ours, self.ours_error = None, f"{type(error).__name__}: {error}"
        try:
            self.vllm = load_vllm()
            self.vllm_error = None
        except Exception as error:
            self.vllm, self.vllm_error = None, f"{type(error).__name__}: {error}"
        self.fa3, self.fa3_varlen = (None, "not asked for (--fa3)"), None
        if getattr(args, "fa3", False) and not args.smoke:
            from govinda_patch.int8.prefill_kernel import fa3_interface, fa3_varlen

            self.fa3, (self.fa3_varlen, _) = fa3_interface(), fa3_varlen()

    def generator(self, salt: int):
        import torch

        generator = torch.Generator(device=self.device)
        generator.manual_seed(self.seed * 1000003 + salt)
        return generator

    def start_section(self, name: str) -> List[Dict[str, Any]]:
        """The case list of a running section, visible in the JSON checkpoints."""
        cases: List[Dict[str, Any]] = []
        if self.payload is not None:
            self.payload["sections"][name] = {"status": "running", "cases": cases}
        return cases

    def checkpoint(self) -> None:
        if self.payload is not None:
            write_json(self.args.out, self.payload)

    def skip_for_time(self, case_name: str) -> Optional[Dict[str, Any]]:
        """A 'skipped' record once the --time-budget-s deadline has passed, else None."""
        if self.deadline is None or time.time() < self.deadline:
            return None
        log(f"  {case_name}: skipped, time budget exhausted")
        return {"case": case_name, "status": "skipped", "reason": "time budget (--time-budget-s) exhausted"}

    def cpu_generator(self, salt: int):
        import torch

        return torch.Generator().manual_seed(self.seed * 1000003 + salt)


def error_record(error: BaseException) -> Dict[str, Any]:
    return {
        "status": "error",
        "error": f"{type(error).__name__}: {error}",
        "traceback": traceback.format_exc(limit=12),
    }


def bandwidth_fields(ctx: Context, time_us: Optional[float], bytes_read: int, bytes_written: int = 0) -> Dict[str, Any]:
    fields: Dict[str, Any] = {"bytes_read": bytes_read, "bytes_written": bytes_written}
    if time_us:
        read_bw = bytes_read / (time_us * 1e-6) / 1e9
        fields["eff_bw_read_GBps"] = read_bw
        fields["eff_bw_read_write_GBps"] = (bytes_read + bytes_written) / (time_us * 1e-6) / 1e9
        if ctx.copy_bw_gbps:
            fields["frac_of_copy_bw"] = read_bw / ctx.copy_bw_gbps
            fields["frac_rw_of_copy_bw"] = fields["eff_bw_read_write_GBps"] / ctx.copy_bw_gbps
    return fields


def write_json(path: Path, payload: Dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2, default=str))
    temporary.replace(path)


def environment_metadata(args: argparse.Namespace, script: str) -> Dict[str, Any]:
    meta: Dict[str, Any] = {
        "script": script,
        "command_line": " ".join([sys.executable] + sys.argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "smoke": bool(args.smoke),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("GOVINDA_", "VLLM_", "TRITON_", "CUDA_"))},
    }
    try:
        import torch

        meta["torch"] = torch.__version__
        meta["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available() and not args.smoke:
            props = torch.cuda.get_device_properties(0)
            meta["gpu"] = props.name
            meta["gpu_sm_count"] = props.multi_processor_count
            meta["gpu_memory_GiB"] = round(props.total_memory / 2**30, 1)
            meta["gpu_capability"] = list(torch.cuda.get_device_capability(0))
    except Exception as error:
        meta["torch_error"] = repr(error)
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception as error:
        meta["triton_error"] = repr(error)
    try:
        import vllm

        meta["vllm"] = vllm.__version__
        meta["vllm_path"] = str(Path(vllm.__file__).parent)
    except Exception as error:
        meta["vllm_error"] = repr(error)
    # The repo's sitecustomize starts the overlay when vLLM is imported (see prepare_environment).
    bootstrap = sys.modules.get("govinda_patch.bootstrap")
    if bootstrap is None:
        meta["govinda_overlay"] = "not started"
    else:
        meta["govinda_overlay"] = "active" if getattr(bootstrap, "OVERLAY", None) is not None else "off"
    return meta


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def section_copy(ctx: Context) -> Dict[str, Any]:
    import torch

    size = ctx.config.copy_bytes
    log(f"copy: device-to-device copy of {size / 2**20:.0f} MiB")
    source = torch.empty(size, dtype=torch.uint8, device=ctx.device)
    target = torch.empty_like(source)
    source.fill_(7)
    stats = ctx.timer.eager(lambda: target.copy_(source), rep_ms=max(ctx.config.rep_ms, 20.0) if not ctx.smoke else 0)
    result: Dict[str, Any] = {"status": "ok", "bytes_copied": size, "bytes_read_plus_written": 2 * size, "timing": stats}
    if stats.get("median_us"):
        ctx.copy_bw_gbps = 2 * size / (stats["median_us"] * 1e-6) / 1e9
        result["copy_bw_GBps"] = ctx.copy_bw_gbps
        result["copy_bw_GBps_best"] = 2 * size / (stats["min_us"] * 1e-6) / 1e9
        log(f"copy bandwidth (read + written): {ctx.copy_bw_gbps:.0f} GB/s")
    if not torch.equal(target[:4096], source[:4096]):
        raise RuntimeError("copy produced wrong bytes")
    return result


def _compare(outputs: Dict[str, Any], name: str, baseline: str) -> Optional[float]:
    if baseline not in outputs or name not in outputs or name == baseline:
        return None
    return float((outputs[name].float() - outputs[baseline].float()).abs().max())


def run_attention_case(
    ctx: Context,
    case_name: str,
    seq_lens: List[int],
    steps: List[Tuple[List[int], List[int], int]],  # (query_lens, seq_lens, first query row)
    timing_modes: Sequence[str],
    rep_ms: float,
    salt: int,
    include_small: bool = True,
    prefill: bool = False,
) -> Dict[str, Any]:
    """Fill each contender's cache with the same K/V, then time each step's attention call."""
    import torch

    geometry = ctx.config.geometry
    total_kv = sum(seq_lens)
    max_query_rows = max(start + sum(q) for q, _, start in steps)
    generator = ctx.generator(salt)
    key, value, query = realistic_qkv(total_kv, max_query_rows, geometry, ctx.device, generator)
    seq_offsets = [0]
    for length in seq_lens[:-1]:
        seq_offsets.append(seq_offsets[-1] + length)

    case: Dict[str, Any] = {
        "case": case_name,
        "seq_lens": seq_lens,
        "steps": [(q, s) for q, s, _ in steps],
        "contenders": {},
    }
    outputs_per_step: List[Dict[str, Any]] = [dict() for _ in steps]
    baseline = None
    fa3_mode = getattr(ctx.args, "fa3", False)
    references: Dict[int, Any] = {}  # step -> (sampled rows, fp32 attention on the original K/V)
    for name, contender, reason in build_contenders(ctx, include_small, prefill):
        if contender is None:
            case["contenders"][name] = {"status": "skipped", "reason": reason}
            log(f"  {case_name} {name}: skipped ({reason})")
            continue
        if baseline is None and (name.startswith(("vllm_bf16", "fa3_bf16")) or getattr(ctx.args, "rotation", False)):
            baseline = name  # rotation mode: the unrotated INT8 kernels
        record: Dict[str, Any] = {"status": "ok", "kv_bytes_per_token": contender.kv_bytes_per_token}
        try:
            layout = make_layout(seq_lens, contender.block_size, ctx.device, ctx.cpu_generator(salt + 1))
            contender.allocate(layout)
            if isinstance(contender, VllmTritonContender):
                record["vllm_seq_threshold_3D"] = contender.seq_threshold_3d
                record["vllm_num_par_softmax_segments"] = contender.num_segments
                record["vllm_stride_order"] = contender.stride_order_source
                record["vllm_kv_cache_shape"] = list(contender.kv_cache.shape)
                record["vllm_kv_cache_stride"] = list(contender.kv_cache.stride())
            fill_cache(contender, layout, key, value, seq_offsets)
            step_records = []
            for index, (query_lens, step_seq_lens, first_row) in enumerate(steps):
                step = make_step(layout, query_lens, step_seq_lens)
                prepared = contender.prepare_step(step)
                rows = step.num_tokens
                step_query = query[first_row : first_row + rows]
                output = torch.zeros(rows, geometry.num_q_heads, geometry.head_dim, dtype=query.dtype, device=ctx.device)

                def call(contender=contender, step_query=step_query, output=output, prepared=prepared):
                    contender.attention(step_query, output, prepared)

                query_bytes = rows * geometry.num_q_heads * geometry.head_dim * query.element_size()
                bytes_read = query_bytes + sum(step_seq_lens) * contender.kv_bytes_per_token
                bytes_written = query_bytes
                flops = 4 * geometry.num_q_heads * geometry.head_dim * attended_keys(step)
                step_record: Dict[str, Any] = {"query_lens": query_lens, "seq_lens": step_seq_lens, "flops": flops}
                if isinstance(contender, VllmTritonContender):
                    uses_3d = step.max_query_len == 1 and len(step.seq_lens) <= contender.seq_threshold_3d
                    step_record["vllm_kernel_path"] = "3D split-softmax + reduce_segments" if uses_3d else "2D"
                elif isinstance(contender, OursContender) and step.num_decodes and ctx.ours.decode_splits_for is not None:
                    step_record["ours_decode_splits"] = ctx.ours.decode_splits_for(
                        step.num_decodes, geometry.num_kv_heads, ctx.device
                    )
                for mode in timing_modes:
                    try:
                        stats = ctx.timer.measure(mode, call, rep_ms)
                        entry = {"timing": stats, "time_us": stats.get("median_us")}
                        entry.update(bandwidth_fields(ctx, stats.get("median_us"), bytes_read, bytes_written))
                        if stats.get("median_us"):
                            entry["tflops"] = flops / (stats["median_us"] * 1e-6) / 1e12
                        step_record[mode] = entry
                    except Exception as error:
                        step_record[mode] = error_record(error)
                        log(f"  {case_name} {name} step {index} {mode}: ERROR {error}")
                finite = bool(torch.isfinite(output.float()).all())
                step_record["output_finite"] = finite
                step_record["output_abs_mean"] = float(output.float().abs().mean())
                outputs_per_step[index][name] = output
                diff = _compare(outputs_per_step[index], name, baseline) if baseline else None
                step_record["max_abs_diff_vs_bf16"] = diff
                if fa3_mode:
                    if index not in references:
                        references[index] = fp32_reference_rows(
                            query[first_row : first_row + rows], key, value, seq_offsets, step, geometry
                        )
                    sampled, reference = references[index]
                    step_record["max_abs_err_vs_fp32_original"] = float(
                        (output[sampled].float() - reference).abs().max()
                    )
                step_records.append(step_record)
            record["steps"] = step_records
            for mode in timing_modes:
                times = [s.get(mode, {}).get("time_us") for s in step_records]
                if times and all(t is not None for t in times):
                    record[f"{mode}_time_us_total"] = sum(times)
            finite_all = all(s["output_finite"] for s in step_records)
            record["output_finite"] = finite_all
            summary = ", ".join(
                f"{mode} {_fmt(record.get(f'{mode}_time_us_total'), '.1f')} us" for mode in timing_modes
            )
            log(f"  {case_name} {name}: {summary}; finite={finite_all}")
        except Exception as error:
            record = error_record(error)
            log(f"  {case_name} {name}: ERROR {record['error']}")
        finally:
            contender.release()
        case["contenders"][name] = record
    for outputs in outputs_per_step:
        outputs.clear()
    return case


def fp32_reference_rows(query, key, value, seq_offsets, step: Step, geometry: Geometry, per_seq: int = 64):
    """fp32 causal attention on the original K/V for up to ``per_seq`` query rows per sequence of
    ``step`` (its first and last rows: the shortest and the longest contexts); ``(rows, out)``."""
    import torch

    rows, outputs, start = [], [], 0
    for seq, (query_len, seq_len) in enumerate(zip(step.query_lens, step.seq_lens)):
        picked = sorted(set(range(min(per_seq // 2, query_len))) | set(range(max(0, query_len - per_seq // 2), query_len)))
        base = seq_offsets[seq]
        k = key[base : base + seq_len].float().repeat_interleave(geometry.group_size, dim=1)
        v = value[base : base + seq_len].float().repeat_interleave(geometry.group_size, dim=1)
        index = torch.tensor(picked, device=query.device)
        q = query[start + index].float()
        scores = torch.einsum("qhd,khd->hqk", q, k) * geometry.softmax_scale
        positions = (seq_len - query_len + index)[:, None]
        scores = scores.masked_fill(torch.arange(seq_len, device=query.device)[None, :] > positions, float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        rows += [start + p for p in picked]
        start += query_len
    return torch.tensor(rows, device=query.device), torch.cat(outputs)


def add_ratios(ctx: Context, case: Dict[str, Any], modes: Sequence[str]) -> None:
    ours = f"ours_bs{ctx.config.ours_block_size}"
    # --fa3 / --rotation: each of our variants over one baseline, "<prefix>_over_<label>".
    if getattr(ctx.args, "fa3", False):
        baseline, label, prefixes = f"fa3_bf16_bs{ctx.config.bf16_block_size}", "fa3", ("ours", "ours_fa3")
    elif getattr(ctx.args, "rotation", False):
        baseline, label, prefixes = ours, "unrotated", ("ours_rot", "ours_rotpp")
    else:
        baseline = None
    if baseline is not None:
        case["time_ratios"] = {
            mode: {
                f"{prefix}_over_{label}": _ratio(case["contenders"], f"{prefix}_bs{ctx.config.ours_block_size}", baseline, mode)
                for prefix in prefixes
            }
            for mode in modes
        }
        return
    bf16 = f"vllm_bf16_bs{ctx.config.bf16_block_size}"
    int8 = f"vllm_int8pth_bs{ctx.config.int8pth_block_size}"
    ratios: Dict[str, Any] = {}
    contenders = case["contenders"]
    for mode in modes:
        key = f"{mode}_time_us_total"
        ours_time = contenders.get(ours, {}).get(key)
        entry = {}
        for label, other in (("ours_over_vllm_bf16", bf16), ("ours_over_vllm_int8pth", int8)):
            other_time = contenders.get(other, {}).get(key)
            entry[label] = (ours_time / other_time) if (ours_time and other_time) else None
        ratios[mode] = entry
    case["time_ratios"] = ratios


def _ratio(contenders: Dict[str, Any], name: str, baseline: str, mode: str) -> Optional[float]:
    def time_of(record):
        return record.get(f"{mode}_time_us_total") or record.get(mode, {}).get("time_us")

    this, base = time_of(contenders.get(name, {})), time_of(contenders.get(baseline, {}))
    return this / base if (this and base) else None


def section_decode(ctx: Context) -> Dict[str, Any]:
    cases = ctx.start_section("decode")
    # --fa3: CUDA-graph replays only (how vLLM runs decode); the other modes add nothing to the line.
    # (A smoke run times nothing and runs no graphs: eager at least calls every contender.)
    modes = ("graph", "eager", "loop")
    if getattr(ctx.args, "fa3", False):
        modes = ("eager",) if ctx.smoke else ("graph",)
    for index, (batch, context) in enumerate(ctx.config.decode_cases):
        name = f"decode_b{batch}_ctx{context}"
        skipped = ctx.skip_for_time(name)
        if skipped:
            cases.append(skipped)
            continue
        log(f"decode: batch {batch} x context {context}")
        try:
            seq_lens = [context] * batch
            case = run_attention_case(
                ctx, name, seq_lens, [([1] * batch, seq_lens, 0)], modes, ctx.config.rep_ms, salt=100 + index
            )
            case.update({"batch": batch, "context": context})
            add_ratios(ctx, case, modes)
        except Exception as error:
            case = {"case": name, **error_record(error)}
            log(f"  {name}: ERROR {case['error']}")
        cases.append(case)
        ctx.checkpoint()
    return {"status": "ok", "timing_modes": list(modes), "cases": cases}


def section_prefill(ctx: Context) -> Dict[str, Any]:
    cases = ctx.start_section("prefill")
    modes: Tuple[str, ...] = ("eager",)
    if getattr(ctx.args, "fa3", False) and not ctx.smoke:
        # Back-to-back calls too: their host_launch_us_per_call shows where a short chunk is
        # bound by the host (Python + launches) rather than by the GPU.
        modes, ctx.timer.loop_calls = ("eager", "loop"), 20
    chunk = ctx.config.prefill_chunk
    for index, total in enumerate(ctx.config.prefill_totals):
        for variant in ("one_shot",) if getattr(ctx.args, "rotation", False) else ("one_shot", "chunked"):
            name = f"prefill_{variant}_{total}"
            skipped = ctx.skip_for_time(name)
            if skipped:
                cases.append(skipped)
                continue
            log(f"prefill: {variant} {total} tokens" + (f" in {chunk}-token chunks" if variant == "chunked" else ""))
            try:
                if variant == "one_shot":
                    steps = [([total], [total], 0)]
                else:
                    steps = [([min(chunk, total - s)], [min(s + chunk, total)], s) for s in range(0, total, chunk)]
                case = run_attention_case(
                    ctx, name, [total], steps, modes, ctx.config.prefill_rep_ms, salt=200 + index, prefill=True
                )
                case.update({"total_tokens": total, "variant": variant, "chunk": chunk if variant == "chunked" else None})
                case["timing_note"] = (
                    "eager; chunked = sum over chunks of each chunk's median time "
                    "(chunk i attends to the cached prefix + itself; per-chunk times in steps[])"
                    if variant == "chunked"
                    else "eager; one call over all tokens"
                )
                add_ratios(ctx, case, modes)
            except Exception as error:
                case = {"case": name, **error_record(error)}
                log(f"  {name}: ERROR {case['error']}")
            cases.append(case)
            ctx.checkpoint()
    return {"status": "ok", "timing_modes": list(modes), "cases": cases}


def section_store(ctx: Context) -> Dict[str, Any]:
    import torch

    geometry = ctx.config.geometry
    hq, hkv, dim = geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim
    modes = ("graph", "eager", "loop")
    cases = ctx.start_section("store")
    for index, tokens in enumerate(ctx.config.store_token_counts):
        name = f"store_{tokens}_tokens"
        skipped = ctx.skip_for_time(name)
        if skipped:
            cases.append(skipped)
            continue
        log(f"store: {tokens} tokens")
        case: Dict[str, Any] = {"case": name, "tokens": tokens, "contenders": {}}
        try:
            generator = ctx.generator(300 + index)
            key_src, value_src, _ = realistic_qkv(tokens, 1, geometry, ctx.device, generator)
            # K and V as vLLM hands them to the cache writer: views into the fused qkv output.
            qkv = torch.zeros(tokens, (hq + 2 * hkv) * dim, dtype=key_src.dtype, device=ctx.device)
            key = qkv[:, hq * dim : (hq + hkv) * dim].view(tokens, hkv, dim)
            value = qkv[:, (hq + hkv) * dim :].view(tokens, hkv, dim)
            key.copy_(key_src)
            value.copy_(value_src)
            for name_c, contender, reason in build_contenders(ctx, include_small=False):
                if contender is None:
                    case["contenders"][name_c] = {"status": "skipped", "reason": reason}
                    continue
                try:
                    # The tokens continue a sequence so they straddle a block boundary.
                    start = max(0, contender.block_size - tokens // 2)
                    layout = make_layout([start + tokens], contender.block_size, ctx.device, ctx.cpu_generator(400 + index))
                    contender.allocate(layout)
                    slots = layout.slots(0, start, start + tokens)

                    def call(contender=contender, slots=slots):
                        contender.store(key, value, slots)

                    bytes_read = 2 * tokens * hkv * dim * key.element_size()
                    bytes_written = tokens * contender.kv_bytes_per_token
                    record: Dict[str, Any] = {"status": "ok", "kv_bytes_per_token": contender.kv_bytes_per_token}
                    for mode in modes:
                        try:
                            stats = ctx.timer.measure(mode, call, ctx.config.rep_ms)
                            entry = {"timing": stats, "time_us": stats.get("median_us")}
                            if stats.get("median_us"):
                                entry["ns_per_token"] = 1e3 * stats["median_us"] / tokens
                            entry.update(bandwidth_fields(ctx, stats.get("median_us"), bytes_read, bytes_written))
                            record[mode] = entry
                        except Exception as error:
                            record[mode] = error_record(error)
                    if isinstance(contender, OursContender) and contender.rotation != "prepost":
                        expected = torch.zeros_like(contender.cache)
                        ctx.ours.layout.store_reference(
                            key, value, expected, slots, contender.block_size, rotation=contender.kernel_rotation
                        )
                        record["bit_exact_vs_store_reference"] = bool(torch.equal(expected, contender.cache))
                    # Round trip: what the cache holds for these tokens vs the bf16 input.
                    stored_key, stored_value = contender.dequantized_kv(layout, 0, start + tokens)
                    record["roundtrip_max_abs_err_k"] = float((stored_key[start:] - key.float()).abs().max())
                    record["roundtrip_max_abs_err_v"] = float((stored_value[start:] - value.float()).abs().max())
                    summary = ", ".join(f"{m} {_fmt(record[m].get('time_us'), '.2f')} us" for m in modes)
                    log(f"  {name} {name_c}: {summary}")
                except Exception as error:
                    record = error_record(error)
                    log(f"  {name} {name_c}: ERROR {record['error']}")
                finally:
                    contender.release()
                case["contenders"][name_c] = record
            if getattr(ctx.args, "rotation", False):
                add_ratios(ctx, case, modes)
        except Exception as error:
            case.update(error_record(error))
            log(f"  {name}: ERROR {case['error']}")
        cases.append(case)
        ctx.checkpoint()
    return {"status": "ok", "timing_modes": list(modes), "cases": cases}


SECTION_FUNCTIONS = {
    "copy": section_copy,
    "decode": section_decode,
    "prefill": section_prefill,
    "store": section_store,
}


# --------------------------------------------------------------------------------------------
# Report table
# --------------------------------------------------------------------------------------------


def _why(record: Dict[str, Any]) -> str:
    return f"{record.get('status')}: {record.get('reason') or record.get('error')}"


def _fmt(value: Optional[float], spec: str) -> str:
    if isinstance(value, (int, float)) and value == value:
        return format(value, spec)
    width = spec.split(".")[0]
    return format("-", f">{width}") if width else "-"


def print_tables(ctx: Context, sections: Dict[str, Any]) -> None:
    ours = f"ours_bs{ctx.config.ours_block_size}"
    lines = []
    if ctx.copy_bw_gbps:
        lines.append(f"Copy bandwidth (bytes read + written / time): {ctx.copy_bw_gbps:.0f} GB/s")
    header = (
        f"{'case':<28} {'contender':<22} {'mode':<6} {'time us':>10} {'GB/s rd':>9} {'%copy':>6} "
        f"{'TFLOP/s':>8} {'ours/this':>9} {'|out-bf16|':>10}"
    )
    for section in ("decode", "prefill"):
        data = sections.get(section)
        if not data or data.get("status") != "ok":
            continue
        lines.append("")
        lines.append(
            f"== {section} ==  (GB/s rd = (KV cache + query bytes) / time; ours/this = time ratio, <1: ours "
            "faster; |out-bf16| = max abs difference of the output from the vLLM bf16 contender's)"
        )
        lines.append(header)
        for case in data["cases"]:
            if case.get("status") in ("error", "skipped"):
                lines.append(f"{case['case']:<28} {case['status']}: {case.get('error') or case.get('reason')}")
                continue
            contenders = case["contenders"]
            for mode in data["timing_modes"]:
                ours_time = contenders.get(ours, {}).get(f"{mode}_time_us_total")
                for name, record in contenders.items():
                    if record.get("status") != "ok":
                        if mode == data["timing_modes"][0]:
                            lines.append(f"{case['case']:<28} {name:<22} {_why(record)}")
                        continue
                    total = record.get(f"{mode}_time_us_total")
                    steps = record["steps"]
                    bytes_read = sum(s.get(mode, {}).get("bytes_read", 0) for s in steps)
                    flops = sum(s["flops"] for s in steps)
                    bw = bytes_read / (total * 1e-6) / 1e9 if total else None
                    frac = 100 * bw / ctx.copy_bw_gbps if (bw and ctx.copy_bw_gbps) else None
                    tflops = flops / (total * 1e-6) / 1e12 if total else None
                    ratio = ours_time / total if (ours_time and total and name != ours) else None
                    label = case["case"] + (f" (sum {len(steps)})" if len(steps) > 1 else "")
                    diffs = [s.get("max_abs_diff_vs_bf16") for s in steps]
                    diff = max(diffs) if diffs and all(d is not None for d in diffs) else None
                    lines.append(
                        f"{label:<28} {name:<22} {mode:<6} {_fmt(total, '10.1f')} {_fmt(bw, '9.0f')} "
                        f"{_fmt(frac, '6.1f')} {_fmt(tflops, '8.1f')} {_fmt(ratio, '9.2f')} {_fmt(diff, '10.2e')}"
                    )
    data = sections.get("store")
    if data and data.get("status") == "ok":
        lines.append("")
        lines.append("== store (quantize-and-store / write) ==  (GB/s r+w = (bf16 K,V read + cache bytes written) / time)")
        lines.append(
            f"{'case':<28} {'contender':<22} {'mode':<6} {'time us':>10} {'ns/token':>9} {'GB/s r+w':>9} "
            f"{'%copy':>6} {'ours/this':>9}"
        )
        for case in data["cases"]:
            if case.get("status") in ("error", "skipped"):
                lines.append(f"{case['case']:<28} {case['status']}: {case.get('error') or case.get('reason')}")
                continue
            contenders = case.get("contenders", {})
            for name, record in contenders.items():
                if record.get("status") != "ok":
                    lines.append(f"{case['case']:<28} {name:<22} {_why(record)}")
                    continue
                for mode in data["timing_modes"]:
                    entry = record.get(mode, {})
                    frac = entry.get("frac_rw_of_copy_bw")
                    ours_time = contenders.get(ours, {}).get(mode, {}).get("time_us")
                    this_time = entry.get("time_us")
                    ratio = ours_time / this_time if (ours_time and this_time and name != ours) else None
                    lines.append(
                        f"{case['case']:<28} {name:<22} {mode:<6} {_fmt(this_time, '10.2f')} "
                        f"{_fmt(entry.get('ns_per_token'), '9.2f')} {_fmt(entry.get('eff_bw_read_write_GBps'), '9.0f')} "
                        f"{_fmt(100 * frac if frac else None, '6.1f')} {_fmt(ratio, '9.2f')}"
                    )
    if getattr(ctx.args, "fa3", False):
        lines += ["", "== vs FA3 bf16 (time / FA3 time: < 1 is faster; err = max |out - fp32 attention on the original K/V|) =="]
        for section in ("decode", "prefill"):
            for case in (sections.get(section) or {}).get("cases", []):
                for mode, ratios in case.get("time_ratios", {}).items():
                    cells = ", ".join(f"{k} {_fmt(v, '.3f')}" for k, v in ratios.items())
                    errors = ", ".join(
                        f"{name} {_fmt(max((s.get('max_abs_err_vs_fp32_original') or 0.0) for s in record['steps']), '.2e')}"
                        for name, record in case.get("contenders", {}).items()
                        if record.get("status") == "ok"
                    )
                    lines.append(f"{case['case']:<28} {mode:<6} {cells}; err {errors}")
    if getattr(ctx.args, "rotation", False):
        lines += ["", "== rotation cost (time / unrotated time; <= 1.03 is the target) =="]
        for section in ("decode", "prefill", "store"):
            for case in (sections.get(section) or {}).get("cases", []):
                for mode, ratios in case.get("time_ratios", {}).items():
                    cells = ", ".join(f"{k} {_fmt(v, '.3f')}" for k, v in ratios.items())
                    lines.append(f"{case['case']:<28} {mode:<6} {cells}")
    print("\n".join(lines), flush=True)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default reports/kernel_bench_h200.json; with --smoke reports/kernel_bench_smoke.json)",
    )
    parser.add_argument("--sections", default=",".join(ALL_SECTIONS), help=f"comma list of {','.join(ALL_SECTIONS)}")
    parser.add_argument("--quick", action="store_true", help="fewer cases and shorter repetitions")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes on the CPU under TRITON_INTERPRET=1: validates every call, times nothing",
    )
    parser.add_argument("--no-bs16", action="store_true", help="skip our block-size-16 reference contender")
    parser.add_argument(
        "--rotation",
        action="store_true",
        help="our kernels only: unrotated vs Hadamard-rotated (fused) vs rotation as torch pre/post matmuls",
    )
    parser.add_argument(
        "--fa3",
        action="store_true",
        help="against FlashAttention-3 bf16: ours (Triton prefill), ours with the gather + FA3 prefill, FA3 (issue #15)",
    )
    parser.add_argument("--geometry", choices=sorted(FA3_GEOMETRIES), default="qwen35", help="--fa3: the layer's shape")
    parser.add_argument("--rep-ms", type=float, default=None, help="override do_bench's repetition time per measurement")
    parser.add_argument("--warmup-ms", type=float, default=None, help="override do_bench's warm-up time per measurement")
    parser.add_argument(
        "--time-budget-s",
        type=float,
        default=240.0,
        help="start no new case after this many seconds (0: no limit); skipped cases are recorded",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = REPO_ROOT / "reports" / ("kernel_bench_smoke.json" if args.smoke else "kernel_bench_h200.json")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    prepare_environment(args.smoke)
    sections_wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections_wanted if s not in SECTION_FUNCTIONS]
    if unknown:
        print(f"unknown sections: {unknown}; choose from {ALL_SECTIONS}", file=sys.stderr)
        return 2
    config = make_config(args)
    payload: Dict[str, Any] = {"meta": environment_metadata(args, "bench/kernel_bench.py")}
    log(f"kernel bench: sections {sections_wanted}, smoke={args.smoke}, quick={args.quick}; JSON -> {args.out}")
    ctx = Context(args, config)
    payload["config"] = {
        **dataclasses.asdict(config),
        "kv_layout_ours": "kernels/int8_kv_layout.py (head-major K/V data, separate fp32 scale regions)",
        "timing": {
            "graph": "triton.testing.do_bench on CUDAGraph.replay of a graph holding the one call; "
            "L2 flushed before every rep; median of reps",
            "eager": "triton.testing.do_bench on the Python call; L2 flushed before every rep (the flush "
            "gives the host a head start, so this is ~GPU time of the call's kernels); median",
            "loop": "200 back-to-back Python calls between two CUDA events, per call; L2 warm; includes "
            "host launch overhead whenever the host is slower than the GPU",
            "chunked prefill": "sum over chunks of each chunk's median eager time",
        },
    }
    payload["kernels"] = {
        "ours": "ok" if ctx.ours else ctx.ours_error,
        "ours_launch_table": ctx.ours.arch_key if ctx.ours else None,
        "vllm": ctx.vllm.provenance if ctx.vllm else ctx.vllm_error,
        "vllm_int8pth": (ctx.vllm.int8pth_unavailable_reason or "available") if ctx.vllm else None,
    }
    if args.smoke:
        payload["meta"]["smoke_shims"] = [
            "CUDA_VISIBLE_DEVICES='' keeps vLLM from replacing Triton by its placeholder on a driverless host",
            "torch.cuda.get_device_capability reports (9, 0) for CPU tensors (vLLM's bf16 cache writer tile heuristic)",
        ]
    payload["sections"] = {}
    ctx.payload = payload
    write_json(args.out, payload)
    with cpu_capability_shim(args.smoke):
        # --fa3: prefill (the line this mode is for) before decode, so a time budget cuts decode first.
        order = ("copy", "prefill", "decode", "store") if args.fa3 else ALL_SECTIONS
        for section in [s for s in order if s in sections_wanted]:
            started = time.time()
            try:
                result = SECTION_FUNCTIONS[section](ctx)
            except Exception as error:
                result = error_record(error)
                # Keep the cases the section finished before it failed.
                result["cases"] = payload["sections"].get(section, {}).get("cases", [])
                log(f"section {section}: ERROR {result['error']}")
            result["seconds"] = round(time.time() - started, 1)
            payload["sections"][section] = result
            write_json(args.out, payload)
            log(f"section {section} done in {result['seconds']} s")
    payload["meta"]["total_seconds"] = round(time.time() - _START, 1)
    write_json(args.out, payload)
    print_tables(ctx, payload["sections"])
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
