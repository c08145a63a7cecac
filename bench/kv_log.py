"""What a vLLM server logged at start-up about its KV cache: capacity, memory, the overlay's pages.

Lines read (vLLM 0.18.1 / 0.26 / 0.33 and the overlay; the first match of each counts):
  ``GPU KV cache size: 2,010,644 tokens``
  ``Maximum concurrency for 32,768 tokens per request: 61.36x``
  ``Available KV cache memory: 73.81 GiB``               (memory profiled)
  ``reserved 2.62 GiB memory for KV Cache as specified by kv_cache_memory_bytes``   (memory pinned)
  ``Model loading took 50.22 GiB``
  ``govinda INFO ... INT8 KV cache for 16 layers: block_size=1552 tokens, page=3228160 B``
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, Optional

PATTERNS = {
    "tokens": (re.compile(r"GPU KV cache size: ([\d,]+) tokens"), lambda m: int(m.group(1).replace(",", ""))),
    "max_concurrency": (re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"),
                        lambda m: {"max_model_len": int(m.group(1).replace(",", "")), "requests": float(m.group(2))}),
    "available_gib": (re.compile(r"Available KV cache memory: ([\d.]+) GiB"), lambda m: float(m.group(1))),
    "reserved_gib": (re.compile(r"reserved ([\d.]+) GiB memory for KV Cache"), lambda m: float(m.group(1))),
    "weights_gib": (re.compile(r"Model loading took ([\d.]+) GiB"), lambda m: float(m.group(1))),
    "int8_pages": (re.compile(r"INT8 KV cache for (\d+) layers: block_size=(\d+) tokens, page=(\d+) B"),
                   lambda m: {"layers": int(m.group(1)), "block_size": int(m.group(2)), "page_bytes": int(m.group(3))}),
}


def kv_cache_facts(text: str) -> Dict[str, Any]:
    """The facts found in a server log's text (keys of PATTERNS; missing when not logged)."""
    facts: Dict[str, Any] = {}
    for key, (regex, value) in PATTERNS.items():
        match = regex.search(text)
        if match:
            facts[key] = value(match)
    return facts


def read_kv_cache_facts(log_path: Path) -> Optional[Dict[str, Any]]:
    try:
        return kv_cache_facts(Path(log_path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
