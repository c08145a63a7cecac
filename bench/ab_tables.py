"""Pieces of the A/B reports' Markdown shared by both workloads: number formats, the run
and the sides tables."""

from __future__ import annotations

import shlex
from typing import Any, Dict, List, Optional


def fmt_ratio(ratio: Optional[float]) -> str:
    return "n/a" if ratio is None else f"{ratio:.3f}x"


def fmt(value, digits=1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def run_lines(result: Dict[str, Any]) -> List[str]:
    config = result["config"]
    return [
        f"- date: {result['date']}; host: {result.get('host', {}).get('node', '?')}; "
        f"repo commit: {result.get('repo', {}).get('commit') or 'n/a'}"
        f"{' (uncommitted changes)' if result.get('repo', {}).get('dirty') else ''}"
        + (f"; sides measured in {len(result['runs'])} runs (see 'measured')" if len(result.get("runs", [])) > 1 else ""),
        f"- model: `{config['model']}`; server command: `{shlex.join(config['server_command'])} MODEL PORT [ARGS]`",
    ] + (["- the sides ran at the same time, each on its own GPU and port (see env): they shared the host's CPUs"]
         if config.get("parallel") else [])


def sides_lines(result: Dict[str, Any]) -> List[str]:
    """The per-side table (status, env, env check, log counts, ...) and the overlay's counters."""
    lines = [
        "## Sides",
        "",
        "| side | status | env | server args | start-up s | env check | log counts | measured | problems |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for side in result["sides"]:
        env = ", ".join(f"{k}={'<unset>' if v is None else v}" for k, v in side.get("env", {}).items()) or "-"
        check = side.get("env_check") or {}
        check_text = (
            f"ok ({check.get('checked', 0)} processes)" if check.get("ok") else ("FAILED" if check else "not run")
        )
        counts = ", ".join(f"{k}: {v['count']}" for k, v in (side.get("log_counts") or {}).items()) or "-"
        problems = "; ".join(side.get("problems") or [])
        if side.get("error"):
            problems = (side["error"] + ("; " + problems if problems else "")).replace("|", "/")
        measured = side.get("measured") or {}
        commit = (measured.get("repo") or {}).get("commit") or "no commit"
        dirty = "+dirty" if (measured.get("repo") or {}).get("dirty") else ""
        when = f"{measured.get('date', '?')} on {(measured.get('host') or {}).get('node', '?')}, {commit[:10]}{dirty}"
        lines.append(
            f"| {side['name']} | {side['status']} | {env} | {' '.join(side.get('server_args') or []) or '-'} | "
            f"{fmt(side.get('startup_s'), 0)} | {check_text} | {counts} | {when} | {problems or '-'} |"
        )
    counted = [s for s in result["sides"] if (s.get("govinda_counters") or {}).get("total")]
    if counted:
        lines += ["", "Overlay dispatch counters (summed over processes; decode graph replays are not counted):"]
        for side in counted:
            total = side["govinda_counters"]["total"]
            lines.append(f"- {side['name']}: " + ", ".join(f"{k}={v}" for k, v in sorted(total.items())))
    return lines
