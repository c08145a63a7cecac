"""One kernel-bench run: its options (:class:`BenchOptions`, the function API the CLIs and the
sweeps share), the shapes they imply (:class:`BenchConfig`), and the :class:`Context` that holds
the device, the timer, the loaded kernels and the JSON checkpointing."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .inputs import FA3_GEOMETRIES, QWEN35_27B, SMOKE_GEOMETRY, Geometry
from .loaders import load_our_kernels, load_vllm
from .records import START, log, write_json
from .timing import Timer

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What a run is asked for (kernel_bench's command line, or a sweep's explicit choice)."""

    smoke: bool = False  # tiny shapes on the CPU under TRITON_INTERPRET=1, untimed
    quick: bool = False  # fewer cases and shorter repetitions
    no_bs16: bool = False  # skip our block-size-16 reference contender
    rotation: bool = False  # ours only: unrotated vs rotated (fused) vs rotated by torch matmuls
    fa3: bool = False  # against FlashAttention-3 bf16
    geometry: str = "qwen35"  # --fa3 / --rotation: the layer's shape (FA3_GEOMETRIES)
    rep_ms: Optional[float] = None  # do_bench's repetition time per measurement
    warmup_ms: Optional[float] = None
    time_budget_s: float = 0.0  # start no new case after this (0: no limit)
    seed: int = 0
    out: Optional[Path] = None  # JSON checkpoints go here (None: none)


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


@dataclasses.dataclass
class BenchConfig:
    """The shapes, cases and repetition times a run's options imply (:func:`make_config`)."""

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


# The full run on the Qwen3.5-27B layer; --quick and --smoke are variations of it.
FULL_CONFIG = BenchConfig(
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


# --fa3 and --rotation decode: batch 1 at three contexts and two batched steps (issue #24's line).
DECODE_LINE_CASES = [(1, 4096), (1, 16384), (1, 32768), (8, 8192), (32, 4096)]


def make_config(options: BenchOptions) -> BenchConfig:
    """A new config for ``options`` (the presets are never modified)."""
    if options.smoke:
        # Kept small: every Triton program runs in Python under the interpreter.
        return dataclasses.replace(
            FULL_CONFIG,
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
    config = dataclasses.replace(FULL_CONFIG)
    if options.quick:
        config.ours_small_block_size = None
        config.decode_cases = [(1, 8192), (1, 32768), (8, 8192)]
        config.prefill_totals = [6144]
        config.store_token_counts = [1, 2048]
        config.copy_bytes = 1 << 30
        config.warmup_ms, config.rep_ms, config.prefill_rep_ms = 5.0, 20.0, 20.0
    if options.fa3:
        config.ours_small_block_size = None
        if not options.smoke:
            config.geometry, config.ours_block_size, config.bf16_block_size = FA3_GEOMETRIES[options.geometry]
            config.decode_cases = DECODE_LINE_CASES
            config.prefill_totals = [6144, 12288, 24576]
    if options.rotation and not options.smoke:
        config.ours_small_block_size = None
        config.geometry, config.ours_block_size, config.bf16_block_size = FA3_GEOMETRIES[options.geometry]
        config.decode_cases = DECODE_LINE_CASES
        config.prefill_totals = [6144, 24576]
        config.store_token_counts = [1, 2048]
    if options.no_bs16:
        config.ours_small_block_size = None
    if options.rep_ms is not None:
        config.rep_ms = config.prefill_rep_ms = options.rep_ms
    if options.warmup_ms is not None:
        config.warmup_ms = options.warmup_ms
    return config


class Context:
    """A run's device, timer, loaded kernels (ours, vLLM's, FA3) and JSON checkpoints."""

    def __init__(self, options: BenchOptions, config: BenchConfig, with_vllm: bool = True):
        """``with_vllm=False``: no vLLM contenders (a run of our kernels only skips their import)."""
        import torch

        self.options = options
        self.config = config
        self.smoke = options.smoke
        self.device = torch.device("cpu") if options.smoke else torch.device("cuda")
        self.timer = Timer(options.smoke, config.warmup_ms)
        self.copy_bw_gbps: Optional[float] = None
        self.stream_bw_gbps: Optional[float] = None  # section "stream" (bench.stream_read)
        self.seed = options.seed
        budget = options.time_budget_s or 0
        self.deadline = START + budget if budget > 0 else None
        # Set by a CLI that checkpoints: the payload is rewritten to options.out after every case.
        self.payload: Optional[Dict[str, Any]] = None
        try:
            self.ours = load_our_kernels()
            self.ours_error = None
        except Exception as error:  # recorded; the vLLM contenders still run
            self.ours, self.ours_error = None, f"{type(error).__name__}: {error}"
        if not with_vllm:
            self.vllm, self.vllm_error = None, "not asked for (a run of our kernels only)"
        else:
            try:
                self.vllm = load_vllm()
                self.vllm_error = None
            except Exception as error:
                self.vllm, self.vllm_error = None, f"{type(error).__name__}: {error}"
        self.fa3, self.fa3_varlen = (None, "not asked for (--fa3)"), None
        if options.fa3 and not options.smoke:
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
        if self.payload is not None and self.options.out is not None:
            write_json(self.options.out, self.payload)

    def skip_for_time(self, case_name: str) -> Optional[Dict[str, Any]]:
        """A 'skipped' record once the --time-budget-s deadline has passed, else None."""
        if self.deadline is None or time.time() < self.deadline:
            return None
        log(f"  {case_name}: skipped, time budget exhausted")
        return {"case": case_name, "status": "skipped", "reason": "time budget (--time-budget-s) exhausted"}

    def cpu_generator(self, salt: int):
        import torch

        return torch.Generator().manual_seed(self.seed * 1000003 + salt)


def section_copy(ctx: Context) -> Dict[str, Any]:
    """Device-to-device copy bandwidth: the yardstick of every "fraction of copy bandwidth"."""
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


def section_stream(ctx: Context) -> Dict[str, Any]:
    """Streaming-read bandwidth (bench.stream_read): the yardstick of every "% of streaming read"."""
    if ctx.smoke:
        return {"status": "skipped", "reason": "smoke run: nothing timed"}
    from bench import stream_read

    result = stream_read.measure(ctx.timer, ctx.device, rep_ms=max(ctx.config.rep_ms, 20.0))
    ctx.stream_bw_gbps = result["stream_read_GBps"]
    log(f"streaming-read bandwidth: {ctx.stream_bw_gbps:.0f} GB/s")
    return result
