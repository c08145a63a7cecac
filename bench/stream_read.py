#!/usr/bin/env python3
"""Streaming-read bandwidth of this GPU: the yardstick of the kernel benches' "% of streaming read".

A decode reads its KV cache once and writes almost nothing, so its effective bandwidth is best
compared with what a kernel that only reads achieves on the same device, in the same run (a
device-to-device copy also writes, and a vendor's peak figure is never reached). This kernel
reads a large buffer once with 16-byte loads, many programs in flight, and folds it to one
number per program so that nothing is optimised away. The same Triton code runs on NVIDIA and
AMD, so the fraction means the same on a DCU.

    python3 -m bench.stream_read            # prints GB/s (CUDA graph replays, L2 flushed)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, Optional, Sequence

import torch
import triton
import triton.language as tl

BLOCK_BYTES = 16384  # bytes per program and step: 16 B per thread with 4 warps x 8 steps in flight
NUM_WARPS = 4


@triton.jit
def _stream_read_kernel(src_ptr, sink_ptr, num_words, WORDS_PER_PROGRAM: tl.constexpr, BLOCK_WORDS: tl.constexpr):
    """Sum (as int32 xor) ``WORDS_PER_PROGRAM`` int32 words starting at this program's share."""
    start = tl.program_id(0).to(tl.int64) * WORDS_PER_PROGRAM
    acc = tl.zeros([BLOCK_WORDS], dtype=tl.int32)
    for offset in range(0, WORDS_PER_PROGRAM, BLOCK_WORDS):
        index = start + offset + tl.arange(0, BLOCK_WORDS)
        acc ^= tl.load(src_ptr + index, mask=index < num_words, other=0)
    tl.store(sink_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


def stream_read_callable(device, nbytes: int, programs_per_sm: int = 8):
    """``(fn, bytes_read)``: ``fn()`` reads ``nbytes`` of a fresh buffer on ``device`` once."""
    words = nbytes // 4
    block_words = BLOCK_BYTES // 4
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    programs = programs_per_sm * sms
    per_program = -(-words // programs)
    per_program = -(-per_program // block_words) * block_words
    programs = -(-words // per_program)
    src = torch.full((words,), 7, dtype=torch.int32, device=device)
    sink = torch.empty(programs, dtype=torch.int32, device=device)

    def fn():
        _stream_read_kernel[(programs,)](src, sink, words, WORDS_PER_PROGRAM=per_program, BLOCK_WORDS=block_words,
                                         num_warps=NUM_WARPS)

    return fn, words * 4


def measure(timer, device, nbytes: int = 1 << 30, rep_ms: float = 30.0) -> Dict[str, Any]:
    """Streaming-read bandwidth through ``timer`` (bench.kernel_core.timing.Timer): best over a
    few program counts, CUDA-graph replays with the L2 flushed."""
    results = []
    for programs_per_sm in (4, 8, 16):
        fn, nread = stream_read_callable(device, nbytes, programs_per_sm)
        stats = timer.graph(fn, rep_ms)
        gbps = nread / (stats["median_us"] * 1e-6) / 1e9
        results.append({"programs_per_sm": programs_per_sm, "timing": stats, "read_GBps": gbps})
        del fn
        torch.cuda.empty_cache()
    best = max(results, key=lambda r: r["read_GBps"])
    return {"status": "ok", "bytes_read": nbytes, "stream_read_GBps": best["read_GBps"], "runs": results}


def main(argv: Optional[Sequence[str]] = None) -> int:
    from bench.kernel_core.timing import Timer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="buffer size in GiB")
    args = parser.parse_args(argv)
    result = measure(Timer(False, 10.0), torch.device("cuda"), int(args.gib * 2**30))
    print(json.dumps({"stream_read_GBps": round(result["stream_read_GBps"], 1),
                      "runs": [{k: r[k] for k in ("programs_per_sm", "read_GBps")} for r in result["runs"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
