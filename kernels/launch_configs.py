"""Launch configurations of Govinda's INT8 KV-cache kernels, one data table per architecture.

Keys:

* ``cuda_sm90``    -- Hopper (H100/H200). Tuned for the H200; the entries marked "tune" are
  the first ones to sweep.
* ``cuda_default`` -- any other NVIDIA GPU (Ampere/Ada/Blackwell); conservative: fits the
  ~100 KB of shared memory of consumer parts.
* ``rocm_gfx9``    -- CDNA-class GPUs (Hygon DCU gfx906/gfx926/gfx928/gfx936, MI200 gfx90a,
  MI300 gfx942). Wave64 and 64 KB of LDS: ``num_stages=1`` (Triton's AMD pipeliner
  double-buffers through LDS). Entries are chosen from the compile gate's per-kernel register
  and LDS counts (``reports/amd/aot_resources.json``), see the table. The HIP-only knobs stay at
  "compiler default" (0) because the DCU Triton forks differ in which of them they accept;
  they are passed to the launch only when set.
* ``rocm_default`` -- other AMD GPUs (RDNA, wave32); the smallest safe tiles.
* ``interpreter``  -- ``TRITON_INTERPRET=1`` on CPU: tiny tiles so that small test shapes
  still cover several tiles, splits and chunks.

``GOVINDA_KERNEL_ARCH=<key>`` overrides the detection (experiments, or a DCU that reports an
unexpected ``gcnArchName``).

The tables are read-only (``ARCH_TABLES`` and each table's per-head_dim maps): a variant --
the self-tuner's pick, a sweep's candidate -- is a new table (``dataclasses.replace``,
:func:`with_choice`) passed to the launch functions as ``configs``. Each entry's comment says
why it is what it is and where its measurement lives; the numbers stay in the reports.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Optional, Tuple

import torch

ARCH_ENV_VAR = "GOVINDA_KERNEL_ARCH"


@dataclass(frozen=True)
class KernelConfig:
    """One kernel's tile shape and compiler knobs.

    ``block_m``: query rows per program (prefill) / split chunk of the reduce kernel / tokens per
    program (store).
    ``block_n``: KV tokens per tile (prefill, decode) / head-dim slice of the reduce kernel.
    """

    block_m: int = 16
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 1
    # Decode only: head_dim is processed in slices of d_slice (0: whole; at most four slices,
    # see kernels/int8_decode_attention.py), which sets the registers a program holds.
    d_slice: int = 0
    # NVIDIA only: a register cap per thread (ptxas .maxnreg; 0: the compiler's choice), so that
    # one more program fits on an SM.
    max_registers: int = 0
    # Decode on NVIDIA only: KV tiles requested into the L2 ahead of the one being used (PTX
    # prefetch.global.L2; 0: none). Not a compiler option: the launch passes it as L2_PREFETCH.
    l2_prefetch: int = 0
    # HIP-only compiler knobs; 0 means "leave the compiler's default" and is not passed.
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 0

    @property
    def label(self) -> str:
        text = f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_stages}"
        for name, short in (
            ("d_slice", "ds"), ("max_registers", "r"), ("l2_prefetch", "pf"), ("waves_per_eu", "we"), ("matrix_instr_nonkdim", "mi"), ("kpack", "kp"),
        ):
            if getattr(self, name):
                text += f"{short}{getattr(self, name)}"
        return text

    def launch_kwargs(self) -> dict:
        kwargs = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        for name, option in (
            ("max_registers", "maxnreg"), ("waves_per_eu", "waves_per_eu"),
            ("matrix_instr_nonkdim", "matrix_instr_nonkdim"), ("kpack", "kpack"),
        ):
            value = getattr(self, name)
            if value:
                kwargs[option] = value
        return kwargs


@dataclass(frozen=True)
class DecodeSplitPolicy:
    """How many KV splits a decode gets: as many programs as the GPU holds at once, within bounds.

    ``num_splits = clamp(floor(programs_per_sm * sm_count / (num_decodes * num_kv_heads)),
    1, max_splits)``. Rounded down, not up: one program more than the GPU holds makes a second
    wave that costs a whole split's time (H200, Qwen3.5 32 x 4K: 5 splits took 160 us, 4 would
    fit one wave; reports/h200/decode-bandwidth.md). Inside the kernel each split covers at least
    ``min_tiles_per_split`` KV tiles, so short sequences use fewer splits (less partial-result
    traffic).
    """

    programs_per_sm: int = 4
    max_splits: int = 256
    min_tiles_per_split: int = 1
    # Used instead of programs_per_sm when a step holds more than one decode (None: the same).
    batched_programs_per_sm: Optional[int] = None


@dataclass(frozen=True)
class ArchLaunchConfigs:
    key: str
    prefill: Mapping[int, KernelConfig]  # by head_dim
    decode: Mapping[int, KernelConfig]  # by head_dim (block_m unused: the group is padded to 16)
    reduce: KernelConfig
    store: KernelConfig
    decode_splits: DecodeSplitPolicy = field(default_factory=DecodeSplitPolicy)
    # Multiprocessor count to assume when the device cannot be asked (the CPU interpreter).
    default_sm_count: int = 8
    # Which kernel runs prefills (govinda_patch/int8/prefill_kernel.py, GOVINDA_PREFILL_KERNEL=auto):
    # "triton" (ours) or "fa3" (gather-dequantize to bf16 + vLLM's FlashAttention-3).
    prefill_kernel: str = "triton"
    # The gather-dequantize kernel (kernels/int8_kv_gather.py): block_n KV tokens per program.
    gather: KernelConfig = field(default_factory=lambda: KernelConfig(block_n=32, num_warps=4))

    def __post_init__(self) -> None:
        # Read-only views (a copy: the caller's dict stays the caller's).
        object.__setattr__(self, "prefill", MappingProxyType(dict(self.prefill)))
        object.__setattr__(self, "decode", MappingProxyType(dict(self.decode)))

    def prefill_config(self, head_dim: int) -> KernelConfig:
        return _by_head_dim(self.prefill, head_dim)

    def decode_config(self, head_dim: int) -> KernelConfig:
        return _by_head_dim(self.decode, head_dim)


def _by_head_dim(table: Mapping[int, KernelConfig], head_dim: int) -> KernelConfig:
    """The entry for ``head_dim``, else the one for the next larger listed head_dim, else the largest."""
    if head_dim in table:
        return table[head_dim]
    larger = [d for d in table if d >= head_dim]
    return table[min(larger)] if larger else table[max(table)]


ARCH_TABLES: Mapping[str, ArchLaunchConfigs] = MappingProxyType({
    "cuda_sm90": ArchLaunchConfigs(
        key="cuda_sm90",
        # Prefill (when GOVINDA_PREFILL_KERNEL picks ours): wgmma wants block_m >= 64 per
        # warpgroup, and a 128-row tile needs 8 warps (with 4 it spills). D=256 is the winner of
        # an H200 sweep of block_m x block_n x warps x stages on one 12K prompt (sweep data not
        # committed; reports/h200/kernel_bench_h200.json times this entry). D <= 128: untuned.
        prefill={
            64: KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=3),
            128: KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
            256: KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),
        },
        # Decode: registers set how many programs an SM keeps in flight, and with them the KV
        # bytes requested at a time (reports/h200/ncu_decode_32k.txt: the whole-head kernel
        # held 216 registers, two programs per SM). 128-wide head_dim slices under a 128-register
        # cap keep four 4-warp programs on an SM; the winner of the H200 sweep of tile x slice x
        # register cap x split count at both geometries (reports/h200/decode_sweep_*.json,
        # "recommended"). The self-tuner picks per model shape among tuning_candidates.
        decode={
            64: KernelConfig(block_n=128, num_warps=4, num_stages=1),
            128: KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=128, max_registers=128),
            256: KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=128, max_registers=128),
        },
        # block_m >= max_splits: the reduce reads all splits in one pass.
        reduce=KernelConfig(block_m=256, block_n=32, num_warps=4),
        store=KernelConfig(block_m=1, num_warps=2),
        # Four programs per SM at every batch size (the sweep's best for the batch-1 contexts
        # and 8 x 8K); a short context uses only the splits that hold tiles, and the reduce
        # kernel reads only those.
        decode_splits=DecodeSplitPolicy(
            programs_per_sm=4, max_splits=256, min_tiles_per_split=1, batched_programs_per_sm=4
        ),
        default_sm_count=132,
        # FA3 bf16 (after gather-dequantize) prefills faster than our Triton kernel on the H200:
        # reports/h200/fa3-line.md, raw runs in reports/h200/kernel_bench_fa3_h200.json.
        prefill_kernel="fa3",
    ),
    "cuda_default": ArchLaunchConfigs(
        key="cuda_default",
        # Untuned and conservative: 2 stages of 64x64 tiles fit the ~100 KB of shared memory of
        # consumer parts; the self-tuner (GOVINDA_TUNE) refines them per model shape.
        prefill={
            64: KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
            128: KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
            256: KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),
        },
        decode={
            64: KernelConfig(block_n=64, num_warps=4, num_stages=2),
            128: KernelConfig(block_n=64, num_warps=4, num_stages=2, d_slice=64),
            256: KernelConfig(block_n=32, num_warps=4, num_stages=2, d_slice=64),
        },
        reduce=KernelConfig(block_m=128, block_n=32, num_warps=4),
        store=KernelConfig(block_m=1, num_warps=2),
        decode_splits=DecodeSplitPolicy(programs_per_sm=4, max_splits=256, min_tiles_per_split=1),
        default_sm_count=80,
    ),
    "rocm_gfx9": ArchLaunchConfigs(
        key="rocm_gfx9",
        # From the compile gate's register/LDS data for gfx90a/gfx942
        # (reports/amd/aot_resources.json, `python -m govinda_patch amd-aot`): every entry is
        # scratch-free and runs >= 2 waves per SIMD. With 4 warps a D=256 prefill tile of 64 rows
        # needs more than 256 unified VGPRs (1 wave); 8 warps cap a wave at 256, so the 128-row
        # tiles below trade KV-tile width for occupancy. 128x16 at D=256 needs exactly the
        # 64 KiB of LDS (one 8-wave workgroup per CU).
        prefill={
            64: KernelConfig(block_m=128, block_n=32, num_warps=8, num_stages=1),
            # 128x32 would spill at D=128 with bf16 on gfx942.
            128: KernelConfig(block_m=64, block_n=32, num_warps=8, num_stages=1),
            256: KernelConfig(block_m=128, block_n=16, num_warps=8, num_stages=1),
        },
        # Decode is bandwidth-bound and VGPR-limited: 64-wide head_dim slices keep a D=256
        # program at 148 VGPRs (3 waves per SIMD; the whole-head kernel with its prefetched
        # second tile needed 188, 2 waves) and D=128 at 124 (4 waves), scratch-free
        # (reports/amd/aot_resources.md). The self-tuner also tries the stream-pipelined loop
        # (num_stages=2, K/V tiles double-buffered in LDS) and wider tiles.
        decode={
            64: KernelConfig(block_n=64, num_warps=4, num_stages=1),
            128: KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=64),
            256: KernelConfig(block_n=32, num_warps=4, num_stages=1, d_slice=64),
        },
        reduce=KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=1),
        store=KernelConfig(block_m=1, num_warps=1, num_stages=1),
        decode_splits=DecodeSplitPolicy(programs_per_sm=4, max_splits=256, min_tiles_per_split=1),
        default_sm_count=64,
    ),
    "rocm_default": ArchLaunchConfigs(
        key="rocm_default",
        # RDNA (wave32) is not compiled by the gate: the smallest tiles that are safe anywhere.
        prefill={
            64: KernelConfig(block_m=32, block_n=32, num_warps=4, num_stages=1),
            128: KernelConfig(block_m=32, block_n=32, num_warps=4, num_stages=1),
            256: KernelConfig(block_m=32, block_n=16, num_warps=4, num_stages=1),
        },
        decode={
            64: KernelConfig(block_n=32, num_warps=4, num_stages=1),
            128: KernelConfig(block_n=32, num_warps=4, num_stages=1, d_slice=64),
            256: KernelConfig(block_n=16, num_warps=4, num_stages=1, d_slice=64),
        },
        reduce=KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=1),
        store=KernelConfig(block_m=1, num_warps=1, num_stages=1),
        decode_splits=DecodeSplitPolicy(programs_per_sm=4, max_splits=128, min_tiles_per_split=1),
        default_sm_count=32,
    ),
    "interpreter": ArchLaunchConfigs(
        key="interpreter",
        prefill={d: KernelConfig(block_m=16, block_n=16, num_warps=4, num_stages=1) for d in (64, 128, 256)},
        # 32 does not divide the test block sizes 48/80: tiles straddle pages there. 32-wide
        # head_dim slices: every test head size runs the sliced form of the GPU tables (2-4 slices).
        decode={d: KernelConfig(block_n=32, num_warps=4, num_stages=1, d_slice=32) for d in (64, 128, 256)},
        # A small split chunk so that the reduce kernel's chunk loop runs more than once in tests.
        reduce=KernelConfig(block_m=4, block_n=32, num_warps=4, num_stages=1),
        # 16 tokens per program: the interpreter's cost is per program, and the tests' token
        # counts leave a partial last one.
        store=KernelConfig(block_m=16, num_warps=1, num_stages=1),
        decode_splits=DecodeSplitPolicy(programs_per_sm=2, max_splits=16, min_tiles_per_split=1),
        default_sm_count=8,
        # Smaller than the test block sizes: gather tiles straddle pages.
        gather=KernelConfig(block_n=16, num_warps=4, num_stages=1),
    ),
})


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def detect_arch_key(device: Optional[torch.device] = None) -> str:
    """The table key for ``device`` (default: the current CUDA/HIP device), ignoring the override."""
    if interpreting() or not torch.cuda.is_available():
        return "interpreter"
    if device is not None and torch.device(device).type != "cuda":
        return "interpreter"
    if device is None or torch.device(device).index is None:
        index = torch.cuda.current_device()
    else:
        index = torch.device(device).index
    return _detect_cuda_arch_key(index)


@functools.lru_cache(maxsize=None)
def _detect_cuda_arch_key(device_index: int) -> str:
    props = torch.cuda.get_device_properties(device_index)
    if torch.version.hip is not None:
        arch = getattr(props, "gcnArchName", "") or ""
        # gfx9xx: GCN/CDNA wave64 parts (DCU gfx906/926/928/936, MI200, MI300). gfx10+ is RDNA.
        if arch.startswith("gfx9"):
            return "rocm_gfx9"
        return "rocm_default"
    if props.major == 9:
        return "cuda_sm90"
    return "cuda_default"


def arch_key(device: Optional[torch.device] = None) -> str:
    """The table key in force: ``GOVINDA_KERNEL_ARCH`` if set, else the detected one."""
    override = os.environ.get(ARCH_ENV_VAR, "").strip()
    if override:
        if override not in ARCH_TABLES:
            raise ValueError(f"{ARCH_ENV_VAR}={override!r} is not one of {sorted(ARCH_TABLES)}")
        return override
    return detect_arch_key(device)


def get_launch_configs(device: Optional[torch.device] = None) -> ArchLaunchConfigs:
    return ARCH_TABLES[arch_key(device)]


@functools.lru_cache(maxsize=None)
def _device_sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device, configs: ArchLaunchConfigs) -> int:
    """Multiprocessors (SMs / CUs) of ``device``; the table's default when it cannot be asked."""
    device = torch.device(device)
    if interpreting() or device.type != "cuda":
        return configs.default_sm_count
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _device_sm_count(index)


