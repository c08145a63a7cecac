#!/usr/bin/env python3
"""Attention accuracy of Govinda's INT8 KV cache against vLLM's bf16 and upstream INT8 caches.

Every contender attends over the same realistic K/V (standard normal plus a few large,
slowly rotating channel pairs per head, like post-RoPE keys; see
``bench.kernel_core.inputs.realistic_qkv``), written through its own store path. Each output
is compared with float32 attention on the ORIGINAL bf16 K/V (the quantity a user cares about), and, for the
quantized caches, also with float32 attention on the K/V the cache actually holds
(dequantized) -- that separates the quantization error from the kernel's own arithmetic error.

Cases (Qwen3.5-27B attention: 24 q heads / 4 KV heads, head_dim 256, bf16):

* ``decode``: one call, four decode sequences at contexts 4K, 8K, 16K, 32K.
* ``prefill_chunk``: one mixed call as vLLM schedules it: a decode at 8K first, then 2K-token
  prefill chunks over 30K and 2K cached prefixes.

``--rotation`` compares our kernels instead (``GOVINDA_KV_ROTATION``): unrotated, rotated as
shipped and rotated by bf16 torch matmuls around the unrotated kernels (the kernel benches'
contenders, ``bench.kernel_core.contenders``).

Run from the repository root (H200)::

    PYTHONPATH=/tmp/site python3 -m bench.kernel_accuracy --out reports/kernel_accuracy_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.kernel_core.contenders import build_contenders, cpu_capability_shim
from bench.kernel_core.inputs import QWEN35_27B, SMOKE_GEOMETRY, Geometry, fill_cache, make_layout, make_step, realistic_qkv
from bench.kernel_core.records import environment_metadata, error_record, fmt, log, why, write_json
from bench.kernel_core.session import REPO_ROOT, BenchOptions, Context, make_config as make_bench_config, prepare_environment

ALL_SECTIONS = ("decode", "prefill_chunk")


@dataclasses.dataclass
class AccuracyConfig:
    geometry: Geometry
    ours_block_size: int
    bf16_block_size: int
    int8pth_block_size: int
    decode_contexts: List[int]
    # (query_len, seq_len) per sequence; decodes (query_len 1) first, as vLLM orders them.
    prefill_batch: List[Tuple[int, int]]


def make_config(smoke: bool) -> AccuracyConfig:
    if smoke:
        return AccuracyConfig(
            geometry=SMOKE_GEOMETRY,
            ours_block_size=48,
            bf16_block_size=32,
            int8pth_block_size=48,
            decode_contexts=[20, 70],
            prefill_batch=[(1, 40), (16, 64), (16, 24)],
        )
    return AccuracyConfig(
        geometry=QWEN35_27B,
        ours_block_size=1552,
        bf16_block_size=800,
        int8pth_block_size=1552,
        decode_contexts=[4096, 8192, 16384, 32768],
        prefill_batch=[(1, 8192), (2048, 32768), (2048, 4096)],
    )


def attention_fp32(query, key, value, scale: float, group: int, query_positions):
    """Causal float32 attention of ``query [Tq, Hq, D]`` over ``key/value [L, Hkv, D]``."""
    import torch

    tokens, num_q_heads, dim = query.shape
    length, num_kv_heads, _ = key.shape
    keys = key.float().permute(1, 2, 0)  # [Hkv, D, L]
    values = value.float().permute(1, 0, 2)  # [Hkv, L, D]
    output = torch.empty(tokens, num_q_heads, dim, dtype=torch.float32, device=query.device)
    # Bound the score tile to ~256 MiB.
    rows = max(1, (1 << 26) // max(1, num_q_heads * length))
    key_positions = torch.arange(length, device=query.device)
    for start in range(0, tokens, rows):
        stop = min(tokens, start + rows)
        n = stop - start
        q = query[start:stop].float().reshape(n, num_kv_heads, group, dim).permute(1, 0, 2, 3)
        q = q.reshape(num_kv_heads, n * group, dim)
        scores = torch.bmm(q, keys) * scale  # [Hkv, n*group, L]
        limit = query_positions[start:stop].repeat_interleave(group)
        scores.masked_fill_(key_positions[None, None, :] > limit[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.bmm(probs, values)  # [Hkv, n*group, D]
        output[start:stop] = out.reshape(num_kv_heads, n, group, dim).permute(1, 0, 2, 3).reshape(n, num_q_heads, dim)
    return output


def error_stats(output, reference) -> Dict[str, float]:
    diff = (output.float() - reference).abs()
    return {
        "max_abs_err": float(diff.max()),
        "mean_abs_err": float(diff.mean()),
        "rel_l2_err": float(diff.norm() / reference.norm().clamp_min(1e-30)),
    }


def run_case(
    ctx: Context, config: AccuracyConfig, name: str, batch: Sequence[Tuple[int, int]], salt: int
) -> Dict[str, Any]:
    import torch

    geometry = config.geometry
    query_lens = [q for q, _ in batch]
    seq_lens = [s for _, s in batch]
    generator = ctx.generator(salt)
    key, value, query = realistic_qkv(sum(seq_lens), sum(query_lens), geometry, ctx.device, generator)
    seq_offsets, query_offsets = [0], [0]
    for q, s in batch:
        seq_offsets.append(seq_offsets[-1] + s)
        query_offsets.append(query_offsets[-1] + q)

    # References on the original (bf16) K/V, per sequence.
    references = []
    for index, (q, s) in enumerate(batch):
        positions = torch.arange(s - q, s, device=ctx.device)
        references.append(
            attention_fp32(
                query[query_offsets[index] : query_offsets[index + 1]],
                key[seq_offsets[index] : seq_offsets[index + 1]],
                value[seq_offsets[index] : seq_offsets[index + 1]],
                geometry.softmax_scale,
                geometry.group_size,
                positions,
            )
        )
    case: Dict[str, Any] = {
        "case": name,
        "batch": [{"query_len": q, "seq_len": s} for q, s in batch],
        "reference": "float32 attention on the original K/V",
        "reference_mean_abs": [float(r.abs().mean()) for r in references],
        "reference_max_abs": [float(r.abs().max()) for r in references],
        "contenders": {},
    }
    for contender_name, contender, reason in build_contenders(ctx, include_small=False):
        if contender is None:
            case["contenders"][contender_name] = {"status": "skipped", "reason": reason}
            log(f"  {name} {contender_name}: skipped ({reason})")
            continue
        record: Dict[str, Any] = {"status": "ok", "block_size": contender.block_size}
        try:
            layout = make_layout(seq_lens, contender.block_size, ctx.device, ctx.cpu_generator(salt + 1))
            contender.allocate(layout)
            fill_cache(contender, layout, key, value, seq_offsets[:-1])
            step = make_step(layout, query_lens, seq_lens)
            prepared = contender.prepare_step(step)
            output = torch.zeros_like(query)
            contender.attention(query, output, prepared)
            per_sequence = []
            for index, (q, s) in enumerate(batch):
                rows = output[query_offsets[index] : query_offsets[index + 1]]
                entry: Dict[str, Any] = {"query_len": q, "seq_len": s}
                entry["vs_original_kv"] = error_stats(rows, references[index])
                stored_key, stored_value = contender.dequantized_kv(layout, index, s)
                original = key[seq_offsets[index] : seq_offsets[index + 1]].float()
                original_v = value[seq_offsets[index] : seq_offsets[index + 1]].float()
                if not (torch.equal(stored_key, original) and torch.equal(stored_value, original_v)):
                    positions = torch.arange(s - q, s, device=ctx.device)
                    stored_reference = attention_fp32(
                        query[query_offsets[index] : query_offsets[index + 1]],
                        stored_key,
                        stored_value,
                        geometry.softmax_scale,
                        geometry.group_size,
                        positions,
                    )
                    entry["vs_dequantized_cache"] = error_stats(rows, stored_reference)
                    entry["quantization_only"] = error_stats(stored_reference, references[index])
                    entry["kv_roundtrip_max_abs_err"] = {
                        "k": float((stored_key - original).abs().max()),
                        "v": float((stored_value - original_v).abs().max()),
                    }
                entry["output_finite"] = bool(torch.isfinite(rows.float()).all())
                per_sequence.append(entry)
            record["sequences"] = per_sequence
            worst = max(e["vs_original_kv"]["max_abs_err"] for e in per_sequence)
            mean = sum(e["vs_original_kv"]["mean_abs_err"] for e in per_sequence) / len(per_sequence)
            record["max_abs_err"] = worst
            record["mean_abs_err"] = mean
            log(f"  {name} {contender_name}: max abs err {worst:.3e}, mean abs err {mean:.3e}")
        except Exception as error:
            record = error_record(error)
            log(f"  {name} {contender_name}: ERROR {record['error']}")
        finally:
            contender.release()
        case["contenders"][contender_name] = record
    return case


def print_table(sections: Dict[str, Any]) -> None:
    lines = [
        "",
        "errors vs float32 attention on the original K/V  (kernel-only = vs float32 on the dequantized cache)",
        f"{'case':<14} {'seq (q/L)':<13} {'contender':<22} {'max abs':>10} {'mean abs':>10} {'rel l2':>9} "
        f"{'kernel-only max':>16}",
    ]
    for section in ALL_SECTIONS:
        data = sections.get(section)
        if not data or data.get("status") != "ok":
            continue
        case = data["case"]
        for name, record in case["contenders"].items():
            if record.get("status") != "ok":
                lines.append(f"{section:<14} {'':<13} {name:<22} {why(record)}")
                continue
            for entry in record["sequences"]:
                errors = entry["vs_original_kv"]
                kernel_only = entry.get("vs_dequantized_cache", {}).get("max_abs_err")
                lines.append(
                    f"{section:<14} {str(entry['query_len']) + '/' + str(entry['seq_len']):<13} {name:<22} "
                    f"{errors['max_abs_err']:10.3e} {errors['mean_abs_err']:10.3e} {errors['rel_l2_err']:9.2e} "
                    f"{fmt(kernel_only, '16.3e')}"
                )
    print("\n".join(lines), flush=True)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default reports/kernel_accuracy_h200.json; with --smoke reports/kernel_accuracy_smoke.json)",
    )
    parser.add_argument("--sections", default=",".join(ALL_SECTIONS), help=f"comma list of {','.join(ALL_SECTIONS)}")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rotation",
        action="store_true",
        help="our kernels only: unrotated, Hadamard-rotated as shipped, and rotated by bf16 torch matmuls around the unrotated kernels",
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = REPO_ROOT / "reports" / ("kernel_accuracy_smoke.json" if args.smoke else "kernel_accuracy_h200.json")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    prepare_environment(args.smoke)
    import torch

    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in ALL_SECTIONS]
    if unknown:
        print(f"unknown sections: {unknown}; choose from {ALL_SECTIONS}", file=sys.stderr)
        return 2
    # The reference must be true float32 (no TF32 tensor cores).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    config = make_config(args.smoke)
    options = BenchOptions(smoke=args.smoke, no_bs16=True, rotation=args.rotation, seed=args.seed, out=args.out)
    # The kernel benches' context with this study's geometry and block sizes (timing unused).
    bench_config = dataclasses.replace(
        make_bench_config(options),
        geometry=config.geometry,
        ours_block_size=config.ours_block_size,
        bf16_block_size=config.bf16_block_size,
        int8pth_block_size=config.int8pth_block_size,
    )
    ctx = Context(options, bench_config)
    payload: Dict[str, Any] = {"meta": environment_metadata(args.smoke, "bench/kernel_accuracy.py")}
    payload["config"] = dataclasses.asdict(config)
    payload["kernels"] = {
        "ours": "ok" if ctx.ours else ctx.ours_error,
        "ours_launch_table": ctx.ours.arch_key if ctx.ours else None,
        "vllm": ctx.vllm.provenance if ctx.vllm else ctx.vllm_error,
        "vllm_int8pth": (ctx.vllm.int8pth_unavailable_reason or "available") if ctx.vllm else None,
    }
    payload["sections"] = {}
    log(f"kernel accuracy: sections {wanted}, smoke={args.smoke}; JSON -> {args.out}")
    write_json(args.out, payload)
    cases = {
        "decode": [(1, context) for context in config.decode_contexts],
        "prefill_chunk": config.prefill_batch,
    }
    with cpu_capability_shim(args.smoke):
        for section in [s for s in ALL_SECTIONS if s in wanted]:
            started = time.time()
            log(f"{section}: batch {cases[section]} (query_len, seq_len)")
            try:
                salt = 500 + 10 * ALL_SECTIONS.index(section)
                result = {"status": "ok", "case": run_case(ctx, config, section, cases[section], salt)}
            except Exception as error:
                result = error_record(error)
                log(f"section {section}: ERROR {result['error']}")
            result["seconds"] = round(time.time() - started, 1)
            payload["sections"][section] = result
            write_json(args.out, payload)
    print_table(payload["sections"])
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
