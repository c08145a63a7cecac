"""Keys that must change when a kernel, the stack or the machine does.

``kernel_sources_digest`` is mixed into vLLM's torch.compile key (the compile-cache patch) and
into ``machine_key``, which keys what is measured on one machine and cached on disk: the self-test
verdicts and the tuned launch configs. So a kernel edit invalidates all of them alike.
"""

from __future__ import annotations

import hashlib
import os

from ..kernel_package import KERNELS_DIR
from ..settings import kv_rotation, prefill_kernel
from ..versions import stack_versions


def kernel_sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(KERNELS_DIR.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def machine_key(device: str) -> str:
    """The key of a verdict measured on ``device`` (a device model label) with this stack."""
    versions = stack_versions()
    parts = [
        device,
        kernel_sources_digest(),
        str(versions.get("torch")),
        str(versions.get("triton")),
        os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        os.environ.get("HIP_VISIBLE_DEVICES", ""),
        os.environ.get("TRITON_INTERPRET", ""),
        kv_rotation(),
        prefill_kernel(),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]
