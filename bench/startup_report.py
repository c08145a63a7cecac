"""The start-up benchmark's comparison and Markdown: every side against the baseline, cold and warm,
and the targets of issue #29; over results joined from several calls (``ab_report.merge_results`` with
``keep_repeats``), a side started again is a second sample (means over sides of one configuration,
the baseline's own spread as the A/A)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

STARTS = ("cold", "warm")
# Issue #29: what the overlay may add to a start, and no JIT compile of its kernels left for requests.
TARGETS = {"cold_added_s": 20.0, "warm_added_s": 3.0, "our_jit_lines": 0}
# Columns of the phases table: (key in the start record's phases, header).
PHASE_COLUMNS = (
    ("model_load_s", "model loading"),
    ("weights_load_s", "weights"),
    ("torch_compile_s", "torch.compile"),
    ("graph_cache_load_s", "graphs from cache"),
    ("cuda_graph_capture_s", "CUDA graphs"),
    ("init_engine_s", "init engine"),
    ("overlay_tune_s", "overlay tuning"),
    ("overlay_selftest_background_s", "self-test (background)"),
    ("overlay_tune_background_s", "tuning (background)"),
    ("overlay_selftest_wait_s", "waited for it"),
)
NONE = "–"


def start_record(side: Optional[Dict[str, Any]], kind: str) -> Optional[Dict[str, Any]]:
    for start in (side or {}).get("starts", []):
        if start.get("start") == kind:
            return start
    return None


def _health(side: Optional[Dict[str, Any]], kind: str) -> Optional[float]:
    start = start_record(side, kind)
    return start.get("launch_to_health_s") if start else None


def jit_summary(side: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """JIT-during-inference lines over a side's starts; None when no start's log was read."""
    starts = [s for s in (side or {}).get("starts", []) if "jit" in s]
    if not starts:
        return None
    events = [e for s in starts for e in s["jit"]["events"]]
    return {
        "count": len(events),
        "ours": sum(1 for e in events if e["ours"]),
        "kernels": sorted({e["kernel"] for e in events if e["kernel"]}),
        "our_kernels": sorted({e["kernel"] for e in events if e["ours"]}),
    }


def _difference(mine: Optional[float], theirs: Optional[float]) -> Optional[float]:
    return round(mine - theirs, 2) if mine is not None and theirs is not None else None


def compare(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per side other than the baseline: launch-to-health added (and ratio) per start, the
    phases' differences, the JIT lines; each against its target (met: None where data is missing)."""
    sides = {side["name"]: side for side in result["sides"]}
    baseline_name = result["baseline"]
    baseline = sides.get(baseline_name)
    rows = []
    for side in result["sides"]:
        if side["name"] == baseline_name:
            continue
        row: Dict[str, Any] = {"side": side["name"], "baseline": baseline_name}
        for kind in STARTS:
            mine, theirs = _health(side, kind), _health(baseline, kind)
            added = _difference(mine, theirs)
            limit = TARGETS[f"{kind}_added_s"]
            mine_phases = (start_record(side, kind) or {}).get("phases") or {}
            their_phases = (start_record(baseline, kind) or {}).get("phases") or {}
            row[kind] = {
                "side_s": mine,
                "baseline_s": theirs,
                "added_s": added,
                "ratio": round(mine / theirs, 3) if mine is not None and theirs else None,
                "target_added_s": limit,
                "met": added <= limit if added is not None else None,
                "phases_added_s": {name: _difference(mine_phases.get(name), their_phases.get(name))
                                   for name in sorted(set(mine_phases) | set(their_phases))},
            }
        jit = jit_summary(side)
        row["jit"] = {
            "side": jit,
            "baseline": jit_summary(baseline),
            "target_our_lines": TARGETS["our_jit_lines"],
            "met": jit["ours"] <= TARGETS["our_jit_lines"] if jit is not None else None,
        }
        rows.append(row)
    return rows


def _configuration(side: Dict[str, Any]) -> str:
    """What makes two sides the same server: their environment and flags (not their names). A
    record that lacks either is a server of its own."""
    if "env" not in side or "server_args" not in side:
        return json.dumps(["unrecorded", side["name"]])
    return json.dumps([side["env"] or {}, side["server_args"] or []], sort_keys=True)


def _ok_health(sides: List[Dict[str, Any]], kind: str) -> List[float]:
    values = []
    for side in sides:
        start = start_record(side, kind)
        if start and start.get("status", "ok") == "ok" and start.get("launch_to_health_s") is not None:
            values.append(start["launch_to_health_s"])
    return values


