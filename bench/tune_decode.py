#!/usr/bin/env python3
"""Sweep the INT8 decode kernel's launch configuration on this GPU and print the best per case.

The decode entry of a launch table (``kernels/launch_configs.py``) has knobs that only
measurements can settle: the KV tile (``block_n``), ``num_warps``, the head_dim slice
(``d_slice``, 0 = whole head), a register cap (``max_registers``, NVIDIA), an L2 prefetch depth
(``l2_prefetch``, NVIDIA), the pipelined loop (``num_stages``) and how many programs per SM the split policy aims for. This script times
every combination on one attention layer (``--geometry``: ``qwen35``, Qwen3.5-27B's 24 q / 4 kv
heads, D=256, block size 1552 as vLLM picks it for the hybrid model; ``dense128``, a Llama-8B
layer, 32 q / 8 kv heads, D=128, block 16) through CUDA-graph replays with the L2 flushed, as
``bench.kernel_bench`` times decode, and
records for each configuration: time, read bandwidth and its fraction of the measured copy
bandwidth, the largest output difference to the table's current configuration, and the
compiled kernel's registers and spills. Copy the winners into the architecture's table.

``--profile-config BLOCK_N,WARPS,D_SLICE,PROGRAMS_PER_SM`` skips the sweep and runs that
configuration a few times per case, untimed, for a profiler::

    ncu --kernel-name regex:decode_ --section SpeedOfLight --section Occupancy \\
        python3 -m bench.tune_decode --profile-config 64,4,64,4 --cases 1x32768

``--smoke`` runs tiny shapes under ``TRITON_INTERPRET=1`` on the CPU (checks every
configuration's output, times nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.kernel_core.contenders import OursContender
from bench.kernel_core.inputs import FA3_GEOMETRIES, fill_cache, make_layout, make_step, realistic_qkv
from bench.kernel_core.records import bandwidth_fields, environment_metadata, error_record, fmt, log, write_json
from bench.kernel_core.session import REPO_ROOT, BenchOptions, Context, make_config, prepare_environment, section_copy

@dataclasses.dataclass(frozen=True)
class DecodeVariant:
    block_n: int
    num_warps: int
    d_slice: int
    programs_per_sm: int
    num_stages: int = 1
    max_registers: int = 0
    # The split policy's floor of KV tiles per split: short contexts then use fewer splits
    # (the split count per context-length class, with the grid unchanged).
    min_tiles: int = 1
    # NVIDIA: KV tiles requested into the L2 ahead of the one in use (KernelConfig.l2_prefetch).
    l2_prefetch: int = 0

    @property
    def label(self) -> str:
        text = f"n{self.block_n}-w{self.num_warps}-s{self.num_stages}-ds{self.d_slice}-pps{self.programs_per_sm}"
        text += f"-r{self.max_registers}" if self.max_registers else ""
        text += f"-mt{self.min_tiles}" if self.min_tiles != 1 else ""
        return text + (f"-pf{self.l2_prefetch}" if self.l2_prefetch else "")


def parse_cases(text: str) -> List[Tuple[int, int]]:
    cases = []
    for item in text.split(","):
        batch, context = item.lower().split("x")
        cases.append((int(batch), int(context)))
    return cases


def parse_ints(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def variant_table(launch_configs, device, head_dim: int, variant: Optional[DecodeVariant]):
    """The current architecture's table with ``variant`` as its decode entry and split policy
    (a new table: the module's tables are never modified). None: the table itself."""
    table = launch_configs.get_launch_configs(device)
    if variant is None:
        return table
    decode_entry = launch_configs.KernelConfig(
        block_n=variant.block_n,
        num_warps=variant.num_warps,
        num_stages=variant.num_stages,
        d_slice=variant.d_slice,
        max_registers=variant.max_registers,
        l2_prefetch=variant.l2_prefetch,
    )
    return dataclasses.replace(
        table,
        decode={**table.decode, head_dim: decode_entry},
        decode_splits=dataclasses.replace(
            table.decode_splits, programs_per_sm=variant.programs_per_sm, batched_programs_per_sm=None,
            min_tiles_per_split=variant.min_tiles,
        ),
    )


def compiled_kernel_stats(jit_function) -> Dict[str, Dict[str, Any]]:
    """Registers, spills and shared memory of every compiled variant of a Triton kernel.

    Reads Triton internals (``device_caches``): informational only, so any surprise in their
    shape gives an empty result rather than a failed sweep."""
    stats: Dict[str, Dict[str, Any]] = {}
    try:
        for device_cache in getattr(jit_function, "device_caches", {}).values():
            kernels = device_cache[0] if isinstance(device_cache, tuple) else {}
            for key, kernel in kernels.items():
                metadata = getattr(kernel, "metadata", None)
                stats[str(key)] = {
                    "n_regs": getattr(kernel, "n_regs", None),
                    "n_spills": getattr(kernel, "n_spills", None),
                    "num_warps": getattr(metadata, "num_warps", None),
                    "shared_bytes": getattr(metadata, "shared", None),
                }
    except Exception:
        return {}
    return stats


def bench_context(
    smoke: bool, seed: int, block_size: Optional[int], rep_ms: Optional[float], geometry: str = "qwen35"
) -> Context:
    """The kernel benches' context (quick config) with the layer and cache block size of ``geometry``."""
    options = BenchOptions(smoke=smoke, quick=True, no_bs16=True, rep_ms=rep_ms, seed=seed)
    config = make_config(options)
    if not smoke:
        layer, ours_block_size, _ = FA3_GEOMETRIES[geometry]
        config = dataclasses.replace(config, geometry=layer, ours_block_size=ours_block_size)
    config = dataclasses.replace(config, ours_block_size=block_size or config.ours_block_size)
    ctx = Context(options, config, with_vllm=False)  # the sweep times our kernels only
    if ctx.ours is None:
        raise RuntimeError(f"our kernels failed to load: {ctx.ours_error}")
    return ctx


class DecodeCase:
    """One decode batch on a filled INT8 cache, callable under any launch variant."""

    def __init__(self, ctx: Context, batch: int, context: int, salt: int):
        import torch

        self.ctx, self.batch, self.context = ctx, batch, context
        geometry = ctx.config.geometry
        self.geometry = geometry
        seq_lens = [context] * batch
        key, value, query = realistic_qkv(sum(seq_lens), batch, geometry, ctx.device, ctx.generator(salt))
        self.contender = OursContender(ctx.ours, geometry, ctx.config.ours_block_size, ctx.device)
        layout = make_layout(seq_lens, self.contender.block_size, ctx.device, ctx.cpu_generator(salt + 1))
        self.contender.allocate(layout)
        offsets = [i * context for i in range(batch)]
        fill_cache(self.contender, layout, key, value, offsets)
        self.step = make_step(layout, [1] * batch, seq_lens)
        self.query = query
        self.output = torch.zeros_like(query)
        query_bytes = query.numel() * query.element_size()
        self.bytes_read = query_bytes + sum(seq_lens) * self.contender.kv_bytes_per_token

    def prepare(self, configs) -> None:
        """Run with ``configs`` (and a workspace sized for their split policy)."""
        self.contender.use_configs(configs)

    def __call__(self) -> None:
        self.contender.attention(self.query, self.output, self.step)

    @property
    def name(self) -> str:
        return f"decode_b{self.batch}_ctx{self.context}"


def run_variant(
    case: DecodeCase, variant: Optional[DecodeVariant], launch_configs, attention, split_kernel, reference
) -> Dict[str, Any]:
    """Run and time ``case`` with ``variant`` (None: the table); ``split_kernel`` is the decode
    kernel whose compiled variants are read for registers and spills."""
    import torch

    ctx = case.ctx
    record: Dict[str, Any] = {"variant": dataclasses.asdict(variant) if variant else "table", "status": "ok"}
    before = set(compiled_kernel_stats(split_kernel))
    try:
        configs = variant_table(launch_configs, ctx.device, case.geometry.head_dim, variant)
        case.prepare(configs)
        record["num_splits"] = attention.decode_splits_for(case.batch, case.geometry.num_kv_heads, ctx.device, configs)
        case.output.zero_()
        case()
        if reference is not None:
            record["max_abs_diff_vs_table"] = float((case.output.float() - reference.float()).abs().max())
        record["output_finite"] = bool(torch.isfinite(case.output.float()).all())
        stats = ctx.timer.graph(case, ctx.config.rep_ms)
        record["timing"] = stats
        record["time_us"] = stats.get("median_us")
        record.update(bandwidth_fields(ctx.copy_bw_gbps, stats.get("median_us"), case.bytes_read))
    except Exception as error:  # an invalid combination (e.g. out of shared memory) is a result too
        record.update(error_record(error))
    new = {k: v for k, v in compiled_kernel_stats(split_kernel).items() if k not in before}
    if new:
        record["compiled"] = list(new.values())
    return record


def sweep(args: argparse.Namespace) -> Dict[str, Any]:
    from govinda_patch.kernel_package import import_kernel

    ctx = bench_context(args.smoke, args.seed, args.block_size, args.rep_ms, args.geometry)
    config = ctx.config
    launch_configs = import_kernel("launch_configs")
    attention = import_kernel("int8_paged_attention")
    split_kernel = import_kernel("int8_decode_attention").decode_split_kernel
    payload: Dict[str, Any] = {
        "meta": environment_metadata(args.smoke, "bench/tune_decode.py"),
        "table_key": launch_configs.arch_key(ctx.device),
        "table_decode_entry": dataclasses.asdict(
            launch_configs.get_launch_configs(ctx.device).decode_config(config.geometry.head_dim)
        ),
        "table_split_policy": dataclasses.asdict(launch_configs.get_launch_configs(ctx.device).decode_splits),
        "geometry": dataclasses.asdict(config.geometry),
        "block_size": config.ours_block_size,
        "cases": [],
    }
    if not args.smoke:
        payload["copy"] = section_copy(ctx)
    cases = parse_cases(args.cases) if not args.smoke else [(1, 300), (3, 200)]
    variants = [
        DecodeVariant(n, w, ds, pps, st, regs, mt, pf)
        for n, w, ds, pps, st, regs, mt, pf in itertools.product(
            parse_ints(args.block_n), parse_ints(args.warps), parse_ints(args.d_slice),
            parse_ints(args.programs_per_sm), parse_ints(args.stages), parse_ints(args.max_registers),
            parse_ints(args.min_tiles), parse_ints(args.l2_prefetch),
        )
    ]
    deadline = time.time() + args.time_budget_s if args.time_budget_s > 0 else None
    for index, (batch, context) in enumerate(cases):
        case = DecodeCase(ctx, batch, context, salt=500 + index)
        log(f"{case.name}: {len(variants)} variants, {case.bytes_read / 1e6:.1f} MB read per call")
        table_record = run_variant(case, None, launch_configs, attention, split_kernel, None)
        reference = case.output.clone()
        case_record = {"case": case.name, "batch": batch, "context": context, "bytes_read": case.bytes_read,
                       "table": table_record, "variants": []}
        payload["cases"].append(case_record)
        log(f"  table config: {fmt(table_record.get('time_us'), '.1f')} us")
        for variant in variants:
            if deadline is not None and time.time() > deadline:
                case_record["variants"].append({"variant": dataclasses.asdict(variant), "status": "skipped",
                                                "reason": "time budget"})
                continue
            record = run_variant(case, variant, launch_configs, attention, split_kernel, reference)
            case_record["variants"].append(record)
            log(f"  {variant.label}: {fmt(record.get('time_us'), '.1f')} us "
                f"frac {fmt(record.get('frac_of_copy_bw'), '.3f')} "
                f"diff {fmt(record.get('max_abs_diff_vs_table'), '.2e')} "
                   f"regs {[c.get('n_regs') for c in record.get('compiled', [])]} "
                   f"{record.get('error', '')}")
            if args.smoke and record["status"] == "ok" and record.get("max_abs_diff_vs_table", 0) > 1e-2:
                raise AssertionError(f"{variant.label} differs from the table's output: {record}")
        timed = [r for r in case_record["variants"] if r.get("time_us")]
        if timed:
            best = min(timed, key=lambda r: r["time_us"])
            case_record["best"] = best["variant"]
            case_record["best_time_us"] = best["time_us"]
            case_record["best_frac_of_copy_bw"] = best.get("frac_of_copy_bw")
        case.contender.release()
        write_json(args.out, payload)
    return payload


def profile(args: argparse.Namespace) -> None:
    """Run one configuration a few times per case, untimed, for an external profiler."""
    import torch

    from govinda_patch.kernel_package import import_kernel

    block_n, warps, d_slice, pps = parse_ints(args.profile_config)
    variant = DecodeVariant(block_n, warps, d_slice, pps)
    ctx = bench_context(False, args.seed, args.block_size, args.rep_ms, args.geometry)
    config = ctx.config
    launch_configs = import_kernel("launch_configs")
    for index, (batch, context) in enumerate(parse_cases(args.cases)):
        case = DecodeCase(ctx, batch, context, salt=500 + index)
        case.prepare(variant_table(launch_configs, ctx.device, config.geometry.head_dim, variant))
        for _ in range(3):
            case()
        torch.cuda.synchronize()
        log(f"profiled {case.name} with {variant.label}")
        case.contender.release()


def recommend(payload: Dict[str, Any], max_loss: float = 0.03) -> Optional[Dict[str, Any]]:
    """The variant with the best geometric-mean speed-up over the table's config across all
    cases, among those no case of which is more than ``max_loss`` slower than the table."""
    import math

    scores: Dict[str, List[float]] = {}
    variants: Dict[str, Dict[str, Any]] = {}
    for case in payload["cases"]:
        table_time = case["table"].get("time_us")
        if not table_time:
            return None
        for record in case["variants"]:
            if record.get("time_us"):
                label = DecodeVariant(**record["variant"]).label
                variants[label] = record["variant"]
                scores.setdefault(label, []).append(record["time_us"] / table_time)
    complete = {k: v for k, v in scores.items() if len(v) == len(payload["cases"]) and max(v) <= 1.0 + max_loss}
    if not complete:
        return None
    best = min(complete, key=lambda k: math.fsum(math.log(r) for r in complete[k]))
    return {"variant": variants[best], "label": best, "time_ratio_vs_table": complete[best],
            "geomean_ratio": math.exp(math.fsum(math.log(r) for r in complete[best]) / len(complete[best]))}


def print_summary(payload: Dict[str, Any]) -> None:
    for case in payload["cases"]:
        rows = sorted((r for r in case["variants"] if r.get("time_us")), key=lambda r: r["time_us"])
        table_time = case["table"].get("time_us")
        print(f"\n{case['case']} ({case['bytes_read'] / 1e6:.1f} MB): table config {fmt(table_time, '.1f')} us")
        for r in rows[:8]:
            variant = DecodeVariant(**r["variant"])
            regs = [c.get("n_regs") for c in r.get("compiled", [])]
            print(f"  {variant.label:28s} {r['time_us']:8.1f} us  frac {fmt(r.get('frac_of_copy_bw'), '.3f')}"
                  f"  splits {r.get('num_splits')}  regs {regs}")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="1x16384,1x32768,8x8192,1x4096", help="BATCHxCONTEXT list")
    p.add_argument("--geometry", choices=sorted(FA3_GEOMETRIES), default="qwen35", help="the attention layer")
    p.add_argument("--block-n", default="32,64,128")
    p.add_argument("--warps", default="4")
    p.add_argument("--d-slice", default="64,0", help="head_dim slice widths (0: the whole head)")
    p.add_argument("--max-registers", default="0", help="register caps per thread (0: none; NVIDIA only)")
    p.add_argument("--programs-per-sm", default="2,4,8")
    p.add_argument("--stages", default="1")
    p.add_argument("--min-tiles", default="1", help="the split policy's minimum KV tiles per split")
    p.add_argument("--l2-prefetch", default="0", help="KV tiles prefetched into the L2 ahead (NVIDIA only; 0: none)")
    p.add_argument("--block-size", type=int, default=None, help="cache block size (default: the geometry's)")
    p.add_argument("--rep-ms", type=float, default=None)
    p.add_argument("--time-budget-s", type=float, default=150.0, help="skip variants after this (0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, untimed")
    p.add_argument("--profile-config", metavar="BLOCK_N,WARPS,D_SLICE,PPS", help="run one config for a profiler")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "reports" / "tune_decode.json")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    prepare_environment(args.smoke)
    if args.profile_config:
        profile(args)
        return 0
    payload = sweep(args)
    payload["recommended"] = recommend(payload)
    write_json(args.out, payload)
    print_summary(payload)
    print(f"\nRECOMMENDED: {json.dumps(payload['recommended'])}")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
