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

The shared pieces (inputs, contenders, timing, records, the run context) are ``bench.kernel_core``;
:func:`run` is the function API (a :class:`~bench.kernel_core.session.BenchOptions` in, the
payload out). Run from the repository root (H200)::

    PYTHONPATH=/tmp/site python3 -m bench.kernel_bench --out reports/kernel_bench_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.kernel_core.contenders import (
    OursContender,
    VllmTritonContender,
    build_contenders,
    cpu_capability_shim,
)
from bench.kernel_core.inputs import (
    FA3_GEOMETRIES,
    Geometry,
    Step,
    attended_keys,
    fill_cache,
    make_layout,
    make_step,
    realistic_qkv,
)
from bench.kernel_core.records import (
    START,
    bandwidth_fields,
    environment_metadata,
    error_record,
    fmt,
    log,
    why,
)
from bench.kernel_core.session import (
    REPO_ROOT,
    BenchOptions,
    Context,
    make_config,
    prepare_environment,
    section_copy,
    section_stream,
)

# Run order: copy and streaming read first (the others' bandwidth fractions refer to them), the
# long prefill last.
ALL_SECTIONS = ("copy", "stream", "decode", "store", "prefill")


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


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
    fa3_mode = ctx.options.fa3
    references: Dict[int, Any] = {}  # step -> (sampled rows, fp32 attention on the original K/V)
    for name, contender, reason in build_contenders(ctx, include_small, prefill):
        if contender is None:
            case["contenders"][name] = {"status": "skipped", "reason": reason}
            log(f"  {case_name} {name}: skipped ({reason})")
            continue
        if baseline is None and (name.startswith(("vllm_bf16", "fa3_bf16")) or ctx.options.rotation):
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
                        entry.update(bandwidth_fields(ctx.copy_bw_gbps, stats.get("median_us"), bytes_read, bytes_written))
                        if stats.get("median_us"):
                            entry["tflops"] = flops / (stats["median_us"] * 1e-6) / 1e12
                            if ctx.stream_bw_gbps:
                                entry["frac_of_stream_read_bw"] = entry["eff_bw_read_GBps"] / ctx.stream_bw_gbps
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
                f"{mode} {fmt(record.get(f'{mode}_time_us_total'), '.1f')} us" for mode in timing_modes
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
    block, bf16_block = ctx.config.ours_block_size, ctx.config.bf16_block_size
    if ctx.options.fa3:
        baseline, label = f"fa3_bf16_bs{bf16_block}", "fa3"
        names = {"ours": f"ours_bs{block}", "ours_fa3": f"ours_fa3_bs{block}", "vllm_bf16": f"vllm_bf16_bs{bf16_block}"}
    elif ctx.options.rotation:
        baseline, label = ours, "unrotated"
        names = {prefix: f"{prefix}_bs{block}" for prefix in ("ours_rot", "ours_rotpp")}
    else:
        baseline = None
    if baseline is not None:
        case["time_ratios"] = {
            mode: {f"{short}_over_{label}": _ratio(case["contenders"], name, baseline, mode) for short, name in names.items()}
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
    this, base = _ratio_time(contenders, name, mode), _ratio_time(contenders, baseline, mode)
    return this / base if (this and base) else None


def add_stream_floor(ctx: Context, case: Dict[str, Any], kv_tokens: int) -> None:
    """Time a plain streaming read (bench.stream_read) of this case's INT8 cache bytes with the
    same timer: no kernel that reads them once can be faster, so ``stream_floor_over_<baseline>``
    is the smallest time ratio the INT8 decode could reach in this timing (launch, L2 state and
    all), and ``ours_over_stream_floor`` how far ours is from it. Needs the ``stream`` section."""
    if ctx.smoke or not ctx.stream_bw_gbps:
        return
    from bench import stream_read

    geometry = ctx.config.geometry
    nbytes = kv_tokens * ctx.ours.layout.bytes_per_token(geometry.num_kv_heads, geometry.head_dim)
    try:
        result = stream_read.measure(ctx.timer, ctx.device, nbytes, rep_ms=ctx.config.rep_ms)
    except Exception as error:
        case["stream_floor"] = error_record(error)
        return
    floor_us = nbytes / result["stream_read_GBps"] / 1e3
    case["stream_floor"] = {"bytes": nbytes, "time_us": floor_us, "read_GBps": result["stream_read_GBps"]}
    for mode, ratios in case.get("time_ratios", {}).items():
        if mode != "graph":
            continue
        for key, value in list(ratios.items()):
            if key.startswith("ours_over_") and value:
                baseline = key[len("ours_over_"):]
                ours_time = _ratio_time(case["contenders"], f"ours_bs{ctx.config.ours_block_size}", mode)
                if ours_time:
                    ratios[f"stream_floor_over_{baseline}"] = value * floor_us / ours_time
                    ratios["ours_over_stream_floor"] = ours_time / floor_us
    log(f"  {case['case']}: streaming read of the same {nbytes / 1e6:.1f} MB: {floor_us:.1f} us")


def _ratio_time(contenders: Dict[str, Any], name: str, mode: str) -> Optional[float]:
    record = contenders.get(name, {})
    return record.get(f"{mode}_time_us_total") or record.get(mode, {}).get("time_us")


def section_decode(ctx: Context) -> Dict[str, Any]:
    cases = ctx.start_section("decode")
    # --fa3: CUDA-graph replays only (how vLLM runs decode); the other modes add nothing to the line.
    # (A smoke run times nothing and runs no graphs: eager at least calls every contender.)
    modes = ("graph", "eager", "loop")
    if ctx.options.fa3:
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
            add_stream_floor(ctx, case, sum(seq_lens))
        except Exception as error:
            case = {"case": name, **error_record(error)}
            log(f"  {name}: ERROR {case['error']}")
        cases.append(case)
        ctx.checkpoint()
    return {"status": "ok", "timing_modes": list(modes), "cases": cases}


def section_prefill(ctx: Context) -> Dict[str, Any]:
    cases = ctx.start_section("prefill")
    modes: Tuple[str, ...] = ("eager",)
    if ctx.options.fa3 and not ctx.smoke:
        # Back-to-back calls too: their host_launch_us_per_call shows where a short chunk is
        # bound by the host (Python + launches) rather than by the GPU.
        modes, ctx.timer.loop_calls = ("eager", "loop"), 20
    chunk = ctx.config.prefill_chunk
    for index, total in enumerate(ctx.config.prefill_totals):
        for variant in ("one_shot",) if ctx.options.rotation else ("one_shot", "chunked"):
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
                            entry.update(bandwidth_fields(ctx.copy_bw_gbps, stats.get("median_us"), bytes_read, bytes_written))
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
                    summary = ", ".join(f"{m} {fmt(record[m].get('time_us'), '.2f')} us" for m in modes)
                    log(f"  {name} {name_c}: {summary}")
                except Exception as error:
                    record = error_record(error)
                    log(f"  {name} {name_c}: ERROR {record['error']}")
                finally:
                    contender.release()
                case["contenders"][name_c] = record
            if ctx.options.rotation:
                add_ratios(ctx, case, modes)
        except Exception as error:
            case.update(error_record(error))
            log(f"  {name}: ERROR {case['error']}")
        cases.append(case)
        ctx.checkpoint()
    return {"status": "ok", "timing_modes": list(modes), "cases": cases}


SECTION_FUNCTIONS = {
    "copy": section_copy,
    "stream": section_stream,
    "decode": section_decode,
    "prefill": section_prefill,
    "store": section_store,
}


# --------------------------------------------------------------------------------------------
# Report table
# --------------------------------------------------------------------------------------------


def print_tables(ctx: Context, sections: Dict[str, Any]) -> None:
    ours = f"ours_bs{ctx.config.ours_block_size}"
    lines = []
    if ctx.copy_bw_gbps:
        lines.append(f"Copy bandwidth (bytes read + written / time): {ctx.copy_bw_gbps:.0f} GB/s")
    if ctx.stream_bw_gbps:
        lines.append(f"Streaming-read bandwidth (bench.stream_read): {ctx.stream_bw_gbps:.0f} GB/s")
    header = (
        f"{'case':<28} {'contender':<22} {'mode':<6} {'time us':>10} {'GB/s rd':>9} {'%copy':>6} {'%strm':>6} "
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
                            lines.append(f"{case['case']:<28} {name:<22} {why(record)}")
                        continue
                    total = record.get(f"{mode}_time_us_total")
                    steps = record["steps"]
                    bytes_read = sum(s.get(mode, {}).get("bytes_read", 0) for s in steps)
                    flops = sum(s["flops"] for s in steps)
                    bw = bytes_read / (total * 1e-6) / 1e9 if total else None
                    frac = 100 * bw / ctx.copy_bw_gbps if (bw and ctx.copy_bw_gbps) else None
                    stream_frac = 100 * bw / ctx.stream_bw_gbps if (bw and ctx.stream_bw_gbps) else None
                    tflops = flops / (total * 1e-6) / 1e12 if total else None
                    ratio = ours_time / total if (ours_time and total and name != ours) else None
                    label = case["case"] + (f" (sum {len(steps)})" if len(steps) > 1 else "")
                    diffs = [s.get("max_abs_diff_vs_bf16") for s in steps]
                    diff = max(diffs) if diffs and all(d is not None for d in diffs) else None
                    lines.append(
                        f"{label:<28} {name:<22} {mode:<6} {fmt(total, '10.1f')} {fmt(bw, '9.0f')} "
                        f"{fmt(frac, '6.1f')} {fmt(stream_frac, '6.1f')} {fmt(tflops, '8.1f')} {fmt(ratio, '9.2f')} "
                        f"{fmt(diff, '10.2e')}"
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
                    lines.append(f"{case['case']:<28} {name:<22} {why(record)}")
                    continue
                for mode in data["timing_modes"]:
                    entry = record.get(mode, {})
                    frac = entry.get("frac_rw_of_copy_bw")
                    ours_time = contenders.get(ours, {}).get(mode, {}).get("time_us")
                    this_time = entry.get("time_us")
                    ratio = ours_time / this_time if (ours_time and this_time and name != ours) else None
                    lines.append(
                        f"{case['case']:<28} {name:<22} {mode:<6} {fmt(this_time, '10.2f')} "
                        f"{fmt(entry.get('ns_per_token'), '9.2f')} {fmt(entry.get('eff_bw_read_write_GBps'), '9.0f')} "
                        f"{fmt(100 * frac if frac else None, '6.1f')} {fmt(ratio, '9.2f')}"
                    )
    if ctx.options.fa3:
        lines += ["", "== vs FA3 bf16 (time / FA3 time: < 1 is faster; err = max |out - fp32 attention on the original K/V|) =="]
        for section in ("decode", "prefill"):
            for case in (sections.get(section) or {}).get("cases", []):
                for mode, ratios in case.get("time_ratios", {}).items():
                    cells = ", ".join(f"{k} {fmt(v, '.3f')}" for k, v in ratios.items())
                    errors = ", ".join(
                        f"{name} {fmt(max((s.get('max_abs_err_vs_fp32_original') or 0.0) for s in record['steps']), '.2e')}"
                        for name, record in case.get("contenders", {}).items()
                        if record.get("status") == "ok"
                    )
                    lines.append(f"{case['case']:<28} {mode:<6} {cells}; err {errors}")
    if ctx.options.rotation:
        lines += ["", "== rotation cost (time / unrotated time; <= 1.05 is the target) =="]
        for section in ("decode", "prefill", "store"):
            for case in (sections.get(section) or {}).get("cases", []):
                for mode, ratios in case.get("time_ratios", {}).items():
                    cells = ", ".join(f"{k} {fmt(v, '.3f')}" for k, v in ratios.items())
                    lines.append(f"{case['case']:<28} {mode:<6} {cells}")
    print("\n".join(lines), flush=True)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def run(options: BenchOptions, sections: Sequence[str] = ALL_SECTIONS) -> Dict[str, Any]:
    """Run ``sections`` with ``options`` (``prepare_environment`` first), checkpointing the payload
    to ``options.out`` after every case; print the tables and return the payload."""
    unknown = [s for s in sections if s not in SECTION_FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown sections: {unknown}; choose from {ALL_SECTIONS}")
    config = make_config(options)
    payload: Dict[str, Any] = {"meta": environment_metadata(options.smoke, "bench/kernel_bench.py")}
    log(f"kernel bench: sections {list(sections)}, smoke={options.smoke}, quick={options.quick}; JSON -> {options.out}")
    ctx = Context(options, config)
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
    if options.smoke:
        payload["meta"]["smoke_shims"] = [
            "CUDA_VISIBLE_DEVICES='' keeps vLLM from replacing Triton by its placeholder on a driverless host",
            "torch.cuda.get_device_capability reports (9, 0) for CPU tensors (vLLM's bf16 cache writer tile heuristic)",
        ]
    payload["sections"] = {}
    ctx.payload = payload
    ctx.checkpoint()
    with cpu_capability_shim(options.smoke):
        # --fa3: prefill (the line this mode is for) before decode, so a time budget cuts decode first.
        order = ("copy", "stream", "prefill", "decode", "store") if options.fa3 else ALL_SECTIONS
        for section in [s for s in order if s in sections]:
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
            ctx.checkpoint()
            log(f"section {section} done in {result['seconds']} s")
    payload["meta"]["total_seconds"] = round(time.time() - START, 1)
    payload["meta"]["non_finite_outputs"] = non_finite_outputs(payload["sections"])
    ctx.checkpoint()
    print_tables(ctx, payload["sections"])
    return payload


def non_finite_outputs(sections: Dict[str, Any]) -> List[str]:
    """``"<case> <contender>"`` for every contender whose output held a NaN or an inf: a kernel
    that computes garbage fast must not pass for a fast kernel."""
    found = []
    for result in sections.values():
        for case in result.get("cases", []) if isinstance(result, dict) else []:
            for name, record in case.get("contenders", {}).items():
                if isinstance(record, dict) and record.get("output_finite") is False:
                    found.append(f"{case.get('case')} {name}")
    return found


def parse_args(argv: Optional[Sequence[str]] = None) -> Tuple[BenchOptions, List[str]]:
    """The command line as the run's options and its sections."""
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
    parser.add_argument(
        "--geometry", choices=sorted(FA3_GEOMETRIES), default="qwen35", help="--fa3 / --rotation: the layer's shape"
    )
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
    out = args.out or REPO_ROOT / "reports" / ("kernel_bench_smoke.json" if args.smoke else "kernel_bench_h200.json")
    options = BenchOptions(
        smoke=args.smoke, quick=args.quick, no_bs16=args.no_bs16, rotation=args.rotation, fa3=args.fa3,
        geometry=args.geometry, rep_ms=args.rep_ms, warmup_ms=args.warmup_ms, time_budget_s=args.time_budget_s,
        seed=args.seed, out=out,
    )
    return options, [s.strip() for s in args.sections.split(",") if s.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    options, sections = parse_args(argv)
    unknown = [s for s in sections if s not in SECTION_FUNCTIONS]
    if unknown:
        print(f"unknown sections: {unknown}; choose from {ALL_SECTIONS}", file=sys.stderr)
        return 2
    prepare_environment(options.smoke)
    payload = run(options, sections)
    log(f"wrote {options.out}")
    broken = payload["meta"]["non_finite_outputs"]
    if broken:
        print(f"NON-FINITE OUTPUTS ({len(broken)}): " + "; ".join(broken), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
