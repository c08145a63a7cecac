"""The greedy workload's A/B report: agreement of every side with the baseline side, and the
teacher-forced scores."""

from __future__ import annotations

from typing import Any, Dict, List

from bench import ab_tables, greedy_agreement


def agreement_rows(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Greedy workload: every other side's continuations compared with the baseline side's."""
    baseline = result["baseline"]
    by_name = {side["name"]: side for side in result["sides"]}
    base = by_name.get(baseline) or {}
    rows = []
    for side in result["sides"]:
        if side["name"] == baseline:
            continue
        row: Dict[str, Any] = {"side": side["name"], "baseline": baseline}
        missing = [s.get("name", baseline) for s in (base, side) if "completions" not in (s.get("bench") or {})]
        if missing:
            row["error"] = f"no continuations from {', '.join(missing)}"
        else:
            row.update(greedy_agreement.compare(base["bench"], side["bench"]), side=side["name"], baseline=baseline)
        # Agreement of a side whose run broke a rule (e.g. the overlay never dispatched) proves nothing.
        row["valid"] = all(s.get("status") == "ok" and not s.get("problems") for s in (base, side))
        rows.append(row)
    return rows


def render_markdown(result: Dict[str, Any]) -> str:
    bench = result["config"].get("bench") or {}
    base = next((s for s in result["sides"] if s["name"] == result["baseline"]), {})
    prompts = len(greedy_agreement.GreedyConfig(prompts=bench.get("prompts")).prompt_list())
    prompt_set = "custom" if bench.get("prompts") is not None else "built-in set of bench/greedy_agreement.py"
    lines = [
        f"# A/B greedy agreement: {result['name']}",
        "",
        *ab_tables.run_lines(result),
        f"- workload: {prompts} prompts ({prompt_set}) as plain completions (no chat template), temperature 0, "
        f"max_tokens {bench.get('max_tokens', greedy_agreement.GreedyConfig.max_tokens)}, EOS honoured, one "
        f"request at a time, {bench.get('repeats', 1)} pass(es) per side",
        f"- baseline side: **{result['baseline']}**; identical = the same generated token ids (characters when "
        "the server returns no ids); a failed request counts as a difference; self-agreement = later passes "
        "identical to a side's first pass (the noise floor); near tie = the baseline's top two candidates within "
        f"{greedy_agreement.NEAR_TIE_NATS} nats where the continuations part",
        "",
        *ab_tables.sides_lines(result),
        "",
        "## Agreement with the baseline",
        "",
        "| side | identical | fraction | mean common prefix | baseline mean length | failed | "
        "divergences at a near tie | self-agreement | valid |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base_bench = base.get("bench") or {}
    if "completions" in base_bench:
        lengths = [len(r["token_ids"]) for r in base_bench["completions"] if r.get("token_ids") is not None]
        mean_length = f"{sum(lengths) / len(lengths):.1f} tokens" if lengths else "n/a"
        failed = sum(1 for r in base_bench["completions"] if r["error"])
        lines.append(
            f"| {result['baseline']} (baseline) | - | - | - | {mean_length} | {failed} | - | "
            f"{greedy_agreement.self_agreement_text(base_bench.get('self_agreement'))} | - |"
        )
    for row in result["agreement"]:
        valid = "yes" if row["valid"] else "NO (see Sides)"
        if row.get("error"):
            lines.append(f"| {row['side']} | {row['error']} | - | - | - | - | - | - | {valid} |")
            continue
        unit = row["prefix_unit"]
        side_bench = next(s for s in result["sides"] if s["name"] == row["side"])["bench"]
        lines.append(
            f"| {row['side']} | {row['identical']}/{row['prompts']} | {row['fraction']:.1%} | "
            f"{ab_tables.fmt(row['mean_common_prefix'])} {unit} | {ab_tables.fmt(row['mean_baseline_length'])} {unit} | "
            f"{row['failed']} | {row.get('near_tie_divergences', 0)}/{row['prompts'] - row['identical'] - row['failed']} | "
            f"{greedy_agreement.self_agreement_text(side_bench.get('self_agreement'))} | {valid} |"
        )
    scored = [row for row in result["agreement"] if not row.get("error") and row.get("teacher_forced")]
    if scored:
        first = next((s["bench"]["teacher_forced"] for s in result["sides"] if (s.get("bench") or {}).get("teacher_forced")), [])
        lines += [
            "",
            "## Teacher-forced scoring of fixed texts",
            "",
            f"{len(first)} texts ({', '.join(sorted({t['source'] for t in first}))}; "
            f"{bench.get('teacher_forced_chars', greedy_agreement.GreedyConfig.teacher_forced_chars)} characters each, "
            "from CPython's standard library) scored with prompt_logprobs=2; per position the top-1 token of each side "
            "and the logprob of the true next token. Confident = the baseline's top candidate leads by >= "
            f"{greedy_agreement.CONFIDENT_PROBABILITY_GAP} probability. Flip margin = the baseline's top-2 logprob gap "
            "where the sides' top-1 differ.",
            "",
            "| side | positions | top-1 agreement | confident: agreement (positions) | perplexity ratio - 1 | "
            "mean abs delta logprob (true token) | flips | flip margin median / max (nats) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in scored:
            tf = row["teacher_forced"]
            if tf.get("error"):
                lines.append(f"| {row['side']} | {tf['error']} | - | - | - | - | - | - |")
                continue
            confident = tf["confident_top1_agreement"]
            lines.append(
                f"| {row['side']} | {tf['positions']} | {tf['top1_agreement']:.2%} | "
                f"{'n/a' if confident is None else f'{confident:.2%}'} ({tf['confident_positions']}) | "
                f"{tf['perplexity_ratio_minus_1']:+.3%} | {tf['mean_abs_true_logprob_delta']:.4f} | {tf['flips']} | "
                f"{ab_tables.fmt(tf['flip_baseline_margin_median'], 3)} / {ab_tables.fmt(tf['flip_baseline_margin_max'], 3)} |"
            )
    for row in result["agreement"]:
        if row.get("error"):
            continue
        lines += ["", f"### {row['side']}: differing prompts", ""]
        lines += greedy_agreement.divergence_markdown(row, row["baseline"], row["side"])
    return "\n".join(lines + [""])
