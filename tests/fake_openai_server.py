#!/usr/bin/env python3
"""A small fake of vLLM's OpenAI-compatible server for CPU tests of the benchmark tools.

Serves ``/health``, ``/v1/models`` (``id`` and ``root``, as ``vllm bench serve`` reads them) and
streaming ``/v1/completions`` (one SSE chunk per token, a final usage chunk when
``stream_options.include_usage`` is set, then ``[DONE]``), with a configurable time to first token
and per-token delay. Streamed prompts may be token ids or text (what ``vllm bench serve``'s random
dataset sends); text is counted with ``--tokenizer DIR`` (loaded as the real server loads it),
else by whitespace, and the count is the usage's ``prompt_tokens``. Failure
injection: every Nth completion request (counted from 1, warm-ups included) answers HTTP 500
(``--fail-every``) or streams only half of its tokens (``--short-every``). Debug endpoints let a
test see what the server saw: ``/debug/env`` (its environment, ``GOVINDA_*`` and the compile-cache
variables) and ``/debug/requests`` (per request: prompt kind and length, its head, max_tokens,
ignore_eos, stream options); ``--request-log FILE`` also appends each record as a JSON line, for
tests that look after the server has stopped.

Text prompts (``"prompt": "..."``, non-streaming) get a deterministic "greedy" continuation for
bench/greedy_agreement.py: token ids derived from a CRC of the prompt, text ``" w<id>"`` per token,
``choices[0].token_ids`` when ``return_token_ids`` is set (unless ``--no-token-ids``), and with
``logprobs`` the top two candidates per token keyed ``"token_id:N"`` when
``return_tokens_as_token_ids`` is set. Sides can be made to differ: ``--greedy-diverge SUB=POS``
changes every token from POS on for prompts containing SUB (the two candidates there are a near
tie, margin 0.02; elsewhere the margin is 2.0), ``--greedy-stop SUB=LEN`` ends those prompts with
EOS after LEN tokens (``finish_reason: stop``).

``prompt_logprobs: k`` (teacher-forced scoring) is answered in vLLM's shape: ``prompt_token_ids``
(one id per whitespace-separated word, ``prompt_token_id``) and one ``{"<id>": {"logprob", "rank",
"decoded_token"}}`` entry per prompt token after the first, holding the top two candidates and the
true token. The true token is the top candidate, except at every Nth position when
``--flip-prompt-every N`` is set (see ``prompt_candidates``).

Scheduler state: ``--capacity N`` runs at most N streamed requests at once (the others wait, as
in a server whose KV cache holds N), and ``/metrics`` serves vLLM's Prometheus names
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, the
counters ``vllm:num_preemptions_total`` and ``vllm:prefix_cache_hits_total``) with vLLM's labels;
``--preempt-waiting`` counts every request that had to wait as a preemption, and a streamed prompt
whose start was seen before counts its length as prefix-cache hits. ``--kv-tokens N`` prints vLLM's
start-up lines for a KV cache of N tokens (and, given ``--kv-cache-memory-bytes``, the line of a
pinned KV memory).

``--startup-phases`` prints, before listening, the start-up lines vLLM 0.26 and the overlay log
(bench/startup_phases.py reads them): the cold ones (graphs compiled, launch configs tuned) when
``$VLLM_CACHE_ROOT`` holds no artefact of an earlier start, then writes one there and in
``$GOVINDA_CACHE_DIR``; the warm ones (graphs loaded from the cache, launch configs cached) when it
finds them. A cold start with the overlay active also leaves Triton metadata of two kernels of
kernels/ in ``$TRITON_CACHE_DIR``, one written before its "Initializing a V1 LLM engine" line and
one after. The first completion request then logs vLLM's JIT-monitor warnings: one for a vLLM
kernel, and with the overlay active one for a kernel of kernels/.

Unless GOVINDA_DISABLE=1 it imitates the overlay at start-up: prints ``govinda: fake overlay
active`` (for log counting) and writes ``$GOVINDA_CACHE_DIR/counters/<pid>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import zlib

from aiohttp import web

ENV_PREFIXES = ("GOVINDA_",)
ENV_KEYS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH")
GREEDY_VOCAB_FLOOR, GREEDY_VOCAB_SPAN = 100, 5000
NEAR_TIE_MARGIN, CLEAR_MARGIN = 0.02, 2.0
TRUE_TOKEN_LOGPROB, FLIPPED_TRUE_TOKEN_LOGPROB = -0.5, -0.9


def prompt_token_id(word: str) -> int:
    return GREEDY_VOCAB_FLOOR + zlib.crc32(word.encode()) % GREEDY_VOCAB_SPAN


def prompt_candidates(true_id: int, position: int, flip_every):
    """[(id, logprob), ...] best first for a scored prompt position (1-based).

    Normally the true token leads clearly; at every ``flip_every``-th position another token
    leads by a near tie and the true token is second with a lower logprob.
    """
    other = GREEDY_VOCAB_FLOOR + (true_id - GREEDY_VOCAB_FLOOR + 1) % GREEDY_VOCAB_SPAN
    if flip_every and position % flip_every == 0:
        return [(other, FLIPPED_TRUE_TOKEN_LOGPROB + NEAR_TIE_MARGIN), (true_id, FLIPPED_TRUE_TOKEN_LOGPROB)]
    return [(true_id, TRUE_TOKEN_LOGPROB), (other, TRUE_TOKEN_LOGPROB - CLEAR_MARGIN)]


def _substring_rules(items):
    """['SUB=N', ...] -> [(SUB, N), ...]"""
    rules = []
    for item in items or []:
        sub, _, value = item.rpartition("=")
        rules.append((sub, int(value)))
    return rules


def _first_rule(rules, prompt):
    return next((value for sub, value in rules if sub in prompt), None)


def greedy_continuation(prompt: str, max_tokens: int, diverge_at, stop_after):
    """(token ids, finish_reason, per-token runner-up margins) of the fake's greedy decode."""
    seed = zlib.crc32(prompt.encode())
    count = max_tokens if stop_after is None else min(max_tokens, stop_after)
    ids = [GREEDY_VOCAB_FLOOR + (seed + 7919 * i) % GREEDY_VOCAB_SPAN for i in range(count)]
    if diverge_at is not None:
        ids[diverge_at:] = [GREEDY_VOCAB_FLOOR + (x - GREEDY_VOCAB_FLOOR + 1) % GREEDY_VOCAB_SPAN for x in ids[diverge_at:]]
    margins = [NEAR_TIE_MARGIN if i == diverge_at else CLEAR_MARGIN for i in range(count)]
    finish = "stop" if stop_after is not None and stop_after < max_tokens else "length"
    return ids, finish, margins


