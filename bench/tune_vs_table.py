#!/usr/bin/env python3
"""Self-tuned launch configs against the hand-written table, side by side in one run.

1. Tunes the Qwen3.5-27B attention shape (24 q / 4 kv heads, D=256, block size 1552, bf16) the
   way a server's first start does (``govinda_patch.int8.tuner.cached_or_tuned``: a child process,
   a fresh cache folder, ``GOVINDA_TUNE=force``), starting from the neutral ``cuda_default``
   table and the neutral NVIDIA candidate grid (``GOVINDA_KERNEL_ARCH=cuda_default`` for the
   child), and records what that first start paid; then reads the cached choice as a later
   start would.
2. Times three tables on the same caches and inputs, interleaved per case: ``hand`` (the
   architecture's hand table, ``cuda_sm90`` on an H200), ``neutral`` (``cuda_default``,
   untuned) and ``tuned`` (``cuda_default`` with the tuned choice). Decode at batch 1 x
   4K/16K/32K and batch 8 x 8K (CUDA-graph replays, L2 flushed: the kernel benches' timer),
   prefill one-shot 6K and 24K (eager). Ratios tuned/hand and neutral/hand per case.

``--smoke``: tiny shapes on the CPU under ``TRITON_INTERPRET=1`` (tuning included), untimed.

    PYTHONPATH=/tmp/site python3 -m bench.tune_vs_table --out reports/h200/tune_vs_table_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from bench.kernel_core.contenders import OursContender
from bench.kernel_core.inputs import fill_cache, make_layout, make_step, realistic_qkv
from bench.kernel_core.records import environment_metadata, error_record, fmt, log, write_json
from bench.kernel_core.session import REPO_ROOT, BenchOptions, Context, make_config, prepare_environment

NEUTRAL_KEY = "cuda_default"
SMOKE_KEY = "interpreter"  # the CPU smoke run tunes the interpreter's tiny tiles


def tune_like_a_first_start(shape, device, budget_s: float, cache_dir: Path, neutral_key: str) -> Dict[str, Any]:
    """Run the tuner through its cache as a server start does; time the first and a later start."""
    from govinda_patch.int8 import tuner
    from govinda_patch.settings import Settings

    saved = {k: os.environ.get(k) for k in ("GOVINDA_KERNEL_ARCH", "GOVINDA_TUNE", "GOVINDA_TUNE_BUDGET_S", "GOVINDA_CACHE_DIR")}
    os.environ.update(
        GOVINDA_KERNEL_ARCH=neutral_key, GOVINDA_TUNE="force", GOVINDA_TUNE_BUDGET_S=f"{budget_s:g}", GOVINDA_CACHE_DIR=str(cache_dir)
    )
    label = "cpu" if device.type != "cuda" else tuner._device_label(device)
    try:
        started = time.perf_counter()
        first = tuner.cached_or_tuned(Settings.from_env(), shape, device, neutral_key, label)
        first_s = time.perf_counter() - started
        os.environ["GOVINDA_TUNE"] = "auto"
        started = time.perf_counter()
        later = tuner.cached_or_tuned(Settings.from_env(), shape, device, neutral_key, label)
        later_s = time.perf_counter() - started
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {
        "first_start_s": round(first_s, 2),
        "tuning_in_child_s": first.get("elapsed_s"),
        "later_start_s": round(later_s, 4),
        "later_from_cache": later.get("from_cache"),
        "result": first,
    }


def tables(launch_configs, device, head_dim: int, tuning: Dict[str, Any], neutral_key: str) -> Dict[str, Any]:
    hand = launch_configs.get_launch_configs(device)
    neutral = launch_configs.ARCH_TABLES[neutral_key]
    found = {"hand": hand, "neutral": neutral}
    if tuning["result"].get("ok"):
        choice = launch_configs.TunedChoice.from_json(tuning["result"]["choice"])
        found["tuned"] = launch_configs.with_choice(neutral, head_dim, choice)
    return found


def time_case(ctx: Context, name: str, seq_lens: List[int], query_lens: List[int], mode: str, candidates: Dict[str, Any], salt: int) -> Dict[str, Any]:
    import torch

    geometry = ctx.config.geometry
    key, value, query = realistic_qkv(sum(seq_lens), sum(query_lens), geometry, ctx.device, ctx.generator(salt))
    contender = OursContender(ctx.ours, geometry, ctx.config.ours_block_size, ctx.device)
    layout = make_layout(seq_lens, contender.block_size, ctx.device, ctx.cpu_generator(salt + 1))
    contender.allocate(layout)
    offsets = [sum(seq_lens[:i]) for i in range(len(seq_lens))]
    fill_cache(contender, layout, key, value, offsets)
    step = make_step(layout, query_lens, seq_lens)
    record: Dict[str, Any] = {"case": name, "seq_lens": seq_lens, "query_lens": query_lens, "timing": mode, "tables": {}}
    outputs = {}
    rep_ms = ctx.config.rep_ms if mode == "graph" else ctx.config.prefill_rep_ms
    for label, configs in candidates.items():
        entry: Dict[str, Any] = {"table": configs.key}
        try:
            contender.use_configs(configs)
            output = torch.zeros(sum(query_lens), geometry.num_q_heads, geometry.head_dim, dtype=query.dtype, device=ctx.device)

            def call(output=output):
                contender.attention(query, output, step)

            call()
            outputs[label] = output.clone()
            stats = ctx.timer.measure(mode, call, rep_ms)
            entry.update(time_us=stats.get("median_us"), stats=stats)
        except Exception as error:
            entry.update(error_record(error))
        record["tables"][label] = entry
        log(f"  {name} {label} ({configs.key}): {fmt(entry.get('time_us'), '.1f')} us {entry.get('error', '')}")
    contender.release()
    if "hand" in outputs:
        record["max_abs_diff_vs_hand"] = {k: float((v.float() - outputs["hand"].float()).abs().max()) for k, v in outputs.items()}
    hand_time = record["tables"].get("hand", {}).get("time_us")
    record["ratio_vs_hand"] = {
        label: (entry.get("time_us") / hand_time if entry.get("time_us") and hand_time else None)
        for label, entry in record["tables"].items()
    }
    return record


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from govinda_patch.int8 import tuner
    from govinda_patch.kernel_package import import_kernel

    options = BenchOptions(smoke=args.smoke, no_bs16=True, rep_ms=args.rep_ms, seed=args.seed)
    config = make_config(options)
    ctx = Context(options, config)
    if ctx.ours is None:
        raise RuntimeError(f"our kernels failed to load: {ctx.ours_error}")
    geometry = config.geometry
    shape = tuner.TuneShape(
        head_dim=geometry.head_dim,
        num_q_heads=geometry.num_q_heads,
        num_kv_heads=geometry.num_kv_heads,
        block_size=config.ours_block_size,
        dtype="fp16" if geometry.dtype_name == "float16" else "bf16",
    )
    payload: Dict[str, Any] = {"meta": environment_metadata(args.smoke, "bench/tune_vs_table.py"), "shape": dataclasses.asdict(shape)}
    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="govinda-tune-bench-"))
    log(f"tuning {shape.key()} (budget {args.budget_s:g} s, cache {cache_dir})")
    neutral_key = SMOKE_KEY if args.smoke else NEUTRAL_KEY
    tuning = tune_like_a_first_start(shape, ctx.device, args.budget_s, cache_dir, neutral_key)
    payload["tuning"] = tuning
    log(f"first start paid {tuning['first_start_s']} s; later start {tuning['later_start_s']} s "
           f"(from cache: {tuning['later_from_cache']}); {tuning['result'].get('label') or tuning['result'].get('reason')}")
    launch_configs = import_kernel("launch_configs")
    candidates = tables(launch_configs, ctx.device, geometry.head_dim, tuning, neutral_key)
    payload["tables"] = {
        label: {"key": t.key, **launch_configs.choice_from_table(t, geometry.head_dim).to_json()} for label, t in candidates.items()
    }
    decode_cases = [(1, 80), (2, 40)] if args.smoke else [(1, 4096), (1, 16384), (1, 32768), (8, 8192)]
    prefill_totals = [64] if args.smoke else [6144, 24576]
    cases = []
    for index, (batch, context) in enumerate(decode_cases):
        cases.append(time_case(ctx, f"decode_b{batch}_ctx{context}", [context] * batch, [1] * batch, "graph", candidates, 100 + index))
        write_json(args.out, dict(payload, cases=cases))
    for index, total in enumerate(prefill_totals):
        cases.append(time_case(ctx, f"prefill_{total}", [total], [total], "eager", candidates, 200 + index))
        write_json(args.out, dict(payload, cases=cases))
    payload["cases"] = cases
    return payload


def print_table(payload: Dict[str, Any]) -> None:
    tuning = payload["tuning"]
    print(f"\nfirst start: {tuning['first_start_s']} s (tuning child {tuning['tuning_in_child_s']} s); "
          f"later start: {tuning['later_start_s']} s")
    print(f"tuned choice: {tuning['result'].get('label', tuning['result'].get('reason'))}")
    print("\n| case | hand us | neutral us | tuned us | tuned/hand | neutral/hand |")
    print("|---|---|---|---|---|---|")
    for case in payload["cases"]:
        t = case["tables"]
        r = case["ratio_vs_hand"]
        print(f"| {case['case']} | {fmt(t.get('hand', {}).get('time_us'), '.1f')} | "
              f"{fmt(t.get('neutral', {}).get('time_us'), '.1f')} | {fmt(t.get('tuned', {}).get('time_us'), '.1f')} | "
              f"{fmt(r.get('tuned'), '.3f')} | {fmt(r.get('neutral'), '.3f')} |")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=60.0, help="the tuner's time budget (GOVINDA_TUNE_BUDGET_S)")
    p.add_argument("--cache-dir", help="tuning cache folder (default: a fresh temporary one)")
    p.add_argument("--rep-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes, untimed")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "reports" / "tune_vs_table.json")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    prepare_environment(args.smoke)
    payload = run(args)
    write_json(args.out, payload)
    print_table(payload)
    log(f"wrote {args.out}")
    return 0 if payload["tuning"]["result"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
