"""How long the launch-shape probe (govinda_patch/int8/launch_shape.py) takes from a cold vLLM cache,
with vLLM's model-class inspection in the probe's own process (``model_inspection_here``, as
shipped) against vLLM's own way, a new interpreter (the context manager replaced by a no-op),
side by side: pairs alternate the order, each run gets an empty VLLM_CACHE_ROOT, so the model-info
cache never helps. Issue #29: for a hybrid model this probe is what the background tuning waits
for before the engine may start.

    python -m bench.shape_probe MODEL_DIR [--pairs 2] [--out FILE.json] [-- extra serve args]

Needs vLLM's platform as a server would have it (on a CPU: the simulated DCU, i.e.
``PYTHONPATH=.:tests/dcu_sim GOVINDA_PLATFORM=rocm``). Prints each run and the median ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from govinda_patch.capacity import side_env
from govinda_patch.int8.launch_shape import RESULT_MARK

# The probe module's main, with or without the in-process inspection.
SIDES = {
    "in_process": "from govinda_patch.int8 import launch_shape; import sys; sys.exit(launch_shape.main(sys.argv[1:]))",
    "subprocess": ("import contextlib, sys; from govinda_patch import kv_capacity_probe; "
                   "kv_capacity_probe.model_inspection_here = contextlib.nullcontext; "
                   "from govinda_patch.int8 import launch_shape; sys.exit(launch_shape.main(sys.argv[1:]))"),
}


def run_once(side: str, argv: List[str]) -> Dict[str, Any]:
    """One probe with an empty vLLM cache: seconds, the shape it answered, model-info files written."""
    with tempfile.TemporaryDirectory(prefix="govinda-shape-probe-") as root:
        # The probe's own environment (launch_shape.predict): the overlay on, its self-test skipped.
        env = side_env("overlay", dict(os.environ, VLLM_CACHE_ROOT=os.path.join(root, "vllm"),
                                       GOVINDA_CACHE_DIR=os.path.join(root, "govinda")))
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-c", SIDES[side], json.dumps(argv)], env=env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        seconds = time.monotonic() - began
        answers = [line[len(RESULT_MARK):] for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
        modelinfos = os.path.join(root, "vllm", "modelinfos")
        return {
            "side": side, "seconds": round(seconds, 2), "returncode": done.returncode,
            "shape": json.loads(answers[-1]) if answers else None,
            "modelinfo_files": len(os.listdir(modelinfos)) if os.path.isdir(modelinfos) else 0,
            "stderr_tail": done.stderr.strip().splitlines()[-2:] if not answers else [],
        }


def run(model: str, pairs: int, extra: List[str]) -> Dict[str, Any]:
    argv = ["vllm", "serve", model, "--max-model-len", "32768", "--load-format", "dummy", *extra]
    runs = []
    for index in range(pairs):
        order = ("in_process", "subprocess") if index % 2 == 0 else ("subprocess", "in_process")
        for side in order:
            runs.append(run_once(side, argv))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    medians = {side: statistics.median(r["seconds"] for r in runs if r["side"] == side) for side in SIDES}
    shapes = {json.dumps(r["shape"], sort_keys=True) for r in runs}
    return {
        "argv": argv, "pairs": pairs, "runs": runs, "median_s": medians,
        "in_process_over_subprocess": round(medians["in_process"] / medians["subprocess"], 3),
        "same_shape_everywhere": len(shapes) == 1 and runs[0]["shape"] is not None,
        "load_1min": os.getloadavg()[0],
    }


def main(args: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--out", help="write the result JSON here")
    args = list(sys.argv[1:] if args is None else args)
    extra = args[args.index("--") + 1:] if "--" in args else []  # more serve arguments
    ns = p.parse_args(args[:len(args) - len(extra) - (1 if "--" in args else 0)])
    if ns.pairs < 1:
        p.error("--pairs must be >= 1")
    result = run(ns.model, ns.pairs, extra)
    if ns.out:
        with open(ns.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"median in-process {result['median_s']['in_process']:.1f} s, subprocess {result['median_s']['subprocess']:.1f} s: "
          f"ratio {result['in_process_over_subprocess']:.3f}; same shape everywhere: {result['same_shape_everywhere']}")
    return 0 if result["same_shape_everywhere"] else 1


if __name__ == "__main__":
    sys.exit(main())