def decode_num_splits(
    num_decodes: int, num_kv_heads: int, num_sms: int, policy: DecodeSplitPolicy
) -> int:
    """Splits per (decode, kv head): a function of the batch shape only, so the grid is fixed
    for a given ``num_decodes`` (CUDA-graph capturable)."""
    per_sm = policy.programs_per_sm
    if num_decodes > 1 and policy.batched_programs_per_sm is not None:
        per_sm = policy.batched_programs_per_sm
    programs_wanted = per_sm * num_sms
    per_split = max(num_decodes * num_kv_heads, 1)
    splits = programs_wanted // per_split  # see DecodeSplitPolicy: never a partial second wave
    return max(1, min(splits, policy.max_splits))


# --------------------------------------------------------------------------------------------
# Self-tuning (govinda_patch/int8/tuner.py): what may be tried, and how a choice becomes a table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TunedChoice:
    """The self-tuner's pick for one model shape: the decode and prefill entries of its head_dim
    and the split policy. Applied with :func:`with_choice`; the tables themselves never change."""

    decode: KernelConfig
    prefill: KernelConfig
    decode_splits: DecodeSplitPolicy

    def to_json(self) -> dict:
        return {"decode": asdict(self.decode), "prefill": asdict(self.prefill), "decode_splits": asdict(self.decode_splits)}

    @classmethod
    def from_json(cls, data: Mapping) -> "TunedChoice":
        return cls(
            decode=KernelConfig(**data["decode"]),
            prefill=KernelConfig(**data["prefill"]),
            decode_splits=DecodeSplitPolicy(**data["decode_splits"]),
        )

    @property
    def label(self) -> str:
        splits = self.decode_splits
        return (
            f"decode {self.decode.label} pps {splits.programs_per_sm}/{splits.batched_programs_per_sm}, "
            f"prefill {self.prefill.label}"
        )


