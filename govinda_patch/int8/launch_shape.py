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
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

RESULT_MARK = "govinda-launch-shape: "


def serve_arguments(argv: Sequence[str]) -> List[str]:
    """The arguments vLLM's serve parser reads: after ``serve`` for the CLI, all of them for the
    OpenAI api_server module (its ``--model``)."""
    argv = list(argv)
    if len(argv) > 1 and argv[1] == "serve":
        return argv[2:]
    return argv[1:]


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

    from ..kv_capacity_probe import kv_layout

    cfg = _engine_config(argv)
    model_config, parallel_config = cfg.model_config, cfg.parallel_config
    kv = kv_layout(cfg)
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
