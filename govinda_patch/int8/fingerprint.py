"""A digest of the kernel sources: part of every key that must change when a kernel does.

The self-test verdicts and tuned launch configs (``selftest._cache_key``) and the compile-cache
patch (vLLM's torch.compile key) both mix it in, so a kernel edit invalidates all of them alike.
"""

from __future__ import annotations

import hashlib

from ..kernel_package import KERNELS_DIR


def kernel_sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(KERNELS_DIR.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