def with_choice(table: ArchLaunchConfigs, head_dim: int, choice: TunedChoice) -> ArchLaunchConfigs:
    """A new table: ``table`` with ``choice`` in force for ``head_dim``."""
    return replace(
        table,
        key=f"{table.key}+tuned",
        prefill={**dict(table.prefill), head_dim: choice.prefill},
        decode={**dict(table.decode), head_dim: choice.decode},
        decode_splits=choice.decode_splits,
    )


def choice_from_table(table: ArchLaunchConfigs, head_dim: int) -> TunedChoice:
    """The table's own entries for ``head_dim``, as a choice (the fallback)."""
    return TunedChoice(table.decode_config(head_dim), table.prefill_config(head_dim), table.decode_splits)


@dataclass(frozen=True)
class TuningCandidates:
    """What the self-tuner times for one head_dim. Every candidate keeps today's grid rules
    (the grid depends on the batch shape only), so any pick is CUDA-graph safe."""

    decode: Tuple[KernelConfig, ...]
    programs_per_sm: Tuple[int, ...]  # decode splits at batch 1
    batched_programs_per_sm: Tuple[int, ...]  # decode splits at batch > 1
    prefill: Tuple[KernelConfig, ...]
    max_splits: int = 256


def _cuda_candidates(head_dim: int) -> TuningCandidates:
    # Neutral: one grid for every NVIDIA GPU, not derived from a measured table. Prefill:
    # 64/128-row tiles, 2-3 stages.
    if head_dim >= 256:
        prefill = (
            KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),
            KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
            KernelConfig(block_m=128, block_n=32, num_warps=8, num_stages=2),
            KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=2),
            KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
        )
    else:
        prefill = (
            KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=2),
            KernelConfig(block_m=128, block_n=64, num_warps=4, num_stages=3),
            KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
            KernelConfig(block_m=128, block_n=128, num_warps=8, num_stages=2),
        )
    # Decode: the KV tile, the head_dim slice (64 wide or whole), a register cap that lets a
    # fourth 4-warp program fit on an SM, and the cp.async-pipelined loop.
    decode = (
        KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=128, max_registers=128),
        KernelConfig(block_n=128, num_warps=4, num_stages=1, d_slice=64, max_registers=128),
        KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=64),
        KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=128),
        KernelConfig(block_n=64, num_warps=4, num_stages=1),
        KernelConfig(block_n=32, num_warps=4, num_stages=3, d_slice=64),
    )
    if head_dim <= 128:
        # One KV tile prefetched into the L2 ahead: 3-5 % faster at 16K and up at D=128 on an
        # H100, slower at D=256 (reports/h200/decode-bandwidth.md, 2026-12-06 L2 prefetch).
        decode += (KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=128, max_registers=128, l2_prefetch=1),)
    return TuningCandidates(decode, programs_per_sm=(2, 4, 8), batched_programs_per_sm=(2, 4, 8), prefill=prefill)


