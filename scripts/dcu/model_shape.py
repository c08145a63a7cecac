#!/usr/bin/env python3
"""Print the self-tuner's shape (govinda_patch/int8/tuner.py TuneShape) for a local model folder.

The shape is what the locked serve command (``vllm serve MODEL --max-model-len 32768``) will build,
read the way the server's background tuning reads it (govinda_patch/int8/launch_shape.py): a plain
dense model from its ``config.json``, any other through the installed vLLM's own configuration
with the overlay on, so a hybrid model's block size is the one vLLM aligns to its mamba page.
``--block-size`` and ``--tensor-parallel`` add those flags to the command. Needs the repo on
``PYTHONPATH`` (``check.sh`` puts it there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# vLLM's configuration of a hybrid model imports and inspects the model class: tens of seconds.
PROBE_TIMEOUT_S = 600.0


def serve_command(model: Path, block_size=None, tensor_parallel: int = 1) -> list:
    command = ["vllm", "serve", str(model), "--max-model-len", "32768"]
    if block_size:
        command += ["--block-size", str(block_size)]
    if tensor_parallel != 1:
        command += ["--tensor-parallel-size", str(tensor_parallel)]
    return command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="model folder with config.json")
    parser.add_argument("--block-size", type=int, default=None, help="default: vLLM's choice")
    parser.add_argument("--tensor-parallel", type=int, default=1)
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(f"model_shape.py: {args.model / 'config.json'} not found (MODEL must be a local model folder)", file=sys.stderr)
        return 2
    from govinda_patch.int8 import launch_shape

    command = serve_command(args.model.resolve(), args.block_size, args.tensor_parallel)
    shape = launch_shape.read(command, PROBE_TIMEOUT_S)
    if "skip" in shape:
        print(f"model_shape.py: no attention shape for {args.model}: {shape['skip']}", file=sys.stderr)
        return 2
    print(json.dumps(shape, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
