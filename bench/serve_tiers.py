#!/usr/bin/env python3
"""Tiered serving benchmark against a running OpenAI-compatible server (``/v1/completions``).

Reproduces the scoring workload: concurrency 1, input tiers of 6K / 12K / 24K tokens, 256 output
tokens, ``ignore_eos`` so every request decodes exactly ``--output-len`` tokens. Prompts are token
ids (``"prompt": [ids...]``), so no tokenizer is needed and any model works.

Prompts and prefix caching: every request of a run (warm-ups included) gets a distinct global
index ``g``, and its first two token ids spell ``g`` in base ``vocab_limit - vocab_floor``; the rest
are seeded random ids in ``[vocab_floor, vocab_limit)``. vLLM's prefix cache hashes full blocks
chained from the first one, so two prompts whose first tokens differ share no cached block:
no request can reuse another's prefill. The same seed and settings give the same prompts, so the
sides of an A/B run see identical inputs.

Output: one JSON per run, ``{"tiers": [...]}`` with one entry per input length; each entry uses the
field names of ``vllm bench serve --save-result --save-detailed`` (``completed``, ``failed``,
``output_throughput``, ``mean_ttft_ms``, ``p99_tpot_ms``, ``ttfts``, ``itls``, ...) plus
``requested_input_len``, ``requested_output_len``, ``completion_rate``, ``tpots``, ``e2els``,
``successes`` and ``cached_tokens`` (when the server reports them). Times in the lists are
seconds (as vLLM's), aggregates are milliseconds.

    python bench/serve_tiers.py --base-url http://127.0.0.1:8000 --result-file out.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, List, Optional

import aiohttp
import numpy as np

DEFAULT_INPUT_LENS = (6144, 12288, 24576)
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SCHEMA = "govinda.serve_tiers/1"


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"
    # None: ask the server's /v1/models and use the first id.
    model: Optional[str] = None
    input_lens: List[int] = field(default_factory=lambda: list(DEFAULT_INPUT_LENS))
    output_len: int = 256
    num_prompts: int = 10  # per tier
    max_concurrency: int = 1
    warmup_requests: int = 1
    warmup_input_len: Optional[int] = None  # default: the first tier's input length
    warmup_output_len: Optional[int] = None  # default: output_len
    warmup_each_tier: bool = False  # also warm up before every tier (not counted)
    seed: int = 0
    vocab_limit: int = 8000
    # Ids below this are skipped: small tokenizers put their special tokens first.
    vocab_floor: int = 100
    percentiles: List[float] = field(default_factory=lambda: list(DEFAULT_PERCENTILES))
    request_timeout_s: float = 600.0
    # With ignore_eos a request must return exactly output_len tokens; fewer counts as a failure
    # unless this is set.
    allow_short_output: bool = False
    extra_body: Dict[str, Any] = field(default_factory=dict)
    label: Optional[str] = None
    progress: bool = True

    def validate(self) -> None:
        span = self.vocab_limit - self.vocab_floor
        if span < 2:
            raise ValueError("vocab_limit must exceed vocab_floor by at least 2")
        if any(n < 2 for n in self.input_lens):
            raise ValueError("every input length must be >= 2 (two tokens carry the request index)")
        if self.output_len < 1 or self.num_prompts < 1 or self.max_concurrency < 1:
            raise ValueError("output_len, num_prompts and max_concurrency must be >= 1")


@dataclass
class RequestResult:
    """One request, with the same meaning as vLLM's RequestFuncOutput (seconds)."""

    prompt_len: int
    requested_output_len: int
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    itl: List[float] = field(default_factory=list)
    latency: float = 0.0  # start to the last token chunk, as vLLM measures E2E latency
    output_tokens: int = 0
    chunks: int = 0
    start_time: float = 0.0
    generated_text: str = ""
    cached_tokens: Optional[int] = None

    @property
    def tpot(self) -> Optional[float]:
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def log(message: str) -> None:
    print(f"[serve_tiers {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def make_prompt(global_index: int, input_len: int, seed: int, vocab_floor: int, vocab_limit: int) -> List[int]:
    """Token ids of one prompt; see the module docstring for why the first two ids encode the index."""
    span = vocab_limit - vocab_floor
    if global_index >= span * span:
        raise ValueError("too many requests for the vocabulary span to keep prompts distinct")
    head = [vocab_floor + global_index // span, vocab_floor + global_index % span]
    rng = random.Random(f"{seed}:{input_len}:{global_index}")
    return head + [rng.randrange(vocab_floor, vocab_limit) for _ in range(input_len - 2)]


async def discover_model(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(base_url.rstrip("/") + "/v1/models") as response:
        response.raise_for_status()
        payload = await response.json()
    models = payload.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    return models[0]["id"]


async def send_request(
    session: aiohttp.ClientSession,
    config: BenchConfig,
    model: str,
    prompt: List[int],
    output_len: int,
) -> RequestResult:
    result = RequestResult(prompt_len=len(prompt), requested_output_len=output_len)
    # The body `vllm bench serve` sends (sampling left at the model's defaults); add settings
    # such as temperature through extra_body.
    payload: Dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "repetition_penalty": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    payload.update(config.extra_body)
    url = config.base_url.rstrip("/") + config.endpoint
    start = time.perf_counter()
    result.start_time = start
    last_token_time = start
    text_parts: List[str] = []
    usage_tokens: Optional[int] = None
    try:
        async with session.post(url, json=payload) as response:
            if response.status != 200:
                body = (await response.text())[:300]
                result.error = f"HTTP {response.status} {response.reason}: {body}"
                return result
            async for raw_line in response.content:
                line = raw_line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators and SSE comments (pings)
                data = line[len(b"data:"):].strip()
                if data == b"[DONE]":
                    break
                message = json.loads(data)
                if message.get("error"):
                    result.error = f"server error in stream: {message['error']}"
                    return result
                choices = message.get("choices")
                if choices:
                    now = time.perf_counter()
                    if result.chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last_token_time)
                    last_token_time = now
                    result.chunks += 1
                    text_parts.append(choices[0].get("text") or "")
                usage = message.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens", usage_tokens)
                    if usage.get("prompt_tokens") is not None:
                        result.prompt_len = usage["prompt_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    if details.get("cached_tokens") is not None:
                        result.cached_tokens = details["cached_tokens"]
    except Exception as exc:  # connection reset, timeout, bad JSON: the request failed
        result.error = f"{type(exc).__name__}: {exc}"
        return result

    result.generated_text = "".join(text_parts)
    result.latency = last_token_time - start
    # Prefer the server's count (a chunk may carry several tokens); fall back to chunks.
    result.output_tokens = usage_tokens if usage_tokens is not None else result.chunks
    if result.chunks == 0:
        result.error = "stream ended without a token chunk"
    elif result.output_tokens < output_len and not config.allow_short_output:
        result.error = f"short output: {result.output_tokens} of {output_len} tokens"
    else:
        result.success = True
    return result


def _stat(values: List[float], fn) -> float:
    # vLLM reports 0 for an empty list (np.mean(values or 0)); keep that convention.
    return float(fn(values or [0.0])) * 1000.0


def _percentile_key(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def summarize_tier(
    results: List[RequestResult],
    duration_s: float,
    input_len: int,
    config: BenchConfig,
    model: str,
) -> Dict[str, Any]:
    """Aggregate one tier with vLLM's field names and formulas (calculate_metrics)."""
    ok = [r for r in results if r.success]
    output_lens = [r.output_tokens if r.success else 0 for r in results]
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(output_lens)
    ttfts = [r.ttft for r in ok]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    itls = [x for r in ok for x in r.itl]
    e2els = [r.latency for r in ok]

    tier: Dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai",
        "backend": "openai",
        "label": config.label,
        "model_id": model,
        "tokenizer_id": None,
        "num_prompts": len(results),
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": config.max_concurrency,
        "requested_input_len": input_len,
        "requested_output_len": config.output_len,
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "completion_rate": len(ok) / len(results) if results else 0.0,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else 0.0,
        "request_goodput": None,
        "output_throughput": total_output / duration_s if duration_s > 0 else 0.0,
        "total_token_throughput": (total_input + total_output) / duration_s if duration_s > 0 else 0.0,
    }
    tier.update(_peak_rates(ok))
    tier["rtfx"] = 0.0
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        tier[f"mean_{name}_ms"] = _stat(values, np.mean)
        tier[f"median_{name}_ms"] = _stat(values, np.median)
        tier[f"std_{name}_ms"] = _stat(values, np.std)
        for p in config.percentiles:
            tier[f"p{_percentile_key(p)}_{name}_ms"] = _stat(values, lambda v, p=p: np.percentile(v, p))
    tier.update(
        {
            "input_lens": [r.prompt_len for r in results],
            "output_lens": output_lens,
            "ttfts": [r.ttft for r in results],
            "itls": [r.itl for r in results],
            "tpots": [r.tpot for r in results],
            "e2els": [r.latency for r in results],
            "start_times": [r.start_time for r in results],
            "successes": [r.success for r in results],
            "cached_tokens": [r.cached_tokens for r in results],
            "generated_texts": [r.generated_text for r in results],
            "errors": [r.error for r in results],
        }
    )
    return tier


def _peak_rates(ok: List[RequestResult]) -> Dict[str, Any]:
    """Peak output tokens in any one-second bucket and peak concurrency, as vLLM computes them."""
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    first = min(r.start_time for r in ok)
    last = max(r.start_time + r.latency for r in ok)
    buckets = int(np.ceil(last - first)) + 1
    tokens = np.zeros(buckets)
    active = np.zeros(buckets)
    for r in ok:
        t = r.start_time + r.ttft
        token_times = [t]
        for gap in r.itl:
            t += gap
            token_times.append(t)
        for token_time in token_times:
            bucket = int(token_time - first)
            if 0 <= bucket < buckets:
                tokens[bucket] += 1
        for second in range(int(r.start_time - first), int(r.start_time + r.latency - first) + 1):
            active[second] += 1
    return {"max_output_tokens_per_s": float(tokens.max()), "max_concurrent_requests": int(active.max())}


def _request_record(r: RequestResult) -> Dict[str, Any]:
    record = dataclasses.asdict(r)
    record["tpot"] = r.tpot
    return record


class _Runner:
    def __init__(self, config: BenchConfig) -> None:
        self.config = config
        self.next_index = 0  # global prompt index: distinct prompts across the whole run

    def _next_prompt(self, input_len: int) -> List[int]:
        c = self.config
        prompt = make_prompt(self.next_index, input_len, c.seed, c.vocab_floor, c.vocab_limit)
        self.next_index += 1
        return prompt

    async def warm_up(self, session, model: str, input_len: int) -> List[Dict[str, Any]]:
        c = self.config
        output_len = c.warmup_output_len or c.output_len
        records = []
        for i in range(c.warmup_requests):
            if c.progress:
                log(f"warm-up {i + 1}/{c.warmup_requests}: {input_len} in, {output_len} out (not counted)")
            r = await send_request(session, c, model, self._next_prompt(input_len), output_len)
            if c.progress:
                state = "ok" if r.success else f"FAILED ({r.error[:200]})"
                log(f"warm-up {i + 1} {state}, {r.latency:.2f} s")
            records.append(_request_record(r))
        return records

    async def run_tier(self, session, model: str, input_len: int, tier_no: int, tier_count: int):
        c = self.config
        prompts = [self._next_prompt(input_len) for _ in range(c.num_prompts)]
        results: List[Optional[RequestResult]] = [None] * len(prompts)
        queue: asyncio.Queue = asyncio.Queue()
        for item in enumerate(prompts):
            queue.put_nowait(item)
        done = 0
        tier_start = time.perf_counter()

        async def worker() -> None:
            nonlocal done
            while True:
                try:
                    index, prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                r = await send_request(session, c, model, prompt, c.output_len)
                results[index] = r
                done += 1
                if c.progress:
                    elapsed = time.perf_counter() - tier_start
                    eta = elapsed / done * (len(prompts) - done)
                    if r.success:
                        tpot = r.tpot
                        detail = f"ok ttft={r.ttft * 1e3:.1f}ms tpot={(tpot or 0) * 1e3:.2f}ms out={r.output_tokens}"
                    else:
                        detail = f"FAILED {r.error[:200]}"
                    log(
                        f"tier {tier_no}/{tier_count} in={input_len} req {done}/{len(prompts)} {detail} "
                        f"(elapsed {elapsed:.0f}s, eta {eta:.0f}s)"
                    )

        await asyncio.gather(*(worker() for _ in range(min(c.max_concurrency, len(prompts)))))
        duration = time.perf_counter() - tier_start
        return summarize_tier([r for r in results if r is not None], duration, input_len, c, model)


async def run_async(config: BenchConfig) -> Dict[str, Any]:
    config.validate()
    timeout = aiohttp.ClientTimeout(total=config.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=config.max_concurrency + 1)
    output: Dict[str, Any] = {
        "schema": SCHEMA,
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "label": config.label,
        "base_url": config.base_url,
        "endpoint_type": "openai",
        "backend": "openai",
        "config": dataclasses.asdict(config),
        "warmup": [],
        "tiers": [],
    }
    runner = _Runner(config)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = config.model
        if model is None:
            model = await discover_model(session, config.base_url)
        output["model_id"] = model
        output["tokenizer_id"] = None
        first_len = config.warmup_input_len or config.input_lens[0]
        if config.warmup_requests and not config.warmup_each_tier:
            output["warmup"] += await runner.warm_up(session, model, first_len)
        for tier_no, input_len in enumerate(config.input_lens, start=1):
            if config.warmup_requests and config.warmup_each_tier:
                output["warmup"] += await runner.warm_up(session, model, config.warmup_input_len or input_len)
            if config.progress:
                log(f"tier {tier_no}/{len(config.input_lens)}: {config.num_prompts} x ({input_len} in, {config.output_len} out)")
            output["tiers"].append(
                await runner.run_tier(session, model, input_len, tier_no, len(config.input_lens))
            )
    return output


def run(config: BenchConfig) -> Dict[str, Any]:
    """Run the benchmark; returns the result dict (see the module docstring)."""
    return asyncio.run(run_async(config))


def format_summary(result: Dict[str, Any]) -> str:
    header = (
        f"{'input':>7} {'done':>7} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'TPOT p50':>9} {'TPOT p99':>9} {'ITL p99':>8} {'E2EL p99':>9}   (ms)"
    )
    lines = [f"model: {result.get('model_id')}  base_url: {result.get('base_url')}", header]
    for t in result["tiers"]:
        lines.append(
            f"{t['requested_input_len']:>7} {t['completed']:>3}/{t['num_prompts']:<3} "
            f"{t['output_throughput']:>10.2f} {t.get('p50_ttft_ms', t['median_ttft_ms']):>9.1f} "
            f"{t.get('p99_ttft_ms', float('nan')):>9.1f} {t.get('p50_tpot_ms', t['median_tpot_ms']):>9.2f} "
            f"{t.get('p99_tpot_ms', float('nan')):>9.2f} {t.get('p99_itl_ms', float('nan')):>8.2f} "
            f"{t.get('p99_e2el_ms', float('nan')):>9.1f}"
        )
    return "\n".join(lines)


def parse_int_list(text: str) -> List[int]:
    """'6144,12288' or '6K,12K,24K' (K = 1024) -> [6144, 12288]."""
    values = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        if item[-1] in "kK":
            values.append(int(float(item[:-1]) * 1024))
        else:
            values.append(int(item))
    return values


def build_arg_parser() -> argparse.ArgumentParser:
    d = BenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=d.base_url, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--endpoint", default=d.endpoint)
    p.add_argument("--model", default=None, help="model name for requests (default: first of /v1/models)")
    p.add_argument("--input-lens", type=parse_int_list, default=list(DEFAULT_INPUT_LENS),
                   help="comma list of input lengths in tokens, K = 1024 (default 6K,12K,24K)")
    p.add_argument("--output-len", type=int, default=d.output_len)
    p.add_argument("--num-prompts", type=int, default=d.num_prompts, help="requests per tier")
    p.add_argument("--max-concurrency", type=int, default=d.max_concurrency)
    p.add_argument("--warmup-requests", type=int, default=d.warmup_requests)
    p.add_argument("--warmup-input-len", type=int, default=None)
    p.add_argument("--warmup-output-len", type=int, default=None)
    p.add_argument("--warmup-each-tier", action="store_true")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--vocab-limit", type=int, default=d.vocab_limit, help="prompt ids are < this")
    p.add_argument("--vocab-floor", type=int, default=d.vocab_floor, help="prompt ids are >= this")
    p.add_argument("--percentiles", default="50,90,99", help="comma list, reported as pNN_<metric>_ms")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout_s, help="seconds per request")
    p.add_argument("--allow-short-output", action="store_true",
                   help="count a request that returns fewer than --output-len tokens as completed")
    p.add_argument("--extra-body", default="{}", help="JSON merged into every request body")
    p.add_argument("--label", default=None)
    p.add_argument("--result-file", default=None, help="write the JSON result here")
    p.add_argument("--quiet", action="store_true", help="no per-request progress on stderr")
    return p


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        base_url=args.base_url,
        endpoint=args.endpoint,
        model=args.model,
        input_lens=args.input_lens,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency,
        warmup_requests=args.warmup_requests,
        warmup_input_len=args.warmup_input_len,
        warmup_output_len=args.warmup_output_len,
        warmup_each_tier=args.warmup_each_tier,
        seed=args.seed,
        vocab_limit=args.vocab_limit,
        vocab_floor=args.vocab_floor,
        percentiles=[float(x) for x in args.percentiles.split(",") if x.strip()],
        request_timeout_s=args.request_timeout,
        allow_short_output=args.allow_short_output,
        extra_body=json.loads(args.extra_body),
        label=args.label,
        progress=not args.quiet,
    )


def main(argv: Optional[List[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    result = run(config_from_args(args))
    print(format_summary(result))
    if args.result_file:
        with open(args.result_file, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {args.result_file}")
    failed = sum(t["failed"] for t in result["tiers"])
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
