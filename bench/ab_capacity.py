"""The capacity sweep's verdicts: where the bf16 sides run out of KV cache, and what the candidate
(the overlay) does from there on.

Per input length and concurrency, each side's row holds the tool's numbers (output tok/s, TTFT
and TPOT P50/P99) and the server's sampled state (bench/server_metrics.py: most requests running
and waiting at once, preemptions, KV-cache usage). The *onset* of an input length is the lowest
concurrency at which any bf16 side is KV-limited (it preempted, or never ran all the client's
requests at once). Targets (sides file ``capacity:``, defaults from issue #27), against the best
bf16 side at each point (highest tok/s, lowest TTFT P99):
  - at and above the onset: candidate tok/s >= min_tok_s_ratio x and TTFT P99 <= max_ttft_p99_ratio x;
  - below it: candidate tok/s >= min_tok_s_ratio_below x (no loss where memory is not the limit).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from bench import server_metrics

TOOL_KEYS = ("output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms")
STATE_KEYS = ("max_running", "max_waiting", "preemptions", "max_kv_usage", "prefix_cache_hit_tokens", "samples")


def point_row(tier: Dict[str, Any]) -> Dict[str, Any]:
    """One side's numbers at one point (input length, concurrency)."""
    concurrency = tier.get("requested_max_concurrency") or 1
    row: Dict[str, Any] = {"concurrency": concurrency, "input_len": tier["requested_input_len"]}
    if tier.get("error"):
        row["error"] = tier["error"]
    else:
        row.update({k: tier.get(k) for k in TOOL_KEYS})
        row.update(completed=tier.get("completed"), num_prompts=tier.get("num_prompts"))
    metrics = tier.get("server_metrics")
    row.update({k: (metrics or {}).get(k) for k in STATE_KEYS})
    row["kv_limited"] = server_metrics.kv_limited(metrics, concurrency)
    return row


def points(result: Dict[str, Any]) -> Dict[int, Dict[int, Dict[str, Dict[str, Any]]]]:
    """{input length: {concurrency: {side: row}}}, in measured order."""
    out: Dict[int, Dict[int, Dict[str, Dict[str, Any]]]] = {}
    for side in result["sides"]:
        for tier in (side.get("bench") or {}).get("tiers") or []:
            row = point_row(tier)
            out.setdefault(row["input_len"], {}).setdefault(row["concurrency"], {})[side["name"]] = row
    return {n: dict(sorted(by_c.items())) for n, by_c in sorted(out.items())}


def onset(by_concurrency: Dict[int, Dict[str, Dict[str, Any]]], bf16_sides: List[str]) -> Optional[int]:
    """The lowest concurrency at which a bf16 side is KV-limited (None: none is, anywhere)."""
    for concurrency, rows in by_concurrency.items():
        if any(rows.get(name, {}).get("kv_limited") for name in bf16_sides):
            return concurrency
    return None


def _ratio(value, base) -> Optional[float]:
    if value is None or not base:
        return None
    return value / base


def _best(rows: Dict[str, Dict[str, Any]], names: List[str], key: str, pick) -> tuple:
    candidates = [(rows[n][key], n) for n in names if n in rows and rows[n].get(key) is not None]
    return pick(candidates) if candidates else (None, None)


def verdicts(result: Dict[str, Any]) -> Dict[str, Any]:
    """Per input length: the onset and, per concurrency, the candidate against the best bf16 side."""
    spec = result["config"]["capacity"]
    candidate, bf16 = spec["candidate"], spec["bf16_sides"]
    out: Dict[str, Any] = {}
    for input_len, by_concurrency in points(result).items():
        first = onset(by_concurrency, bf16)
        rows_out = []
        for concurrency, rows in by_concurrency.items():
            mine = rows.get(candidate) or {}
            best_tok, best_tok_side = _best(rows, bf16, "output_throughput", max)
            best_ttft, best_ttft_side = _best(rows, bf16, "p99_ttft_ms", min)
            limited = first is not None and concurrency >= first
            tok_ratio = _ratio(mine.get("output_throughput"), best_tok)
            ttft_ratio = _ratio(mine.get("p99_ttft_ms"), best_ttft)
            checks = []
            if limited:
                checks.append(("tok/s", tok_ratio, ">=", spec["min_tok_s_ratio"]))
                checks.append(("TTFT P99", ttft_ratio, "<=", spec["max_ttft_p99_ratio"]))
            else:
                checks.append(("tok/s", tok_ratio, ">=", spec["min_tok_s_ratio_below"]))
            missing = [name for name, ratio, _, _ in checks if ratio is None]
            failed = [f"{name} {ratio:.2f}x (target {op} {bound}x)" for name, ratio, op, bound in checks
                      if ratio is not None and not (ratio >= bound if op == ">=" else ratio <= bound)]
            verdict = "NO DATA" if missing else ("MET" if not failed else "MISSED: " + "; ".join(failed))
            rows_out.append({
                "concurrency": concurrency, "regime": "at/above onset" if limited else "below onset",
                "best_bf16_tok_s": best_tok, "best_bf16_tok_s_side": best_tok_side,
                "best_bf16_ttft_p99_ms": best_ttft, "best_bf16_ttft_side": best_ttft_side,
                "candidate_tok_s": mine.get("output_throughput"), "candidate_ttft_p99_ms": mine.get("p99_ttft_ms"),
                "tok_s_ratio": tok_ratio, "ttft_p99_ratio": ttft_ratio, "verdict": verdict,
            })
        measured = any(name in rows for rows in by_concurrency.values() for name in bf16)
        out[str(input_len)] = {"onset": first, "bf16_measured": measured, "rows": rows_out}
    return out
