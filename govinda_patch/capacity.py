"""``python -m govinda_patch capacity MODEL_DIR --gpu-mem-gib 64``: how many tokens and requests
fit in the KV cache on a card of that size, for stock bf16 and for the overlay's INT8 pages.

The model's config is read, never its weights, and no GPU is used. Each side is computed by
vLLM's own code in a fresh interpreter (``govinda_patch/kv_capacity_probe.py``): stock with
``GOVINDA_DISABLE=1``, the overlay with this repo on ``PYTHONPATH`` (the kernel self-test is
skipped: nothing runs on a GPU), so the spec, the hybrid page alignment and the pool arithmetic
are exactly what a server of the installed vLLM would use.

KV memory, as vLLM budgets it: ``gpu_mem x gpu_memory_utilization - weights - overhead``.
Weights are counted from the config (govinda_patch/model_weights.py) unless given; the overhead
(activation peak, non-torch memory, CUDA graphs) cannot be known without running the model:
vLLM logs it at start-up ("Actual usage is W for weight, A for peak activation, N for non-torch
memory, and G for CUDAGraph memory"), so pass your own with ``--overhead-gib``, or the KV memory
itself (vLLM's "Available KV cache memory") with ``--kv-cache-memory-gib``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from .kv_capacity_probe import GIB, RESULT_MARK
from .settings import REPO_ROOT

MIB = 1 << 20
DEFAULT_OVERHEAD_GIB = 4.0
PROBE_TIMEOUT_S = 900.0
STDERR_TAIL = 15
SIDES = (("stock", "stock bf16"), ("overlay", "overlay INT8"))


class CapacityFailed(RuntimeError):
    pass


def side_env(side: str, environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The probe's environment: this repo first on the path; the overlay off or on for the side."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items()}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in path if Path(p).resolve() != REPO_ROOT])
    env["GOVINDA_DISABLE"] = "1" if side == "stock" else "0"
    if side == "overlay":
        env["GOVINDA_SELFTEST"] = "skip"  # no kernel runs here; the page arithmetic needs no GPU
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


def run_probe(request: Dict[str, Any], side: str, environ: Optional[Dict[str, str]] = None,
              timeout_s: float = PROBE_TIMEOUT_S) -> Dict[str, Any]:
    """One side's numbers from a fresh interpreter (raises CapacityFailed with its stderr's tail)."""
    command = [sys.executable, "-m", "govinda_patch.kv_capacity_probe", json.dumps(request)]
    try:
        done = subprocess.run(command, env=side_env(side, environ), capture_output=True, text=True,
                              timeout=timeout_s, cwd=str(REPO_ROOT), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CapacityFailed(f"{side}: vLLM did not answer within {timeout_s:.0f} s") from None
    lines = [line[len(RESULT_MARK):] for line in done.stdout.splitlines() if line.startswith(RESULT_MARK)]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.splitlines()[-STDERR_TAIL:])
        raise CapacityFailed(f"{side}: vLLM's configuration failed (exit {done.returncode}):\n{tail}")
    result = json.loads(lines[-1])
    if "error" in result:
        raise CapacityFailed(f"{side}: {result['error']}")
    return result


def build_request(args: argparse.Namespace) -> Dict[str, Any]:
    request: Dict[str, Any] = {
        "model": str(Path(args.model_dir).resolve()), "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization, "language_model_only": args.language_model_only,
        "gpu_mem_gib": args.gpu_mem_gib, "overhead_gib": args.overhead_gib, "weights_gib": args.weights_gib,
        "request_lens": args.request_len or [],
    }
    if args.kv_cache_memory_gib is not None:
        request["kv_cache_memory_bytes"] = int(args.kv_cache_memory_gib * GIB)
    return request


def compute(request: Dict[str, Any], environ: Optional[Dict[str, str]] = None) -> Dict[str, Dict[str, Any]]:
    results = {side: run_probe(request, side, environ) for side, _ in SIDES}
    overlay = results["overlay"]
    if overlay["kv_dtype"] != "int8":  # e.g. head size 96, or the overlay's own checks said no
        overlay["not_served"] = (f"the overlay does not serve this model here (backend {overlay['backend']}, "
                                 f"KV dtype {overlay['kv_dtype']}): it stays stock")
    return results


def _gib(n: Optional[float]) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _budget_line(first: Dict[str, Any], request: Dict[str, Any]) -> str:
    budget, weights = first["budget"], first["weights"]
    if budget["source"] == "given":
        return f"KV memory: {_gib(budget['kv_bytes'])} (given)"
    if weights["bytes"] is None:
        return f"KV memory: unknown: {weights['why']}"
    what = ("given" if weights["source"] == "given" else
            f"{weights['parameters'] / 1e9:.2f} B parameters counted from the config, {weights['family']}")
    return (f"KV memory = {request['gpu_mem_gib']:g} GiB x {request['gpu_memory_utilization']:g} "
            f"- weights {_gib(weights['bytes'])} ({what}) - overhead {_gib(budget['overhead_bytes'])} "
            f"(activation peak, non-torch, CUDA graphs; --overhead-gib) = {_gib(budget['kv_bytes'])}")


def render(results: Dict[str, Dict[str, Any]], request: Dict[str, Any]) -> str:
    stock, overlay = results["stock"], results["overlay"]
    first = stock
    lines = [
        f"{Path(request['model']).name}: {first['architecture']}, {first['dtype']}, {first['attention_layers']} attention"
        + (f" + {first['mamba_layers']} linear-attention (mamba-state)" if first["mamba_layers"] else "")
        + f" layers, {first['num_kv_heads']} KV heads x {stock['head_size']}; vLLM {first['vllm']} on {first['platform']}",
        _budget_line(first, request),
        "",
        f"| | stock bf16 ({stock['backend']}) | overlay INT8 ({overlay['backend']}) | overlay / stock |",
        "|---|---|---|---|",
        f"| attention block (tokens) / page (bytes) | {stock['block_size']} / {stock['page_bytes']:,} | "
        f"{overlay['block_size']} / {overlay['page_bytes']:,} | |",
        f"| KV bytes per token, all attention layers, hybrid page padding included | {stock['token_bytes']:,.0f} | "
        f"{overlay['token_bytes']:,.0f} | {_ratio(overlay['token_bytes'], stock['token_bytes'])} |",
    ]
    if stock["mamba_layers"]:
        lines.append(
            f"| mamba state per request, padded to pages (unpadded) | {stock['request_state_bytes'] / MIB:,.1f} MiB "
            f"({stock['request_state_bytes_unpadded'] / MIB:,.1f}) | {overlay['request_state_bytes'] / MIB:,.1f} MiB "
            f"({overlay['request_state_bytes_unpadded'] / MIB:,.1f}) | |")
    s_cap, o_cap = stock["capacity"], overlay["capacity"]
    if s_cap["fits"] or o_cap["fits"]:
        def cell(cap, key, fmt):
            return fmt(cap[key]) if cap["fits"] else "does not fit"

        lines.append(f"| tokens that fit (vLLM's \"GPU KV cache size\") | {cell(s_cap, 'tokens', '{:,}'.format)} | "
                     f"{cell(o_cap, 'tokens', '{:,}'.format)} | {_ratio(o_cap.get('tokens'), s_cap.get('tokens'))} |")
        lines.append(f"| requests of {request['max_model_len']:,} tokens that fit (vLLM's max concurrency) | "
                     f"{cell(s_cap, 'max_concurrency', '{:.2f}'.format)} | {cell(o_cap, 'max_concurrency', '{:.2f}'.format)} | "
                     f"{_ratio(o_cap.get('max_concurrency'), s_cap.get('max_concurrency'))} |")
        for n in request.get("request_lens") or []:
            s_n = s_cap.get("requests_at", {}).get(str(n))
            o_n = o_cap.get("requests_at", {}).get(str(n))
            lines.append(f"| requests of {n:,} tokens that fit | {'-' if s_n is None else f'{s_n:.2f}'} | "
                         f"{'-' if o_n is None else f'{o_n:.2f}'} | {_ratio(o_n, s_n)} |")
    budget = first["budget"]
    if budget.get("kv_bytes") is not None and budget["kv_bytes"] <= 0 and budget["source"] == "budget":
        lines.append(f"\nDoes not fit: weights {_gib(budget['weights_bytes'])} + overhead {_gib(budget['overhead_bytes'])} "
                     f"exceed {_gib(budget['requested_bytes'])} ({request['gpu_mem_gib']:g} GiB x "
                     f"{request['gpu_memory_utilization']:g}); no KV cache is left on either side.")
    else:
        for name, cap in (("stock", s_cap), ("overlay", o_cap)):
            if not cap["fits"]:
                lines.append(f"\n{name}: nothing fits: {cap['why']}")
    if overlay.get("not_served"):
        lines.append("\n" + overlay["not_served"])
    if stock["vllm"].startswith("0.18") and stock["mamba_layers"] and (s_cap["fits"] or o_cap["fits"]):
        lines.append("\nvLLM 0.18 logs the pool as blocks per group x block size; 0.26 and later as max concurrency x "
                     "max-model-len, which counts the mamba state per request: the same pool reads differently.")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="the model's directory (its config.json is read; weights are not)")
    p.add_argument("--gpu-mem-gib", type=float, help="the card's memory in GiB (e.g. 64)")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--overhead-gib", type=float, default=DEFAULT_OVERHEAD_GIB,
                   help="activation peak + non-torch memory + CUDA graphs, as vLLM logs them at start-up "
                        f"(default {DEFAULT_OVERHEAD_GIB:g}; see the README)")
    p.add_argument("--weights-gib", type=float, help="the loaded weights (default: counted from the config)")
    p.add_argument("--kv-cache-memory-gib", type=float,
                   help="the KV memory itself (vLLM's --kv-cache-memory-bytes / 2^30); replaces the budget")
    p.add_argument("--language-model-only", action="store_true", help="as vLLM's flag: no vision tower")
    p.add_argument("--request-len", type=int, action="append", metavar="TOKENS",
                   help="also say how many requests of this many tokens fit (repeatable)")
    p.add_argument("--json", action="store_true", help="print both sides' results as JSON")


def main(args: argparse.Namespace) -> int:
    if args.gpu_mem_gib is None and args.kv_cache_memory_gib is None:
        print("govinda: error: give --gpu-mem-gib (or --kv-cache-memory-gib)", file=sys.stderr)
        return 2
    if not (Path(args.model_dir) / "config.json").is_file():
        print(f"govinda: error: {args.model_dir}/config.json: no such file", file=sys.stderr)
        return 2
    if not 0 < args.gpu_memory_utilization <= 1:
        print("govinda: error: --gpu-memory-utilization must be in (0, 1]", file=sys.stderr)
        return 2
    request = build_request(args)
    try:
        results = compute(request)
    except CapacityFailed as exc:
        print(f"govinda: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(results, indent=1) if args.json else render(results, request))
    return 0
