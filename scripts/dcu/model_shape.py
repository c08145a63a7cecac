#!/usr/bin/env python3
"""Print the self-tuner's shape (govinda_patch/int8/tuner.py TuneShape) for a local model folder.

Reads ``config.json`` (the text config of multimodal models such as Qwen3.5); tensor
parallelism divides the heads. The block size is vLLM's decision (hybrid models align it to
the mamba page): pass the one the server logs ("INT8 KV cache for N layers: block_size=...").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def shape_of(config: dict, *, block_size: int, tensor_parallel: int = 1) -> dict:
    text = config.get("text_config") or config
    num_q_heads = int(text["num_attention_heads"])
    num_kv_heads = int(text.get("num_key_value_heads") or num_q_heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // num_q_heads)
    dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
    if num_q_heads % tensor_parallel:
        raise ValueError(f"{num_q_heads} query heads do not split over tensor parallel size {tensor_parallel}")
    return {
        "head_dim": head_dim,
        "num_q_heads": num_q_heads // tensor_parallel,
        "num_kv_heads": max(1, num_kv_heads // tensor_parallel),
        "block_size": block_size,
        "dtype": "fp16" if dtype in ("float16", "half", "fp16") else "bf16",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="model folder with config.json")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--tensor-parallel", type=int, default=1)
    args = parser.parse_args(argv)
    config_path = args.model / "config.json"
    if not config_path.is_file():
        print(f"model_shape.py: {config_path} not found (MODEL must be a local model folder)", file=sys.stderr)
        return 2
    try:
        shape = shape_of(json.loads(config_path.read_text()), block_size=args.block_size, tensor_parallel=args.tensor_parallel)
    except (KeyError, ValueError) as exc:
        print(f"model_shape.py: cannot read the attention shape from {config_path}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(shape, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
