"""Run one ``python -m govinda_patch`` subcommand in a child process and read its JSON verdict.

The self-test and the launch-config tuner touch the GPU in a child, so a process that must not
initialise it (vLLM 0.18's API server) never does, and a crashing kernel costs a child, not vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SELFTEST_TIMEOUT_S = 600


def child_env() -> dict:
    """A kernel child's environment: the overlay off in it; GOVINDA_SELFTEST_CHILD marks this
    process tree (e.g. for bench/ab.py's environment check)."""
    return dict(os.environ, GOVINDA_DISABLE="1", GOVINDA_SELFTEST_CHILD="1", PYTHONUNBUFFERED="1")


def run_subcommand(args=("selftest", "--json"), timeout_s=SELFTEST_TIMEOUT_S, what="self-test", stream_stderr=False) -> dict:
    """Run ``python -m govinda_patch *args`` and return the last JSON line it prints.

    ``stream_stderr`` passes the child's stderr through (progress lines reach the server log).
    """
    env = child_env()
    command = [sys.executable, "-m", "govinda_patch", *args]
    stderr = None if stream_stderr else subprocess.PIPE
    try:
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"{what} timed out after {timeout_s}s", "cacheable": False}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        return {"ok": False, "reason": f"{what} process exited {done.returncode}: {' | '.join(tail)}", "cacheable": False}
    return json.loads(lines[-1])
