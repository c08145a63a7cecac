"""The attention shape a ``vllm serve`` command line will tune, read before its engine starts.

The self-tuner's key (:class:`tuner.TuneShape`: head size, q/kv heads per rank, block size, dtype)
is only final inside a worker, after vLLM has aligned a hybrid model's attention pages to its
mamba state. The background prefetch (``selftest_prefetch``) wants to tune it while the server
is still starting, so this module asks the installed vLLM the same questions from the launch's
own command line: vLLM's ``serve`` argument parser, ``create_engine_config``, one ``Attention``
layer's spec and the KV pool layout (the capacity calculator's probe, with the overlay on), so a
flag that changes the shape changes it here too. No GPU work and no weights.

``python -m govinda_patch.int8.launch_shape ARGV_JSON`` prints one ``RESULT_MARK`` line: the
shape, or ``{"skip": why}`` when the overlay would not serve the model or vLLM refuses the args.

That import of vLLM takes about as long as the server's own start-up reaches its engine
(reports/h100/startup.md), so for the plain case -- a local dense model of a family whose
attention vLLM builds from ``config.json`` alone, and only arguments that leave the shape alone --
:func:`config_shape` reads the shape from the config file at once. Anything else goes to vLLM.
``tests/test_capacity_calculator.py`` checks the two agree on every vLLM line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

RESULT_MARK = "govinda-launch-shape: "

# Families whose attention shape is head_dim (or hidden_size / heads) x heads x KV heads in every
# vLLM line, with no hybrid, sliding-window or latent-attention layers.
DENSE_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# vLLM's cache block size when none is given (CUDA and ROCm alike, every line tested).
DEFAULT_BLOCK_SIZE = 16
# Serve options that take a value and leave the attention shape alone.
_NEUTRAL_OPTIONS = (
    "--host", "--port", "--max-model-len", "--served-model-name", "--load-format", "--gpu-memory-utilization",
    "--kv-cache-memory-bytes", "--max-num-seqs", "--max-num-batched-tokens", "--seed", "--api-key",
    "--uvicorn-log-level", "--download-dir", "--tokenizer",
)
_NEUTRAL_SWITCHES = (
    "--enforce-eager", "--trust-remote-code", "--disable-log-requests", "--disable-log-stats",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--language-model-only",
)
_DTYPES = {"half": "fp16", "float16": "fp16", "bfloat16": "bf16"}


def serve_arguments(argv: Sequence[str]) -> List[str]:
    """The arguments vLLM's serve parser reads: after ``serve`` for the CLI, all of them for the
    OpenAI api_server module (its ``--model``)."""
    argv = list(argv)
    if len(argv) > 1 and argv[1] == "serve":
        return argv[2:]
    return argv[1:]


# vLLM's human-readable integers (``human_readable_int``): "32768", "32k" (x 1000), "32K" (x 1024).
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")
_MULTIPLIERS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def max_model_len_arg(argv: Sequence[str]) -> Optional[int]:
    """The launch's explicit ``--max-model-len`` (the last one given), or None when it gives none
    or one that is not a plain positive length ("auto", -1, a malformed value: vLLM decides)."""
    value = None
    args = serve_arguments(argv)
    for index, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name.replace("_", "-") == "--max-model-len":
            value = inline if eq else (args[index + 1] if index + 1 < len(args) else None)
    match = _HUMAN_INT.fullmatch(value.strip()) if value else None
    if match is None or ("." in match.group(1) and match.group(2) not in ("k", "m", "g", "t")):
        return None
    length = int(float(match.group(1)) * _MULTIPLIERS[match.group(2)])
    return length if length > 0 else None


def _dense_arguments(argv: Sequence[str]) -> Optional[argparse.Namespace]:
    """The launch's model, dtype, block size and tensor parallelism, or None when any argument
    is one this shortcut does not know (vLLM's probe then reads them)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--model")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    for option in _NEUTRAL_OPTIONS:
        parser.add_argument(option)
    for switch in _NEUTRAL_SWITCHES:
        parser.add_argument(switch, action="store_true")
    try:
        args, unknown = parser.parse_known_args(serve_arguments(argv))
    except (SystemExit, ValueError):  # argparse exits on a malformed value
        return None
    if unknown or args.tensor_parallel_size < 1:
        return None
    return args


def config_shape(argv: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The shape :func:`probe` would give, read from a local dense model's ``config.json`` alone;
    None wherever only vLLM can tell (see ``DENSE_MODEL_TYPES``). Never raises."""
    args = _dense_arguments(argv)
    model = args and (args.model_tag or args.model)
    if not model:
        return None
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # a hub name or an unreadable directory
    if not isinstance(config, dict) or config.get("model_type") not in DENSE_MODEL_TYPES:
        return None
    if any(key in config for key in ("text_config", "layer_types", "kv_lora_rank")):
        return None
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        return None  # a window in force: the spec (and whether the overlay serves it) is vLLM's call
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads", config.get("num_attention_heads"))
    hidden = config.get("hidden_size")
    if not all(isinstance(v, int) and v > 0 for v in (heads, kv_heads, hidden)) or heads % args.tensor_parallel_size:
        return None
    head_dim = config.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int) or head_dim not in (64, 128, 256):
        return None
    dtype = _DTYPES.get(args.dtype)
    if args.dtype == "auto":
        dtype = _DTYPES.get(config.get("torch_dtype") or config.get("dtype"))
    if dtype is None:  # float32 checkpoints: vLLM's choice differs between lines
        return None
    return {
        "head_dim": head_dim,
        "num_q_heads": heads // args.tensor_parallel_size,
        "num_kv_heads": max(1, kv_heads // args.tensor_parallel_size),
        "block_size": args.block_size or DEFAULT_BLOCK_SIZE,
        "dtype": dtype,
    }


def _engine_config(argv: Sequence[str]):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = ServeSubcommand().subparser_init(FlexibleArgumentParser(prog="vllm").add_subparsers())
    args = parser.parse_args(serve_arguments(argv))
    if getattr(args, "model_tag", None) is not None:  # what `vllm serve` itself does with it
        args.model = args.model_tag
    return AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


def probe(argv: Sequence[str]) -> Dict[str, Any]:
    import torch

    from ..kv_capacity_probe import kv_layout, model_inspection_here

    with model_inspection_here():
        cfg = _engine_config(argv)
        kv = kv_layout(cfg)
    model_config, parallel_config = cfg.model_config, cfg.parallel_config
    if kv.attention_spec.dtype != torch.int8:
        return {"skip": f"the overlay does not serve this model here (KV dtype {kv.attention_spec.dtype})"}
    # The attention group's block size after page unification: the one the metadata builder sees.
    block = next(g.kv_cache_spec.block_size for g in kv.layout.kv_cache_groups if g.kv_cache_spec.dtype == torch.int8)
    return {
        "head_dim": model_config.get_head_size(),
        "num_q_heads": model_config.get_num_attention_heads(parallel_config),
        "num_kv_heads": model_config.get_num_kv_heads(parallel_config),
        "block_size": int(block),
        "dtype": "fp16" if model_config.dtype == torch.float16 else "bf16",
    }


def predict(argv: Sequence[str], timeout_s: float, environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run :func:`probe` in a fresh interpreter with the overlay on (its self-test skipped: nothing
    runs on a GPU). ``{"skip": why}`` on any failure; never raises."""
    from ..capacity import side_env

    command = [sys.executable, "-m", __name__, json.dumps(list(argv))]
    try:
        done = subprocess.run(command, env=side_env("overlay", environ), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"skip": f"vLLM's configuration did not answer within {timeout_s:.0f} s"}
    except OSError as exc:
        return {"skip": f"{type(exc).__name__}: {exc}"}
    lines = [line[len(RESULT_MARK):] for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])[:300]
        return {"skip": f"vLLM's configuration failed (exit {done.returncode}): {tail}"}
    try:
        return json.loads(lines[-1])
    except ValueError:
        return {"skip": f"vLLM's configuration answered garbage: {lines[-1][:200]}"}


def read(argv: Sequence[str], timeout_s: float) -> Dict[str, Any]:
    """The launch's shape: :func:`config_shape` where it answers, else :func:`predict`. Never raises."""
    return config_shape(argv) or predict(argv, timeout_s)


def main(args: List[str]) -> int:
    try:
        result = probe(json.loads(args[0]))
    except SystemExit as exc:  # argparse exits on arguments it refuses (its message is on stderr)
        result = {"skip": f"vLLM's serve parser refused the arguments (exit {exc.code})"}
    except Exception as exc:  # e.g. CapacityError: a model the capacity probe does not cover
        result = {"skip": f"{type(exc).__name__}: {exc}"[:300]}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