def load_tokenizer(directory):
    """Token counting for text prompts: the model directory's tokenizer as vLLM's server loads it
    (transformers' AutoTokenizer: transformers 5 replaces the pre-tokenizer of tokenizer.json with
    the model class's own, so the file alone would count differently), or whitespace."""
    if not directory:
        return lambda text: text.split()
    from transformers import AutoTokenizer  # a vLLM dependency

    tokenizer = AutoTokenizer.from_pretrained(directory)
    return lambda text: tokenizer.encode(text, add_special_tokens=True)


METRIC_LABELS = '{engine="0",model_name="%s"}'


def metrics_text(model: str, running: int, waiting: int, capacity: int, preemptions: int, prefix_hits: int) -> str:
    """vLLM's Prometheus page, reduced to the scheduler's gauges and counters."""
    labels = METRIC_LABELS % model
    usage = running / capacity if capacity else 0.0
    lines = []
    for name, kind, value in (("vllm:num_requests_running", "gauge", running),
                              ("vllm:num_requests_waiting", "gauge", waiting),
                              ("vllm:kv_cache_usage_perc", "gauge", usage),
                              ("vllm:num_preemptions", "counter", preemptions),
                              ("vllm:prefix_cache_hits", "counter", prefix_hits)):
        sample = name + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {sample} fake", f"# TYPE {sample} {kind}", f"{sample}{labels} {float(value)}"]
    return "\n".join(lines) + "\n"


