#!/usr/bin/env python3
"""Assemble ``summary.md`` of a scripts/dcu/check.sh report folder from the files its steps wrote.

Reads ``steps.tsv`` (one line per step: name, status, exit code, seconds, note), ``shape.json``,
``tune.txt``, ``kernel_bench.json`` (the ours/vLLM time ratios) and the A/B report ``dcu-ab.md``;
any of them may be missing (a skipped or failed step), which the summary says.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

AB_NAME = "dcu-ab"
STARTUP_NAME = "dcu-startup"  # check.sh: bench.startup --name


def read_steps(folder: Path) -> list[dict]:
    path = folder / "steps.tsv"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        parts = (line.split("\t") + [""] * 5)[:5]
        steps.append(dict(zip(("name", "status", "rc", "seconds", "note"), parts)))
    return steps


def _ratio(value) -> str:
    return f"{value:.2f}x" if isinstance(value, (int, float)) else "n/a"


def _ours_bandwidth(case: dict, mode: str) -> str:
    """Our decode's effective read bandwidth and its share of the streaming read, one cell."""
    for name, record in (case.get("contenders") or {}).items():
        if not name.startswith("ours_bs") or record.get("status") != "ok" or not record.get("steps"):
            continue
        entry = record["steps"][0].get(mode) or {}
        bandwidth, fraction = entry.get("eff_bw_read_GBps"), entry.get("frac_of_stream_read_bw")
        if isinstance(bandwidth, (int, float)):
            share = f" ({100 * fraction:.0f} % of streaming read)" if isinstance(fraction, (int, float)) else ""
            return f"{bandwidth / 1000:.2f} TB/s{share}"
    return "n/a"


def kernel_bench_rows(payload: dict) -> list[str]:
    """Our time over vLLM's per case (below 1: ours is faster); decode: our read bandwidth too."""
    rows = []
    for section in ("decode", "prefill"):
        for case in payload.get("sections", {}).get(section, {}).get("cases", []):
            ratios = case.get("time_ratios") or {}
            mode = "graph" if "graph" in ratios else "eager"
            entry = ratios.get(mode, {})
            if not entry:
                rows.append(f"| {case.get('case')} | - | {case.get('status', 'no ratios')} | | |")
                continue
            bandwidth = _ours_bandwidth(case, mode) if section == "decode" else ""
            rows.append(
                f"| {case.get('case')} | {mode} | {_ratio(entry.get('ours_over_vllm_bf16'))} | "
                f"{_ratio(entry.get('ours_over_vllm_int8pth'))} | {bandwidth} |"
            )
    return rows


def stream_line(payload: dict) -> str:
    stream = payload.get("sections", {}).get("stream", {})
    value = stream.get("stream_read_GBps")
    if isinstance(value, (int, float)):
        return f"Streaming-read bandwidth of this device (bench/stream_read.py): {value:.0f} GB/s."
    return f"Streaming-read bandwidth: not measured ({stream.get('status', 'no stream section')})."


def render(folder: Path) -> str:
    lines = [f"# DCU check: {folder.name}", ""]
    steps = read_steps(folder)
    lines += ["| step | status | exit | seconds | note |", "|---|---|---|---|---|"]
    for step in steps:
        lines.append(f"| {step['name']} | {step['status']} | {step['rc']} | {step['seconds']} | {step['note']} |")
    if not steps:
        lines.append("| (no steps.tsv) | | | | |")
    doctor = folder / "doctor.txt"
    if doctor.exists():
        lines += ["", "## doctor", "", "```", doctor.read_text().strip()[-4000:], "```"]
    shape = folder / "shape.json"
    if shape.exists() and shape.read_text().strip():
        lines += ["", "## Model shape (tuner key)", "", f"`{shape.read_text().strip()}`"]
    tune = folder / "tune.txt"
    if tune.exists():
        lines += ["", "## Launch configs chosen", "", tune.read_text().strip() or "(empty)"]
    bench = folder / "kernel_bench.json"
    if bench.exists():
        try:
            payload = json.loads(bench.read_text())
            rows, stream = kernel_bench_rows(payload), stream_line(payload)
        except ValueError as exc:
            rows, stream = [f"| unreadable kernel_bench.json: {exc} | | | | |"], ""
        lines += [
            "",
            "## Kernel bench (our time / vLLM's; < 1 is faster)",
            "",
            stream,
            "",
            "| case | timing | vs TRITON_ATTN bf16 | vs upstream INT8 | our decode read bandwidth |",
            "|---|---|---|---|---|",
            *rows,
        ]
    ab = folder / f"{AB_NAME}.md"
    if ab.exists():
        lines += ["", "## Serving A/B (locked command; stock = GOVINDA_DISABLE=1)", "", ab.read_text().strip()]
    startup = folder / f"{STARTUP_NAME}.md"
    if startup.exists():
        lines += ["", "## Start-up: cold and warm, overlay against stock (issue #29)", "", startup.read_text().strip()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: scripts/dcu/summarize.py REPORT_DIR", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    (folder / "summary.md").write_text(render(folder))
    print(f"wrote {folder / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
