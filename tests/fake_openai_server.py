#!/usr/bin/env python3
"""A small fake of vLLM's OpenAI-compatible server for CPU tests of the benchmark tools.

Serves ``/health``, ``/v1/models`` and streaming ``/v1/completions`` (one SSE chunk per token,
a final usage chunk when ``stream_options.include_usage`` is set, then ``[DONE]``), with a
configurable time to first token and per-token delay. Failure injection: every Nth completion
request (counted from 1, warm-ups included) answers HTTP 500 (``--fail-every``) or streams only
half of its tokens (``--short-every``). Debug endpoints let a test see what the server saw:
``/debug/env`` (its environment, ``GOVINDA_*`` and the compile-cache variables) and
``/debug/requests`` (per request: prompt length, first ids, max id, max_tokens, ignore_eos).

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

from aiohttp import web

ENV_PREFIXES = ("GOVINDA_",)
ENV_KEYS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH")


def build_app(args: argparse.Namespace) -> web.Application:
    state = {"count": 0, "requests": []}

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": args.model, "object": "model"}]})

    async def debug_env(_request: web.Request) -> web.Response:
        env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_KEYS}
        return web.json_response({"pid": os.getpid(), "env": env})

    async def debug_requests(_request: web.Request) -> web.Response:
        return web.json_response(state["requests"])

    async def completions(request: web.Request) -> web.StreamResponse:
        state["count"] += 1
        number = state["count"]
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(x, int) for x in prompt):
            return web.json_response({"error": "this fake only takes token-id prompts"}, status=400)
        max_tokens = int(body.get("max_tokens", 16))
        state["requests"].append(
            {
                "number": number,
                "prompt_len": len(prompt),
                "first_ids": prompt[:4],
                "max_id": max(prompt) if prompt else None,
                "min_id": min(prompt) if prompt else None,
                "max_tokens": max_tokens,
                "ignore_eos": body.get("ignore_eos"),
                "stream": body.get("stream"),
            }
        )
        if args.fail_every and number % args.fail_every == 0:
            return web.json_response({"error": "injected failure"}, status=500)
        tokens = max_tokens // 2 if args.short_every and number % args.short_every == 0 else max_tokens

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = int(time.time())

        async def send(payload) -> None:
            data = payload if isinstance(payload, str) else json.dumps(payload)
            await response.write(f"data: {data}\n\n".encode())

        await asyncio.sleep(args.ttft + args.ttft_per_token * len(prompt))
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
                        "prompt_tokens": len(prompt),
                        "completion_tokens": tokens,
                        "total_tokens": len(prompt) + tokens,
                    },
                }
            )
        await send("[DONE]")
        await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/debug/env", debug_env)
    app.router.add_get("/debug/requests", debug_requests)
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
    time.sleep(args.startup_delay)
    print(f"fake server: pid {os.getpid()} on {args.host}:{args.port}", flush=True)
    web.run_app(build_app(args), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    sys.exit(main())
