"""The capacity sweep's report: Markdown (KV capacity per side, every point's numbers and server
state, the targets) and one PNG of output tok/s and TTFT P99 against concurrency."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from bench import ab_capacity, ab_plot, ab_tables, serve_tiers

GIB = 1 << 30


def _f(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _kv_lines(result: Dict[str, Any]) -> List[str]:
    pinned = result["config"].get("kv_cache_memory_bytes")
    lines = [
        "## KV cache per side (from each server's start-up log)",
        "",
        (f"KV memory pinned on every side: {pinned:,} bytes ({pinned / GIB:.2f} GiB, `--kv-cache-memory-bytes`)."
         if pinned else "KV memory: each server's own profiling (not pinned)."),
        "",
        "| side | KV memory GiB | GPU KV cache size (tokens) | max concurrency at max-model-len | INT8 block / page |",
        "|---|---|---|---|---|",
    ]
    for side in result["sides"]:
        kv = side.get("kv_cache") or {}
        memory = kv.get("reserved_gib", kv.get("available_gib"))
        concurrency = kv.get("max_concurrency") or {}
        pages = kv.get("int8_pages")
        page_text = f"{pages['block_size']} / {pages['page_bytes']:,} B" if pages else "-"
        concurrency_text = f"{concurrency['requests']:.2f}x of {concurrency['max_model_len']:,}" if concurrency else "-"
        lines.append(f"| {side['name']} | {_f(memory, 2)} | {_f(kv.get('tokens'), 0)} | {concurrency_text} | {page_text} |")
    return lines


def _points_lines(input_len: int, by_concurrency: Dict[int, Dict[str, Dict[str, Any]]], sides: List[str]) -> List[str]:
    lines = [
        "| concurrency | side | output tok/s | TTFT P50 / P99 ms | TPOT P50 / P99 ms | done | running max | "
        "waiting max | preemptions | KV use max | KV-limited |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for concurrency, rows in by_concurrency.items():
        for side in sides:
            row = rows.get(side)
            if row is None:
                continue
            limited = {True: "**yes**", False: "no", None: "not sampled"}[row["kv_limited"]]
            usage = row.get("max_kv_usage")
            usage_text = "-" if usage is None else f"{usage:.0%}"
            if row.get("error"):
                lines.append(f"| {concurrency} | {side} | ERROR: {row['error'][:120].replace('|', '/')} | | | | "
                             f"{_f(row.get('max_running'), 0)} | {_f(row.get('max_waiting'), 0)} | "
                             f"{_f(row.get('preemptions'), 0)} | - | {limited} |")
                continue
            hits = row.get("prefix_cache_hit_tokens")
            lines.append(
                f"| {concurrency} | {side} | {_f(row['output_throughput'], 2)} | {_f(row.get('p50_ttft_ms'), 0)} / "
                f"{_f(row.get('p99_ttft_ms'), 0)} | {_f(row.get('p50_tpot_ms'), 2)} / {_f(row.get('p99_tpot_ms'), 2)} | "
                f"{row.get('completed')}/{row.get('num_prompts')} | {_f(row.get('max_running'), 0)} | "
                f"{_f(row.get('max_waiting'), 0)} | {_f(row.get('preemptions'), 0)} | "
                f"{usage_text}" + (f" (prefix hits: {hits:,.0f} tokens)" if hits else "") + f" | {limited} |"
            )
    return lines


def _targets_lines(verdict: Dict[str, Any], spec: Dict[str, Any]) -> List[str]:
    first = verdict["onset"]
    lines = [
        "",
        (f"The bf16 sides are first KV-limited at **concurrency {first}**." if first is not None
         else "No bf16 side is KV-limited at any measured concurrency: every point is below the onset."
         if verdict.get("bf16_measured", True) else "No bf16 side measured at this input length yet."),
        "",
        f"| concurrency | regime | best bf16 tok/s | {spec['candidate']} tok/s | ratio | best bf16 TTFT P99 ms | "
        f"{spec['candidate']} TTFT P99 ms | ratio | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in verdict["rows"]:
        lines.append(
            f"| {row['concurrency']} | {row['regime']} | {_f(row['best_bf16_tok_s'], 2)} ({row['best_bf16_tok_s_side'] or '-'}) | "
            f"{_f(row['candidate_tok_s'], 2)} | {ab_tables.fmt_ratio(row['tok_s_ratio'])} | "
            f"{_f(row['best_bf16_ttft_p99_ms'], 0)} ({row['best_bf16_ttft_side'] or '-'}) | "
            f"{_f(row['candidate_ttft_p99_ms'], 0)} | {ab_tables.fmt_ratio(row['ttft_p99_ratio'])} | {row['verdict']} |"
        )
    return lines


def render_markdown(result: Dict[str, Any], png_note: str) -> str:
    config = result["config"]
    spec = config["capacity"]
    bench = config.get("bench") or {}
    sides = [s["name"] for s in result["sides"]]
    lines = [
        f"# Capacity sweep: {result['name']}",
        "",
        *ab_tables.run_lines(result),
        f"- workload: `vllm bench serve`, random dataset, input {', '.join(str(n) for n in bench.get('input_lens', []))} "
        f"tokens x concurrency {bench.get('max_concurrency')}, {bench.get('num_prompts', serve_tiers.BenchConfig.num_prompts)} "
        f"request(s) per concurrency slot, {bench.get('output_len', serve_tiers.BenchConfig.output_len)} output tokens, "
        "ignore_eos; the server's /metrics sampled every "
        f"{bench.get('metrics_interval_s', serve_tiers.BenchConfig.metrics_interval_s)} s while each point runs",
        f"- candidate: **{spec['candidate']}**; bf16 sides: {', '.join(spec['bf16_sides'])}. KV-limited: the server "
        "preempted, or never ran all the client's concurrent requests at once. Targets against the best bf16 side, at "
        f"and above the first KV-limited point: tok/s >= {spec['min_tok_s_ratio']}x and TTFT P99 <= "
        f"{spec['max_ttft_p99_ratio']}x; below it: tok/s >= {spec['min_tok_s_ratio_below']}x",
        "- P99 over a few requests is close to the worst request: read it as a max.",
        "",
        *_kv_lines(result),
        "",
        *ab_tables.sides_lines(result),
    ]
    by_input = ab_capacity.points(result)
    verdicts = result["capacity"]
    for input_len, by_concurrency in by_input.items():
        lines += ["", f"## Input {input_len} tokens", "", *_points_lines(input_len, by_concurrency, sides),
                  *_targets_lines(verdicts[str(input_len)], spec)]
    lines += ["", png_note, ""]
    return "\n".join(lines)


def render_png(result: Dict[str, Any], path: Path) -> str:
    return ab_plot.with_matplotlib(_draw, result, path)


def _draw(result: Dict[str, Any], path: Path, plt) -> str:
    by_input = ab_capacity.points(result)
    sides = [s["name"] for s in result["sides"]]
    metrics = (("output_throughput", "output tok/s"), ("p99_ttft_ms", "TTFT P99 ms"))
    fig, axes = plt.subplots(len(by_input), 2, figsize=(12, 4 * len(by_input)), squeeze=False)
    for r, (input_len, by_concurrency) in enumerate(by_input.items()):
        first = result["capacity"][str(input_len)]["onset"]
        for ax, (key, title) in zip(axes[r], metrics):
            for side in sides:
                xs = [c for c, rows in by_concurrency.items() if (rows.get(side) or {}).get(key) is not None]
                ys = [by_concurrency[c][side][key] for c in xs]
                if xs:
                    ax.plot(xs, ys, marker="o", label=side)
            if first is not None:
                ax.axvline(first, color="grey", linestyle="dashed", label="bf16 KV-limited from here")
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(by_concurrency))
            ax.set_xticklabels([str(c) for c in by_concurrency])
            ax.set_xlabel("concurrency")
            ax.set_title(f"{title}, input {input_len} tokens")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(labels), fontsize="small")
    fig.suptitle(f"{result['name']}", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![capacity sweep]({path.name})"