def _rocm_gfx9_candidates(head_dim: int) -> TuningCandidates:
    # All compiled for gfx90a/gfx942 by the compile gate, scratch-free there
    # (reports/amd/aot_resources.json). Besides the table's picks: the former 1-wave entries
    # and their neighbours, so a DCU whose memory system prefers bigger tiles can choose them.
    if head_dim >= 256:
        prefill = (
            KernelConfig(block_m=128, block_n=16, num_warps=8, num_stages=1),
            KernelConfig(block_m=32, block_n=16, num_warps=4, num_stages=1),
            KernelConfig(block_m=64, block_n=16, num_warps=4, num_stages=1),
            KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=1),
        )
        decode = (
            KernelConfig(block_n=32, num_warps=4, num_stages=1, d_slice=64),
            KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=64),
            KernelConfig(block_n=32, num_warps=4, num_stages=2, d_slice=64),
            KernelConfig(block_n=16, num_warps=4, num_stages=1, d_slice=64),
            KernelConfig(block_n=128, num_warps=8, num_stages=1, d_slice=64),
            KernelConfig(block_n=32, num_warps=4, num_stages=1),
        )
    else:
        prefill = (
            KernelConfig(block_m=128, block_n=32, num_warps=8, num_stages=1),
            KernelConfig(block_m=64, block_n=32, num_warps=8, num_stages=1),
            KernelConfig(block_m=128, block_n=16, num_warps=8, num_stages=1),
            KernelConfig(block_m=64, block_n=32, num_warps=4, num_stages=1),
            KernelConfig(block_m=64, block_n=64, num_warps=4, num_stages=1),
        )
        if head_dim > 64:  # 128x32 spills at D=128 (bf16, gfx942)
            prefill = prefill[1:]
        decode = (
            KernelConfig(block_n=64, num_warps=4, num_stages=1, d_slice=64),
            KernelConfig(block_n=32, num_warps=4, num_stages=1, d_slice=64),
            KernelConfig(block_n=32, num_warps=4, num_stages=2, d_slice=64),
            KernelConfig(block_n=128, num_warps=4, num_stages=1, d_slice=64),
            KernelConfig(block_n=64, num_warps=4, num_stages=1),
            KernelConfig(block_n=16, num_warps=4, num_stages=1, d_slice=64),
        )
    return TuningCandidates(decode, programs_per_sm=(2, 4, 8), batched_programs_per_sm=(2, 4, 8), prefill=prefill)


def _interpreter_candidates(head_dim: int) -> TuningCandidates:
    # Tiny tiles for CPU tests of the tuner itself.
    return TuningCandidates(
        decode=(KernelConfig(block_n=16, num_warps=4), KernelConfig(block_n=32, num_warps=4)),
        programs_per_sm=(1, 2),
        batched_programs_per_sm=(1, 2),
        prefill=(KernelConfig(block_m=16, block_n=16, num_warps=4), KernelConfig(block_m=32, block_n=16, num_warps=4)),
        max_splits=16,
    )


_CANDIDATES = {
    "cuda_sm90": _cuda_candidates,
    "cuda_default": _cuda_candidates,
    "rocm_gfx9": _rocm_gfx9_candidates,
    "rocm_default": _rocm_gfx9_candidates,
    "interpreter": _interpreter_candidates,
}


def tuning_candidates(key: str, head_dim: int) -> TuningCandidates:
    """The candidate set the self-tuner times for table ``key`` and ``head_dim``."""
    return _CANDIDATES[key](head_dim)
