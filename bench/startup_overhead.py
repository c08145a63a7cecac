"""Start-up cost of the overlay, measured side by side in one run.

For ``python -c pass`` and ``python -c "import vllm"``: runs the command alternately without and
with the repo on PYTHONPATH (interleaved, so machine noise hits both sides alike) and reports the
median wall time of each side, the added time and the ratio. Targets: <= 10 ms added to
``python -c pass``; <= 5 % added to ``import vllm``.

    python -m bench.startup_overhead [--runs-pass 40] [--runs-vllm 9] [--out reports/startup_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"pass": ("added_ms", 10.0), "import vllm": ("ratio_pct", 5.0)}


def _env(with_overlay: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVINDA_") and k != "PYTHONPATH"}
    if with_overlay:
        env["PYTHONPATH"] = str(REPO)
    return env


def _time_once(code: str, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(code: str, runs: int) -> dict:
    without, with_overlay = [], []
    _time_once(code, _env(False))  # warm the page cache for both sides
    _time_once(code, _env(True))
    for i in range(runs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for side in order:
            (with_overlay if side else without).append(_time_once(code, _env(side)))
    base, over = float(np.median(without)), float(np.median(with_overlay))
    return {
        "runs": runs,
        "median_without_s": base,
        "median_with_s": over,
        "added_ms": (over - base) * 1000,
        "ratio_pct": (over / base - 1) * 100,
        "samples_without_s": without,
        "samples_with_s": with_overlay,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs-pass", type=int, default=40)
    parser.add_argument("--runs-vllm", type=int, default=9)
    parser.add_argument("--out", default=str(REPO / "reports" / "startup_overhead.json"))
    args = parser.parse_args()

    results = {
        "meta": {"python": sys.version.split()[0], "executable": sys.executable, "machine": platform.platform(),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv)},
        "pass": measure("pass", args.runs_pass),
        "import vllm": measure("import vllm", args.runs_vllm),
    }
    print(f"{'command':14s} {'without':>10s} {'with':>10s} {'added':>10s} {'ratio':>8s}  target")
    for name, (metric, limit) in TARGETS.items():
        r = results[name]
        met = r[metric] <= limit
        r["target"] = {"metric": metric, "limit": limit, "met": met}
        unit = "ms" if metric == "added_ms" else "%"
        print(f"{name:14s} {r['median_without_s']*1000:8.1f}ms {r['median_with_s']*1000:8.1f}ms "
              f"{r['added_ms']:8.1f}ms {r['ratio_pct']:7.2f}%  {metric} <= {limit}{unit}: {'met' if met else 'NOT met'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
