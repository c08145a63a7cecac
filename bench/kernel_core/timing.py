"""How the kernel benches time a call: CUDA-graph replays, eager calls (both through
``triton.testing.do_bench`` with the L2 flushed) and back-to-back eager loops."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Sequence


class Timer:
    """``triton.testing.do_bench`` (L2 flushed before every rep, CUDA events around each call)."""

    def __init__(self, smoke: bool, warmup_ms: float):
        self.smoke = smoke
        self.warmup_ms = warmup_ms

    @staticmethod
    def _summary(times_ms: Sequence[float]) -> Dict[str, Any]:
        ordered = sorted(times_ms)
        n = len(ordered)

        def quantile(q: float) -> float:
            return ordered[min(n - 1, max(0, int(round(q * (n - 1)))))]

        return {
            "median_us": 1e3 * quantile(0.5),
            "p20_us": 1e3 * quantile(0.2),
            "p80_us": 1e3 * quantile(0.8),
            "min_us": 1e3 * ordered[0],
            "reps": n,
        }

    def eager(self, fn: Callable[[], None], rep_ms: float) -> Dict[str, Any]:
        if self.smoke:
            fn()
            return {"median_us": None, "note": "smoke: ran once under TRITON_INTERPRET, not timed"}
        import triton.testing

        times = triton.testing.do_bench(fn, warmup=self.warmup_ms, rep=rep_ms, return_mode="all")
        return self._summary(times)

    def loop(self, fn: Callable[[], None], rep_ms: float, calls: int = 200) -> Dict[str, Any]:
        """Per-call time of back-to-back eager calls: L2 stays warm, and when the host cannot
        launch as fast as the GPU runs, the Python/launch overhead shows (as in vLLM's eager and
        piecewise-graph steps, where attention runs outside the graph)."""
        if self.smoke:
            return {"median_us": None, "note": "smoke: not timed"}
        import torch

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        wall = time.perf_counter()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        host_us = (time.perf_counter() - wall) * 1e6 / calls
        torch.cuda.synchronize()
        per_call_us = 1e3 * start.elapsed_time(end) / calls
        return {"median_us": per_call_us, "host_launch_us_per_call": host_us, "calls": calls}

    # Back-to-back calls of the loop mode (fewer for long prefills, --fa3).
    loop_calls = 200

    def measure(self, mode: str, fn: Callable[[], None], rep_ms: float) -> Dict[str, Any]:
        if mode == "loop":
            return self.loop(fn, rep_ms, calls=self.loop_calls)
        return {"graph": self.graph, "eager": self.eager}[mode](fn, rep_ms)

    def graph(self, fn: Callable[[], None], rep_ms: float) -> Dict[str, Any]:
        if self.smoke:
            return {"median_us": None, "note": "smoke: no CUDA graphs on the CPU"}
        import torch
        import triton.testing

        # Warm up (compiles the Triton kernels) on a side stream, then capture, as vLLM does.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        times = triton.testing.do_bench(graph.replay, warmup=self.warmup_ms, rep=rep_ms, return_mode="all")
        del graph
        return self._summary(times)
