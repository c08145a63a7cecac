"""Keys and writes for the on-disk caches (self-test verdicts, tuned launch configs) that every
process and tensor-parallel rank of a server shares.

A key names the GPU *model* a process runs kernels on, not the board: ranks on GPUs of one model
share one self-test and one tuning run (one child at a time, under the cache's lock), while a rank
on another model (a mixed node, another host sharing the home directory) gets entries of its own.
Entries are written to a temporary file and renamed into place, so no reader ever sees half an
entry, even one that does not take the lock (``tune --cached``, a host whose NFS ignores flock).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Optional

from .cache_files import write_atomically


def current_device_index() -> Optional[int]:
    """The device this process already runs on (a vLLM worker after its device init), or None
    when it has no GPU context yet (API server, engine core): never creates one."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            return int(cuda.current_device())
    except Exception:  # a broken driver must not stop the decision; the default key still works
        return None
    return None


def device_model(index: int) -> str:
    """What the kernels' correctness and speed depend on: name, architecture, compute units."""
    import torch

    props = torch.cuda.get_device_properties(index)
    arch = getattr(props, "gcnArchName", "") or f"sm_{props.major}{props.minor}"
    return f"{props.name}|{arch}|cc{props.major}.{props.minor}|{props.multi_processor_count}cu"


def device_key(index: Optional[int]) -> str:
    if index is None:
        # A process without a device tests the default one (first visible) of this host.
        return f"default device|{socket.gethostname()}|order={os.environ.get('CUDA_DEVICE_ORDER', '')}"
    return device_model(index)


def write_json_atomically(path: Path, data) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file in the same directory."""
    write_atomically(path, json.dumps(data))
