"""Build an A/B report (bench/ab.py's JSON/md/png) from serve_smoke.sh results.

serve_smoke.sh starts one server per side itself (used when the device budget allowed no full
bench/ab.py run); the report therefore shows "env check: not run" for every side.

    python -m scripts.h200.tiers_to_ab NAME OUT_DIR SIDE=TIERS_JSON[:SERVER_ARGS]... [--env SIDE=K=V]...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import ab, ab_report, provenance


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("out_dir")
    parser.add_argument("sides", nargs="+", help="SIDE=TIERS_JSON[:server args]; the first side is the baseline")
    parser.add_argument("--env", action="append", default=[], help="SIDE=KEY=VALUE, the side's server env")
    parser.add_argument("--model", default="qwen3_5-27b-shape-8layers (dummy weights)")
    parser.add_argument("--command", default="sh scripts/h200/serve_smoke.sh")
    args = parser.parse_args()
    envs: dict = {}
    for item in args.env:
        side, key, value = item.split("=", 2)
        envs.setdefault(side, {})[key] = value
    sides = []
    for item in args.sides:
        name, _, rest = item.partition("=")
        path, _, server_args = rest.partition(":")
        bench = json.loads(Path(path).read_text())
        sides.append({"name": name, "status": "ok", "env": envs.get(name, {}), "server_args": server_args.split(),
                      "bench": bench, "problems": [], "measured": {"date": bench.get("date") or bench["tiers"][0].get("date", "?")}})
    first_bench = sides[0]["bench"]["config"]
    result = {
        "schema": ab.SCHEMA, "name": args.name, "baseline": sides[0]["name"],
        "config": {"model": args.model, "server_command": args.command.split(), "sla_factor": 1.5, "min_completion": 0.99,
                   "bench": {k: first_bench.get(k) for k in ("num_prompts", "output_len", "max_concurrency")}},
        "date": sides[0]["measured"]["date"], "host": {"node": "H200 device machine"}, "repo": provenance.repo_state(),
        "runs": [], "sides": sides,
    }
    paths = ab_report.write_reports(result, Path(args.out_dir))
    print(f"wrote {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