def compare_means(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Sides of one configuration (e.g. ``fa3_bf16`` and ``fa3_bf16_again``, or one side joined
    from two calls) are repeated starts of one server: one row per configuration other than the
    baseline's, its mean launch-to-health against the baseline configuration's mean, and the
    spread of the baseline's own starts (the A/A: a difference inside it is not resolved). Empty
    unless some configuration has more than one side."""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for side in result["sides"]:
        groups.setdefault(_configuration(side), []).append(side)
    if all(len(members) == 1 for members in groups.values()):
        return []
    baseline = next((side for side in result["sides"] if side["name"] == result["baseline"]), None)
    if baseline is None:
        return []
    base_members = groups[_configuration(baseline)]
    rows = []
    for members in groups.values():
        if members is base_members:
            continue
        row: Dict[str, Any] = {"sides": [m["name"] for m in members], "baseline_sides": [m["name"] for m in base_members]}
        for kind in STARTS:
            mine, theirs = _ok_health(members, kind), _ok_health(base_members, kind)
            mean = round(sum(mine) / len(mine), 2) if mine else None
            base_mean = round(sum(theirs) / len(theirs), 2) if theirs else None
            added = _difference(mean, base_mean)
            spread = round(max(theirs) - min(theirs), 2) if len(theirs) > 1 else None
            row[kind] = {
                "n": len(mine), "mean_s": mean, "baseline_n": len(theirs), "baseline_mean_s": base_mean,
                "added_s": added, "target_added_s": TARGETS[f"{kind}_added_s"],
                "met": added <= TARGETS[f"{kind}_added_s"] if added is not None else None,
                "baseline_spread_s": spread,
                "within_spread": abs(added) <= spread if added is not None and spread is not None else None,
            }
        rows.append(row)
    return rows


def means_lines(result: Dict[str, Any]) -> List[str]:
    """The means table (nothing when no configuration was started more than once)."""
    rows = result.get("comparison_means") or compare_means(result)
    if not rows:
        return []
    lines = [
        f"| sides vs baseline sides | cold: mean (n) vs mean (n), added s (target <= +{TARGETS['cold_added_s']:g}) "
        f"| cold: baseline's own spread (A/A) | warm: mean (n) vs mean (n), added s (target <= +{TARGETS['warm_added_s']:g}) "
        "| warm: baseline's own spread (A/A) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"{' + '.join(row['sides'])} vs {' + '.join(row['baseline_sides'])}"]
        for kind in STARTS:
            entry = row[kind]
            cells.append(f"{_s(entry['mean_s'])} ({entry['n']}) vs {_s(entry['baseline_mean_s'])} ({entry['baseline_n']}), "
                         f"{_added(entry)}: {_verdict(entry['met'])}")
            spread = entry["baseline_spread_s"]
            cells.append(NONE if spread is None else
                         f"{spread:.1f}" + (" (the difference is inside it)" if entry["within_spread"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _s(value: Optional[float], digits: int = 1) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def _added(entry: Dict[str, Any]) -> str:
    return NONE if entry["added_s"] is None else f"{entry['added_s']:+.1f}"


def _verdict(met: Optional[bool]) -> str:
    return "no data" if met is None else "met" if met else "missed"


def _overlay_cell(start: Dict[str, Any]) -> str:
    overlay = start.get("overlay") or {}
    if not overlay.get("selftest_lines"):
        return NONE
    origins = sorted({entry["origin"] for entry in (overlay.get("launch_configs") or {}).values()})
    return f"{overlay['selftest']}" + (f", configs {'/'.join(origins)}" if origins else "")


def _compiles_cell(start: Dict[str, Any]) -> str:
    compiles = start.get("our_compiles")
    if not compiles:
        return NONE
    if compiles.get("in_engine") is None:
        return f"{len(compiles['compiles'])} (no engine line)"
    return f"{compiles['before_engine']} / {compiles['in_engine']}"


def _engine_compile_lines(result: Dict[str, Any]) -> List[str]:
    """Our kernels a start compiled after its engine started: what the background did not cover."""
    lines = []
    for side in result["sides"]:
        for start in side.get("starts", []):
            compiles = start.get("our_compiles") or {}
            late = compiles["compiles"][-compiles["in_engine"]:] if compiles.get("in_engine") else []
            if late:  # the compiles are in time order, the engine's last
                names = ", ".join(f"`{c['kernel']}` (+{c['at_s']:.1f} s)" for c in late)
                lines.append(f"- {side['name']} {start['start']} (engine started at +{compiles['engine_start_s']:.1f} s): {names}")
                lines += [f"  - `{c['kernel']}` against the background's: {c['unlike_background']}"
                          for c in late if c.get("unlike_background")]
    return lines or ["- none"]


def _requests_cell(start: Dict[str, Any]) -> str:
    cells = []
    for request in start.get("requests") or []:
        if request.get("error"):
            cells.append("error")
        else:
            tokens = request.get("prompt_tokens")
            cells.append(f"{request['seconds']:.2f} ({tokens if tokens is not None else '?'} tok)")
    return ", ".join(cells) or NONE


def _phases_table(result: Dict[str, Any]) -> List[str]:
    header = ["side", "start", "launch to /health"] + [title for _, title in PHASE_COLUMNS] + \
        ["self-test, launch configs", "ours compiled: before the engine / in it", "probe requests s", "JIT lines (ours)", "status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for side in result["sides"]:
        for start in side.get("starts", []):
            phases = start.get("phases") or {}
            jit = start.get("jit")
            cells = [side["name"], start["start"], _s(start.get("launch_to_health_s"))]
            cells += [_s(phases.get(key)) for key, _ in PHASE_COLUMNS]
            cells += [_overlay_cell(start), _compiles_cell(start), _requests_cell(start),
                      f"{jit['count']} ({jit['ours']})" if jit else NONE, start.get("status", NONE)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def comparison_lines(result: Dict[str, Any]) -> List[str]:
    """The side-by-side comparison: what stdout shows, and the report's second table."""
    rows = result.get("comparison") or compare(result)
    lines = [
        f"| side vs baseline | cold: added s (target <= +{TARGETS['cold_added_s']:g}) | cold ratio "
        f"| warm: added s (target <= +{TARGETS['warm_added_s']:g}) | warm ratio "
        f"| JIT lines of our kernels (target {TARGETS['our_jit_lines']}) | JIT lines, all: side / baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"{row['side']} vs {row['baseline']}"]
        for kind in STARTS:
            entry = row[kind]
            cells += [f"{_added(entry)} ({_s(entry['side_s'])} vs {_s(entry['baseline_s'])}): {_verdict(entry['met'])}",
                      NONE if entry["ratio"] is None else f"{entry['ratio']:.2f}x"]
        jit = row["jit"]
        mine, theirs = jit["side"], jit["baseline"]
        ours = NONE if mine is None else f"{mine['ours']}" + (f" ({', '.join(mine['our_kernels'])})" if mine["our_kernels"] else "")
        cells += [f"{ours}: {_verdict(jit['met'])}",
                  f"{NONE if mine is None else mine['count']} / {NONE if theirs is None else theirs['count']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_markdown(result: Dict[str, Any]) -> str:
    probe = result.get("probe") or {}
    means = means_lines(result)
    dates = sorted({(side.get("measured") or {}).get("date", "") for side in result["sides"]} - {""})
    lines = [
        f"# Start-up benchmark: {result['name']}",
        "",
        "Each side's server started twice: **cold** (its VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR "
        "and GOVINDA_CACHE_DIR emptied) and **warm** (the caches the cold start left). After /health, "
        f"{len(probe.get('prompt_tokens', []))} completions (about {', '.join(str(t) for t in probe.get('prompt_tokens', []))} "
        f"prompt tokens, max_tokens {probe.get('max_tokens', '?')}), then stop. Seconds; {NONE}: not logged; "
        f"/health is polled every {result.get('health_poll_s', '?')} s.",
        "",
        f"- baseline side: **{result['baseline']}**; measured {', '.join(dates) or 'n/a'}",
        f"- model: `{(result.get('config') or {}).get('model', '?')}`",
        "",
        "## Per start",
        "",
        *_phases_table(result),
        "",
        "## Against the baseline",
        "",
        *comparison_lines(result),
        "",
        *(["## Means over repeated starts", "",
            "Sides with the same environment and flags are starts of one server; the baseline's own starts' "
            "spread is how much one start varies on this machine (A/A).", "", *means, ""] if means else []),
        "## Our kernels compiled after the engine started",
        "",
        "Triton metadata files of `kernels/`'s kernels under the side's cache roots, newer than the launch, "
        "against vLLM's \"Initializing a V1 LLM engine\" line (seconds after launch).",
        "",
        *_engine_compile_lines(result),
        "",
        "## JIT compilations during inference",
        "",
    ]
    any_jit = False
    for side in result["sides"]:
        for start in side.get("starts", []):
            events = (start.get("jit") or {}).get("events") or []
            if events:
                any_jit = True
                names = ", ".join(f"`{e['kernel']}`" + (" (ours)" if e["ours"] else "") for e in events)
                lines.append(f"- {side['name']} {start['start']}: {names}")
    if not any_jit:
        lines.append("- none logged")
    problems = [f"- {side['name']} {start['start']}: {p}" for side in result["sides"] for start in side.get("starts", [])
                for p in ([start["error"]] if start.get("error") else []) + start.get("problems", [])]
    if problems:
        lines += ["", "## Problems", "", *problems]
    return "\n".join(lines) + "\n"


def write_reports(result: Dict[str, Any], report_dir: Path) -> Dict[str, Path]:
    result["comparison"] = compare(result)
    result["comparison_means"] = compare_means(result)
    report_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": report_dir / f"{result['name']}.json", "md": report_dir / f"{result['name']}.md"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths["md"].write_text(render_markdown(result), encoding="utf-8")
    return paths


def load_result(path: Path) -> Dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))
