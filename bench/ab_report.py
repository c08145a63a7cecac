"""The A/B result's reports: the tiers Markdown, writing JSON/md/png, joining results of
several runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

from bench import ab_capacity, ab_capacity_report, ab_greedy_report, ab_plot, ab_sla, ab_tables, serve_tiers


def render_markdown(result: Dict[str, Any], png_note: str) -> str:
    if result_workload(result) == "greedy":
        return ab_greedy_report.render_markdown(result)
    if result["config"].get("capacity"):
        return ab_capacity_report.render_markdown(result, png_note)
    config = result["config"]
    rows = result["sla"]
    bench = config.get("bench") or {}
    lines = [
        f"# A/B serving benchmark: {result['name']}",
        "",
        *ab_tables.run_lines(result),
        f"- workload: {bench.get('num_prompts', serve_tiers.BenchConfig.num_prompts)} prompts per tier, "
        f"{bench.get('output_len', serve_tiers.BenchConfig.output_len)} output tokens, concurrency "
        f"{bench.get('max_concurrency', 1)}, ignore_eos; {_client_text(result)}",
        f"- baseline side: **{result['baseline']}**; SLA: TTFT P99 and TPOT P99 <= {config['sla_factor']}x the "
        f"baseline's, completion >= {config['min_completion']:.0%}; score = output tok/s if PASS else 0",
        "- P99 over few requests is close to the worst request: read it as a max, not a tail estimate.",
        "",
        *ab_tables.sides_lines(result),
    ]
    for input_len, tier_rows_ in rows.items():
        lines += [
            "",
            f"## {ab_sla.tier_title(input_len)}",
            "",
            "| side | input tokens sent | output tok/s | vs base | TTFT P99 ms | vs base | TPOT P99 ms | vs base | "
            "completion | SLA | score |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in tier_rows_:
            if "output_throughput" not in row:
                lines.append(f"| {row['side']} | - | - | - | - | - | - | - | - | {row['verdict']} | 0 |")
                continue
            lines.append(
                f"| {row['side']} | {row.get('input_tokens_sent', 'n/a')} | {row['output_throughput']:.2f} | "
                f"{ab_tables.fmt_ratio(row.get('output_throughput_ratio'))} | "
                f"{ab_tables.fmt(row['p99_ttft_ms'])} | {ab_tables.fmt_ratio(row.get('p99_ttft_ms_ratio'))} | "
                f"{ab_tables.fmt(row['p99_tpot_ms'], 2)} | {ab_tables.fmt_ratio(row.get('p99_tpot_ms_ratio'))} | "
                f"{row['completed']}/{row['num_prompts']} ({row['completion_rate']:.0%}) | {row['verdict']} | "
                f"{row['score']:.2f} |"
            )
    lines += ["", "## Score per side (sum over tiers of PASS tok/s)", "", "| side | score | tiers passed |", "|---|---|---|"]
    for side in result["sides"]:
        mine = [r for tier in rows.values() for r in tier if r["side"] == side["name"]]
        passed = sum(1 for r in mine if r["verdict"] == "PASS")
        lines.append(f"| {side['name']} | {sum(r['score'] for r in mine):.2f} | {passed}/{len(mine)} |")
    lines += ["", png_note, ""]
    return "\n".join(lines)


def _client_text(result: Dict[str, Any]) -> str:
    """Which client measured the sides (results before issue #18 came from our own client)."""
    benches = [s.get("bench") or {} for s in result["sides"] if s.get("bench")]
    if benches and all(b.get("tool") == "vllm bench serve" for b in benches):
        warmup = (result["config"].get("bench") or {}).get("warmup_requests", serve_tiers.BenchConfig.warmup_requests)
        return ("measured with `vllm bench serve` of the serving vLLM (random dataset: text prompts the server "
                f"tokenizes again), {warmup} warm-up request(s) in a separate run of the tool and a seed per tier, "
                "so no prompt reuses another's cached prefix")
    return "measured with the project's own client (bench/serve_tiers.py before `vllm bench serve`): random token-id prompts, no prefix reuse"


def result_workload(result: Dict[str, Any]) -> str:
    return (result["config"].get("bench") or {}).get("workload", "tiers")


def write_reports(result: Dict[str, Any], report_dir: Path, with_png: bool = True) -> Dict[str, Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    name = result["name"]
    greedy = result_workload(result) == "greedy"
    if greedy:
        result["agreement"] = ab_greedy_report.agreement_rows(result)
    else:
        result["sla"] = ab_sla.tier_rows(result)
        if result["config"].get("capacity"):
            result["capacity"] = ab_capacity.verdicts(result)
    paths = {"json": report_dir / f"{name}.json", "md": report_dir / f"{name}.md", "png": report_dir / f"{name}.png"}
    # Greedy results hold per-token arrays (ids, logprobs) for every side: written compact, they
    # are half the size, which matters for reports carried to the device with the checkout.
    indent = None if greedy else 1
    paths["json"].write_text(json.dumps(result, indent=indent, default=str), encoding="utf-8")
    if greedy:
        note = ""  # no plot: the tables say it all
    else:
        draw = ab_capacity_report.render_png if result["config"].get("capacity") else ab_plot.render_png
        note = draw(result, paths["png"]) if with_png else "Plot not generated yet (run in progress)."
    paths["md"].write_text(render_markdown(result, note), encoding="utf-8")
    return paths


def merge_results(results: List[Dict[str, Any]], merge_tiers: bool = False, keep_repeats: bool = False) -> Dict[str, Any]:
    """The first result with the sides and runs of the later ones (same name: the later record;
    with ``merge_tiers``, the later record plus the earlier one's tiers it did not measure; with
    ``keep_repeats``, another start of that side, kept beside it as ``<name>_2``, ... with
    ``repeat_of`` naming it)."""
    merged = dict(results[0])
    sides = list(merged["sides"])
    runs = list(merged.get("runs", []))
    for other in results[1:]:
        for record in other["sides"]:
            names = [s["name"] for s in sides]
            if record["name"] in names and keep_repeats:
                k = 2
                while f"{record['name']}_{k}" in names:
                    k += 1
                sides.append(dict(record, name=f"{record['name']}_{k}", repeat_of=record["name"]))
            elif record["name"] in names:
                earlier = sides[names.index(record["name"])]
                sides[names.index(record["name"])] = merge_side_tiers(earlier, record) if merge_tiers else record
            else:
                sides.append(record)
        runs += other.get("runs", [])
    merged.update(sides=sides, runs=runs)
    return merged


def merge_side_tiers(earlier: Dict[str, Any], later: Dict[str, Any]) -> Dict[str, Any]:
    """One side measured over several calls (a sweep split by input length): the later record,
    its tiers joined with the earlier record's other tiers (same tier: the later one), and what
    each earlier call showed in ``earlier_calls``."""
    old_tiers = (earlier.get("bench") or {}).get("tiers") or []
    if not old_tiers or "tiers" not in (later.get("bench") or {"tiers": []}):
        return later
    merged = dict(later)
    new_tiers = (later.get("bench") or {}).get("tiers") or []
    seen = {ab_sla.tier_key(t) for t in new_tiers}
    tiers = [t for t in old_tiers if ab_sla.tier_key(t) not in seen] + list(new_tiers)
    tiers.sort(key=lambda t: (t["requested_input_len"], t.get("requested_max_concurrency") or 1))
    merged["bench"] = dict(later.get("bench") or {"tool": (earlier.get("bench") or {}).get("tool")}, tiers=tiers)
    call = {k: earlier.get(k) for k in ("status", "error", "problems", "startup_s", "measured", "log_path", "kv_cache")}
    call["tiers"] = [ab_sla.tier_key(t) for t in old_tiers if ab_sla.tier_key(t) not in seen]
    merged["earlier_calls"] = list(earlier.get("earlier_calls") or []) + [call]
    # A problem of an earlier call stays a problem of the side.
    merged["problems"] = list(later.get("problems") or []) + [
        f"earlier call: {p}" for p in (earlier.get("problems") or []) if not str(p).startswith("earlier call: ")]
    if earlier.get("status") != "ok" and later.get("status") == "ok":
        merged["problems"].append(f"earlier call: status {earlier.get('status')}: {earlier.get('error')}")
    return merged
