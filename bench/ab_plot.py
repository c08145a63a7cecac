"""The tiers workload's A/B plot (when matplotlib is importable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict


def with_matplotlib(draw: Callable[[Dict[str, Any], Path, Any], str], result: Dict[str, Any], path: Path) -> str:
    """``draw(result, path, pyplot)`` with the headless backend; the note for the md either way."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Plot skipped: matplotlib is not importable here (rerun with --report-only where it is)."
    try:
        return draw(result, path, plt)
    except Exception as exc:  # a plotting bug must not lose the measured results
        return f"Plot failed: {type(exc).__name__}: {exc}"


def render_png(result: Dict[str, Any], path: Path) -> str:
    """Bars per tier and side for tok/s, TTFT P99, TPOT P99. Returns the note for the md."""
    return with_matplotlib(_draw_png, result, path)


def _draw_png(result: Dict[str, Any], path: Path, plt) -> str:
    rows = result["sla"]
    tiers = list(rows)
    sides = [s["name"] for s in result["sides"]]
    metrics = (("output_throughput", "output tok/s (higher is better)"),
               ("p99_ttft_ms", "TTFT P99 ms"), ("p99_tpot_ms", "TPOT P99 ms"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(1, len(sides))
    for ax, (key, title) in zip(axes, metrics):
        for i, side in enumerate(sides):
            values = []
            for tier in tiers:
                row = next((r for r in rows[tier] if r["side"] == side), {})
                values.append(row.get(key) or 0.0)
            positions = [t + (i - (len(sides) - 1) / 2) * width for t in range(len(tiers))]
            ax.bar(positions, values, width, label=side)
        if key != "output_throughput":  # the SLA limit: factor x the baseline's P99
            for t, tier in enumerate(tiers):
                base = next((r for r in rows[tier] if r["side"] == result["baseline"]), {}).get(key)
                if base:
                    limit = base * result["config"]["sla_factor"]
                    ax.hlines(limit, t - 0.45, t + 0.45, colors="red", linestyles="dashed",
                              label="SLA limit" if t == 0 else None)
        ax.set_xticks(range(len(tiers)))
        ax.set_xticklabels([f"{t} in" for t in tiers])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()  # sides plus the SLA limit marker
    fig.legend(handles, labels, loc="upper right", ncol=len(labels), fontsize="small")
    fig.suptitle(f"{result['name']} (baseline: {result['baseline']})", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![A/B plot]({path.name})"
