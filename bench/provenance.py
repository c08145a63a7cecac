"""Where a result was measured: the repo's commit (and whether the tree was dirty), the device."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict

REPO_ROOT = Path(__file__).resolve().parent.parent


def repo_state() -> Dict[str, Any]:
    def git(*words):
        try:
            return subprocess.run(
                ["git", *words], cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "--verify", "-q", "HEAD") or None, "dirty": bool(git("--no-optional-locks", "status", "--porcelain"))}


def device_info() -> Dict[str, str]:
    info = {}
    for tool, words in (("nvidia-smi", ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
                        ("rocm-smi", ["--showproductname"]),
                        ("hy-smi", [])):
        if shutil.which(tool):
            try:
                info[tool] = subprocess.run([tool, *words], capture_output=True, text=True, timeout=20).stdout.strip()[:2000]
            except (OSError, subprocess.SubprocessError) as exc:
                info[tool] = f"error: {exc}"
    return info