FAKE_ARTEFACT = "fake-compiled-graph"
STARTUP_PREFIX = "(EngineCore pid=%d) INFO 12-02 04:55:01 "
JIT_WARNING = ("(EngineCore pid=%d) WARNING 12-02 04:56:40 [jit_monitor.py:135] Triton kernel JIT compilation during "
               "inference: %s. This causes a latency spike; consider extending warmup to cover this shape/config.")


def print_startup_phases(overlay: bool) -> None:
    """Cold lines when $VLLM_CACHE_ROOT has no artefact of an earlier start (then leaves one), warm ones after."""
    pid = os.getpid()
    vllm_root, govinda_root = os.environ.get("VLLM_CACHE_ROOT"), os.environ.get("GOVINDA_CACHE_DIR")
    warm = bool(vllm_root) and os.path.exists(os.path.join(vllm_root, FAKE_ARTEFACT))
    tuned = bool(govinda_root) and os.path.exists(os.path.join(govinda_root, FAKE_ARTEFACT))
    lines = ["[model_runner.py:305] Model loading took 13.13 GiB and 2.402183 seconds"]
    if warm:
        lines += ["[backends.py:293] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.512 s",
                  "[monitor.py:53] torch.compile took 3.10 s in total"]
    else:
        lines += ["[backends.py:393] Compiling a graph for compile range (1, 8192) takes 10.20 s",
                  "[monitor.py:53] torch.compile took 22.37 s in total"]
    lines.append("[model_runner.py:747] Graph capturing finished in 11 secs, took 0.53 GiB")
    lines.append("[core.py:340] init engine (profile, create kv cache, warmup model) took %s s (compilation: %s s)"
                 % (("30.50", "3.10") if warm else ("85.71", "22.37")))
    for line in lines:
        print(STARTUP_PREFIX % pid + line, flush=True)
    if overlay and not tuned:
        compile_like_the_overlay(pid)
    if overlay:
        print(f"(EngineCore pid={pid}) govinda INFO [pid {pid}] kernel self-test passed on fake-device ({{'none': ...}})", flush=True)
        shape = "d128-q32-kv8-b16-bf16"
        if tuned:
            origin = "cached"
        else:
            print(f"govinda INFO [pid {pid + 1}] tune: chose decode m16n64w4s1 pps 4/8, prefill m128n64w8s3 "
                  "(21/21 candidates usable, 24.8 s)", flush=True)
            origin = "tuned in 24.8 s"
        print(f"(EngineCore pid={pid}) govinda INFO [pid {pid}] INT8 attention launch configs for {shape}: "
              f"tuned ({origin}) decode m16n64w4s1 pps 4/8, prefill m128n64w8s3; 21/21 candidates usable, 24.8 s", flush=True)
    for root in (vllm_root, govinda_root if overlay else None):
        if root:
            os.makedirs(root, exist_ok=True)
            with open(os.path.join(root, FAKE_ARTEFACT), "w") as f:
                f.write("compiled\n")


def _triton_metadata(subdir: str, kernel: str, divisible_stride: bool = True) -> None:
    """A compile's metadata and the ``tt.func`` line of its .ttir, as Triton 3.6 writes them."""
    directory = os.path.join(os.environ["TRITON_CACHE_DIR"], subdir)
    os.makedirs(directory, exist_ok=True)
    stride = "i32 {tt.divisibility = 16 : i32}" if divisible_stride else "i32"
    with open(os.path.join(directory, f"{kernel}.ttir"), "w") as f:
        f.write(f'module {{\n  tt.func public @{kernel}(%cache_ptr: !tt.ptr<i8> {{tt.divisibility = 16 : i32}} '
                f'loc("cache_ptr"(#loc)), %stride_block: {stride} loc("stride_block"(#loc))) attributes {{noinline = false}} {{\n')
    with open(os.path.join(directory, f"{kernel}.json"), "w") as f:
        f.write(json.dumps({"name": kernel, "num_warps": 4, "num_stages": 1}) + "\n")


