"""The tiers workload's verdicts: per tier and side the scored metrics, ratios to the baseline
side and the SLA verdict (P99s within a factor of the baseline's, completion >= a minimum)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from bench import ab_tables, serve_tiers


def tier_key(tier: Dict[str, Any]) -> str:
    """'6144' at concurrency 1 (and in results from before concurrency lists), '8192@c4' otherwise."""
    concurrency = tier.get("requested_max_concurrency") or 1
    n = tier["requested_input_len"]
    return str(n) if concurrency == 1 else f"{n}@c{concurrency}"


def tier_title(key: str) -> str:
    n, _, concurrency = key.partition("@c")
    return f"Input {n} tokens" + (f", concurrency {concurrency}" if concurrency else "")


def tier_rows(result: Dict[str, Any]) -> Dict[str, Any]:
    """Per tier and side: the scored metrics, ratios to the baseline and the SLA verdict."""
    config = result["config"]
    factor = config["sla_factor"]
    min_completion = config["min_completion"]
    baseline = result["baseline"]
    sides = result["sides"]
    per_side: Dict[str, Dict[int, Dict[str, Any]]] = {}
    input_lens: List[str] = []
    for side in sides:
        tiers = {}
        for tier in (side.get("bench") or {}).get("tiers", []):
            n = tier_key(tier)
            tiers[n] = tier
            if n not in input_lens:
                input_lens.append(n)
        per_side[side["name"]] = tiers
    rows: Dict[str, Any] = {}
    for n in input_lens:
        base = per_side.get(baseline, {}).get(n)
        if base is not None and base.get("error"):
            base = None
        rows[str(n)] = []
        for side in sides:
            tier = per_side[side["name"]].get(n)
            row: Dict[str, Any] = {"side": side["name"], "status": side["status"]}
            if tier is None or tier.get("error"):
                row.update(verdict=f"ERROR: {tier['error']}" if tier else "NO DATA", score=0.0)
                rows[str(n)].append(row)
                continue
            row.update(
                input_tokens_sent=serve_tiers.input_len_range(tier),
                output_throughput=tier["output_throughput"],
                p99_ttft_ms=tier.get("p99_ttft_ms"),
                p99_tpot_ms=tier.get("p99_tpot_ms"),
                completion_rate=tier["completion_rate"],
                completed=tier["completed"],
                num_prompts=tier["num_prompts"],
            )
            reasons = []
            if side["status"] != "ok" or side.get("problems"):
                reasons.append("side invalid")
            if tier["completion_rate"] < min_completion:
                reasons.append(f"completion {tier['completion_rate']:.1%} < {min_completion:.0%}")
            if base is not None:
                for key, label in (("p99_ttft_ms", "TTFT"), ("p99_tpot_ms", "TPOT")):
                    ratio = _ratio(tier.get(key), base.get(key))
                    row[f"{key}_ratio"] = ratio
                    if ratio is None or ratio > factor:
                        reasons.append(f"{label} P99 {ab_tables.fmt_ratio(ratio)} of baseline > {factor}x")
                row["output_throughput_ratio"] = _ratio(tier["output_throughput"], base["output_throughput"])
                row["verdict"] = "PASS" if not reasons else "FAIL: " + "; ".join(reasons)
            else:
                row["verdict"] = "NO BASELINE"
            row["score"] = tier["output_throughput"] if row["verdict"] == "PASS" else 0.0
            rows[str(n)].append(row)
    return rows


def _ratio(value, base) -> Optional[float]:
    if value is None or base is None or base == 0:
        return None
    return value / base
