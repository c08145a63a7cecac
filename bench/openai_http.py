"""The one HTTP core of our own OpenAI-API clients (greedy agreement, teacher-forced scoring, the
A/B runner's health check): JSON over urllib, never through a proxy (the servers are local).

urllib rather than aiohttp: these clients send one request at a time and wait for its answer (the
greedy comparison must not batch), so an event loop buys nothing, and the standard library needs
no declaration. aiohttp remains only where something serves: the tests' fake OpenAI server.

Timing benchmarks do not go through here: they run ``vllm bench serve`` (bench/serve_tiers.py).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Optional

_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, payload: Optional[Dict[str, Any]], timeout_s: float) -> Dict[str, Any]:
    """GET (payload None) or POST JSON; an HTTP error raises RuntimeError with the body's start."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with _NO_PROXY_OPENER.open(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:300]
        raise RuntimeError(f"HTTP {exc.code} {exc.reason}: {body}") from None


def discover_model(base_url: str, timeout_s: float = 30.0) -> str:
    """The first model id the server lists (what `vllm bench serve` uses without --model)."""
    models = http_json(base_url.rstrip("/") + "/v1/models", None, timeout_s).get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model")
    return models[0]["id"]


def health_ok(host: str, port: int) -> bool:
    try:
        with _NO_PROXY_OPENER.open(f"http://{host}:{port}/health", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False
