"""What the kernel benches write: log lines, error records, bandwidth fields, JSON files and
the run's environment metadata."""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Optional

START = time.time()  # log lines and --time-budget-s count from here


def log(message: str) -> None:
    print(f"[{time.time() - START:7.1f}s] {message}", flush=True)


def error_record(error: BaseException) -> Dict[str, Any]:
    return {
        "status": "error",
        "error": f"{type(error).__name__}: {error}",
        "traceback": traceback.format_exc(limit=12),
    }


def bandwidth_fields(
    copy_bw_gbps: Optional[float], time_us: Optional[float], bytes_read: int, bytes_written: int = 0
) -> Dict[str, Any]:
    """Effective bandwidths of a timed call, and their fractions of the measured copy bandwidth."""
    fields: Dict[str, Any] = {"bytes_read": bytes_read, "bytes_written": bytes_written}
    if time_us:
        read_bw = bytes_read / (time_us * 1e-6) / 1e9
        fields["eff_bw_read_GBps"] = read_bw
        fields["eff_bw_read_write_GBps"] = (bytes_read + bytes_written) / (time_us * 1e-6) / 1e9
        if copy_bw_gbps:
            fields["frac_of_copy_bw"] = read_bw / copy_bw_gbps
            fields["frac_rw_of_copy_bw"] = fields["eff_bw_read_write_GBps"] / copy_bw_gbps
    return fields


def write_json(path: Path, payload: Dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(payload, indent=2, default=str))
    temporary.replace(path)


def environment_metadata(smoke: bool, script: str) -> Dict[str, Any]:
    meta: Dict[str, Any] = {
        "script": script,
        "command_line": " ".join([sys.executable] + sys.argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "smoke": bool(smoke),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("GOVINDA_", "VLLM_", "TRITON_", "CUDA_"))},
    }
    try:
        import torch

        meta["torch"] = torch.__version__
        meta["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available() and not smoke:
            props = torch.cuda.get_device_properties(0)
            meta["gpu"] = props.name
            meta["gpu_sm_count"] = props.multi_processor_count
            meta["gpu_memory_GiB"] = round(props.total_memory / 2**30, 1)
            meta["gpu_capability"] = list(torch.cuda.get_device_capability(0))
    except Exception as error:
        meta["torch_error"] = repr(error)
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception as error:
        meta["triton_error"] = repr(error)
    try:
        import vllm

        meta["vllm"] = vllm.__version__
        meta["vllm_path"] = str(Path(vllm.__file__).parent)
    except Exception as error:
        meta["vllm_error"] = repr(error)
    # The repo's sitecustomize starts the overlay when vLLM is imported (session.prepare_environment).
    bootstrap = sys.modules.get("govinda_patch.bootstrap")
    if bootstrap is None:
        meta["govinda_overlay"] = "not started"
    else:
        meta["govinda_overlay"] = "active" if getattr(bootstrap, "OVERLAY", None) is not None else "off"
    return meta


def why(record: Dict[str, Any]) -> str:
    """A skipped or failed record's status and reason, for a table cell."""
    return f"{record.get('status')}: {record.get('reason') or record.get('error')}"


def fmt(value: Optional[float], spec: str) -> str:
    """``value`` formatted with ``spec``; a dash (as wide) where there is no number."""
    if isinstance(value, (int, float)) and value == value:
        return format(value, spec)
    width = spec.split(".")[0]
    return format("-", f">{width}") if width else "-"
