"""The server's scheduler state while a tier runs, sampled from its Prometheus ``/metrics``.

vLLM's names (``vllm/v1/metrics/loggers.py``, the same in 0.18.1, 0.26 and 0.33): the gauges
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``
(0..1), and the counters ``vllm:num_preemptions`` and ``vllm:prefix_cache_hits`` (tokens), exposed
with a ``_total`` suffix. Samples are summed over their label sets (one per engine). A prefix-cache
hit during a tier means two random prompts happened to share a start (the synthetic tokenizer's
vocabulary is small): that request's TTFT is then lower than a cold one. The text format is parsed with
prometheus_client (a vLLM dependency).

A tier is *KV-limited* for a side when the server preempted a request during it, or never had
all of the client's concurrent requests running at once: the client keeps ``concurrency``
requests in flight, so a server with room for them all runs them all (chunked prefill admits a
waiting request within a few steps); ``num_requests_waiting`` alone is no sign, since a request
also waits for its first prefill chunk while the KV cache has room. One case reads as KV-limited
without being so: admitting every request takes longer than one request's decode (long prompts at
high concurrency, each prefill after the last), so the first finish before the last start; the KV
use column and the sides' capacities tell the two apart.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = ("vllm:num_preemptions_total", "vllm:num_preemptions")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
COLUMNS = ("running", "waiting", "kv_usage", "preemptions", "prefix_hits")
SERIES_KEPT = 4000  # samples kept per tier (at 0.5 s: over half an hour)
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse(text: str) -> Dict[str, float]:
    """{running, waiting, kv_usage, preemptions, prefix_hits} from a /metrics page (absent names:
    missing keys)."""
    wanted = {RUNNING: "running", WAITING: "waiting", KV_USAGE: "kv_usage"}
    wanted.update({name: "preemptions" for name in PREEMPTIONS})
    wanted.update({name: "prefix_hits" for name in PREFIX_HITS})
    values: Dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None:
                values[key] = values.get(key, 0.0) + float(sample.value)
    return values


def fetch(base_url: str, timeout_s: float = 5.0) -> Dict[str, float]:
    with _NO_PROXY.open(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as response:
        return parse(response.read().decode("utf-8", errors="replace"))


class Sampler:
    """Polls /metrics in a thread from start() to stop(); stop() returns the tier's summary."""

    def __init__(self, base_url: str, interval_s: float = 0.5):
        self.base_url = base_url
        self.interval_s = interval_s
        self.series: List[List[float]] = []  # [seconds since start, *COLUMNS]
        self.errors: List[str] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started = 0.0

    def _sample(self) -> None:
        try:
            values = fetch(self.base_url)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if len(self.errors) < 5:
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        if len(self.series) < SERIES_KEPT:
            self.series.append([round(time.monotonic() - self._started, 2)] +
                               [values.get(k) for k in COLUMNS])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> "Sampler":
        self._started = time.monotonic()
        self._sample()  # the counter's value before the tier
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._sample()  # the counter's value after the tier
        return summarize(self.series, self.errors, self.interval_s)


def _column(series: List[List[float]], index: int) -> List[float]:
    return [row[index] for row in series if row[index] is not None]


def summarize(series: List[List[float]], errors: List[str], interval_s: float) -> Dict[str, Any]:
    running, waiting, usage, preempted, hits = (_column(series, i) for i in range(1, 1 + len(COLUMNS)))
    return {
        "samples": len(series),
        "interval_s": interval_s,
        "max_running": max(running) if running else None,
        "max_waiting": max(waiting) if waiting else None,
        "max_kv_usage": max(usage) if usage else None,
        "mean_kv_usage": sum(usage) / len(usage) if usage else None,
        "preemptions": (preempted[-1] - preempted[0]) if len(preempted) >= 2 else None,
        "prefix_cache_hit_tokens": (hits[-1] - hits[0]) if len(hits) >= 2 else None,
        "columns": ["t_s", *COLUMNS],
        "errors": errors,
        "series": series,
    }


def kv_limited(metrics: Optional[Dict[str, Any]], concurrency: int) -> Optional[bool]:
    """True: the tier preempted or never ran all concurrent requests at once; None: not sampled."""
    if not metrics or metrics.get("max_running") is None:
        return None
    if metrics.get("preemptions"):
        return True
    return metrics["max_running"] < concurrency