def compile_like_the_overlay(pid: int) -> None:
    """A cold start's Triton cache as the overlay leaves it (bench/startup_compiles.py reads it): two of
    our kernels compiled before the engine's start line (the background process), one after it (the
    engine, the gather kernel again with one argument specialized otherwise), and files that are not
    such metadata. The start line carries the real local time: it is printed once the second of the
    first compiles is over, so the stamp falls between them."""
    if not os.environ.get("TRITON_CACHE_DIR"):
        return
    _triton_metadata("background", "_store_kv_int8_kernel")
    time.sleep(0.05)  # file times have a clock tick's resolution: keep the two compiles in order
    _triton_metadata("background-gather", "_gather_kv_kernel", divisible_stride=False)
    _triton_metadata("background", "__grp___store_kv_int8_kernel")
    _triton_metadata("inductor", "triton_poi_fused_add_0")
    time.sleep(1.05 - time.time() % 1.0)
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(EngineCore pid={pid}) INFO {stamp} [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config: fake",
          flush=True)
    _triton_metadata("engine", "_gather_kv_kernel")


def print_jit_warnings(overlay: bool) -> None:
    for kernel in ("_compute_slot_mapping_kernel",) + (("_gather_kv_kernel",) if overlay else ()):
        print(JIT_WARNING % (os.getpid(), kernel), flush=True)


def build_app(args: argparse.Namespace) -> web.Application:
    state = {"count": 0, "requests": [], "running": 0, "waiting": 0, "preemptions": 0, "prefix_hits": 0,
             "heads": set()}
    slots = asyncio.Semaphore(args.capacity) if args.capacity else None
    count_tokens = load_tokenizer(args.tokenizer)

    def remember(record) -> None:
        state["requests"].append(record)
        if args.request_log:
            with open(args.request_log, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": args.model, "object": "model", "root": args.model_root or args.model}]}
        )

    async def debug_env(_request: web.Request) -> web.Response:
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_KEYS}
        return web.json_response({"pid": os.getpid(), "env": env})

    async def debug_requests(_request: web.Request) -> web.Response:
        return web.json_response(state["requests"])

    async def metrics(_request: web.Request) -> web.Response:
        text = metrics_text(args.model, state["running"], state["waiting"], args.capacity, state["preemptions"],
                            state["prefix_hits"])
        return web.Response(text=text, content_type="text/plain")

    async def completions(request: web.Request) -> web.StreamResponse:
        state["count"] += 1
        number = state["count"]
        if args.startup_phases and number == 1:
            print_jit_warnings(os.environ.get("GOVINDA_DISABLE") != "1")
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, str) and not body.get("stream"):
            return greedy_response(number, body)
        if isinstance(prompt, str):
            prompt_ids = count_tokens(prompt)
            record = {"prompt_kind": "text", "prompt_head": prompt[:64]}
        elif isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
            prompt_ids = prompt
            record = {"prompt_kind": "ids", "first_ids": prompt[:4],
                      "max_id": max(prompt) if prompt else None, "min_id": min(prompt) if prompt else None}
        else:
            return web.json_response({"error": "prompt must be text or a list of token ids"}, status=400)
        max_tokens = int(body.get("max_tokens", 16))
        failed = bool(args.fail_every and number % args.fail_every == 0)
        record.update(
            number=number,
            prompt_len=len(prompt_ids),
            max_tokens=max_tokens,
            ignore_eos=body.get("ignore_eos"),
            stream=body.get("stream"),
            include_usage=(body.get("stream_options") or {}).get("include_usage"),
            injected_failure=failed,
        )
        remember(record)
        if failed:
            return web.json_response({"error": "injected failure"}, status=500)
        tokens = max_tokens // 2 if args.short_every and number % args.short_every == 0 else max_tokens
        head = str(prompt)[:64]
        if head in state["heads"]:
            state["prefix_hits"] += len(prompt_ids)
        state["heads"].add(head)

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if slots is not None and slots.locked():
            state["waiting"] += 1
            if args.preempt_waiting:
                state["preemptions"] += 1
            await slots.acquire()
            state["waiting"] -= 1
        elif slots is not None:
            await slots.acquire()
        state["running"] += 1
        try:
            await stream_tokens(response, body, number, prompt_ids, tokens)
        finally:
            state["running"] -= 1
            if slots is not None:
                slots.release()
        return response

    async def stream_tokens(response, body, number: int, prompt_ids, tokens: int) -> None:
        created = int(time.time())

        async def send(payload) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        await asyncio.sleep(args.ttft + args.ttft_per_token * len(prompt_ids))
        for i in range(tokens):
            if i:
                await asyncio.sleep(args.token_delay)
            await send(
                {
                    "id": f"cmpl-{number}",
                    "object": "text_completion",
                    "created": created,
                    "model": args.model,
                    "choices": [
                        {
                            "index": 0,
                            "text": f" t{i}",
                            "finish_reason": "length" if i == tokens - 1 else None,
                        }
                    ],
                }
            )
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(
                {
                    "id": f"cmpl-{number}",
                    "object": "text_completion",
                    "created": created,
                    "model": args.model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": len(prompt_ids),
                        "completion_tokens": tokens,
                        "total_tokens": len(prompt_ids) + tokens,
                    },
                }
            )
        await send("[DONE]")
        await response.write_eof()

    diverge_rules = _substring_rules(args.greedy_diverge)
    stop_rules = _substring_rules(args.greedy_stop)

    def greedy_response(number: int, body) -> web.Response:
        prompt = body["prompt"]
        max_tokens = int(body.get("max_tokens", 16))
        remember(
            {
                "number": number,
                "prompt": prompt,
                **{key: body.get(key) for key in ("max_tokens", "temperature", "logprobs", "return_token_ids",
                                                  "return_tokens_as_token_ids", "stream", "ignore_eos",
                                                  "prompt_logprobs")},
            }
        )
        if args.fail_every and number % args.fail_every == 0:
            return web.json_response({"error": "injected failure"}, status=500)
        ids, finish, margins = greedy_continuation(
            prompt, max_tokens, _first_rule(diverge_rules, prompt), _first_rule(stop_rules, prompt)
        )
        choice = {"index": 0, "text": "".join(f" w{i}" for i in ids), "finish_reason": finish}
        if body.get("return_token_ids") and not args.no_token_ids:
            choice["token_ids"] = ids
        if body.get("prompt_logprobs"):
            prompt_ids = [prompt_token_id(word) for word in prompt.split()]
            if body.get("return_token_ids"):
                choice["prompt_token_ids"] = prompt_ids
            entries = [None]
            for position, true_id in enumerate(prompt_ids[1:], start=1):
                ranked = prompt_candidates(true_id, position, args.flip_prompt_every)
                entry = {str(tid): {"logprob": lp, "rank": rank, "decoded_token": f" w{tid}"}
                         for rank, (tid, lp) in enumerate(ranked, start=1)}
                entries.append(entry)
            choice["prompt_logprobs"] = entries
        if body.get("logprobs"):
            as_ids = bool(body.get("return_tokens_as_token_ids"))

            def name(token_id: int) -> str:
                return f"token_id:{token_id}" if as_ids else f" w{token_id}"

            runner_up = [GREEDY_VOCAB_FLOOR + (x - GREEDY_VOCAB_FLOOR + 2) % GREEDY_VOCAB_SPAN for x in ids]
            starts = [len("".join(f" w{i}" for i in ids[:k])) for k in range(len(ids))]
            choice["logprobs"] = {
                "text_offset": starts,
                "tokens": [name(i) for i in ids],
                "token_logprobs": [-0.1] * len(ids),
                "top_logprobs": [{name(i): -0.1, name(r): -0.1 - m} for i, r, m in zip(ids, runner_up, margins)],
            }
        return web.json_response(
            {
                "id": f"cmpl-{number}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": args.model,
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(ids),
                          "total_tokens": len(prompt.split()) + len(ids)},
            }
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/debug/env", debug_env)
    app.router.add_get("/debug/requests", debug_requests)
    app.router.add_get("/metrics", metrics)
    return app


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="fake OpenAI-compatible streaming server for tests")
    # Accepts both "MODEL PORT" (bench/ab.py's launcher contract) and vLLM's
    # "serve MODEL --port PORT" (so the start scripts can launch it through GOVINDA_VLLM_CMD).
    p.add_argument("words", nargs="*", help="[serve] [MODEL [PORT]]")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--ttft", type=float, default=0.05, help="seconds before the first token")
    p.add_argument("--ttft-per-token", type=float, default=0.0, help="extra seconds per prompt token")
    p.add_argument("--token-delay", type=float, default=0.01, help="seconds between tokens")
    p.add_argument("--fail-every", type=int, default=0, help="HTTP 500 on every Nth request")
    p.add_argument("--short-every", type=int, default=0, help="half the tokens on every Nth request")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds before listening")
    p.add_argument("--greedy-diverge", action="append", metavar="SUB=POS",
                   help="text prompts containing SUB: every token from POS on differs")
    p.add_argument("--greedy-stop", action="append", metavar="SUB=LEN",
                   help="text prompts containing SUB: EOS after LEN tokens")
    p.add_argument("--no-token-ids", action="store_true", help="ignore return_token_ids (ids only via logprobs)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="count text prompts with the tokenizer in DIR (default: whitespace words)")
    p.add_argument("--model-root", default=None, help="/v1/models root (default: the model name)")
    p.add_argument("--request-log", default=None, metavar="FILE", help="append every request record as a JSON line")
    p.add_argument("--flip-prompt-every", type=int, default=0, metavar="N",
                   help="prompt_logprobs: another token leads at every Nth position")
    p.add_argument("--capacity", type=int, default=0, metavar="N", help="at most N streamed requests run at once")
    p.add_argument("--preempt-waiting", action="store_true", help="count each request that waited as a preemption")
    p.add_argument("--kv-tokens", type=int, default=0, metavar="N", help="log vLLM's KV-cache size lines for N tokens")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="as vLLM's (logged, like vLLM's line)")
    p.add_argument("--startup-phases", action="store_true",
                   help="log vLLM's and the overlay's start-up lines (cold or warm by the caches) and JIT warnings")
    args, unknown = p.parse_known_args(argv)
    words = list(args.words)
    if words and words[0] == "serve":
        words.pop(0)
    args.model = words[0] if words else "fake-model"
    if args.port is None:
        args.port = int(words[1]) if len(words) > 1 else 8000
    if unknown:
        # Stand-in for vLLM flags (e.g. --max-model-len) passed by the start scripts.
        print(f"fake server: ignoring flags {unknown}", flush=True)
    if os.environ.get("GOVINDA_DISABLE") != "1":
        print("govinda: fake overlay active", flush=True)
        # Like the overlay's dispatch counters: $GOVINDA_CACHE_DIR/counters/<pid>.json
        if os.environ.get("GOVINDA_CACHE_DIR"):
            counters = os.path.join(os.environ["GOVINDA_CACHE_DIR"], "counters")
            os.makedirs(counters, exist_ok=True)
            with open(os.path.join(counters, f"{os.getpid()}.json"), "w") as f:
                json.dump({"pid": os.getpid(), "time": time.time(), "counters": {"fake_decode": 1}}, f)
    if args.kv_cache_memory_bytes:
        print(f"INFO [gpu_worker.py:469] Initial free memory 130.00 GiB, reserved "
              f"{args.kv_cache_memory_bytes / 2**30:.2f} GiB memory for KV Cache as specified by kv_cache_memory_bytes "
              "config and skipped memory profiling.", flush=True)
    if args.kv_tokens:
        print(f"INFO [kv_cache_utils.py:2177] GPU KV cache size: {args.kv_tokens:,} tokens", flush=True)
        print(f"INFO [kv_cache_utils.py:2178] Maximum concurrency for 32,768 tokens per request: "
              f"{args.kv_tokens / 32768:.2f}x", flush=True)
    if args.startup_phases:
        print_startup_phases(os.environ.get("GOVINDA_DISABLE") != "1")
    time.sleep(args.startup_delay)
    print(f"fake server: pid {os.getpid()} on {args.host}:{args.port}", flush=True)
    web.run_app(build_app(args), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    sys.exit(main())
