"""A server's lifecycle for the A/B runner: start in its own process group, wait for /health while
checking its environment, stop the whole group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from bench import openai_http, server_env

# How often /health and the port are polled: the resolution of a start-up time (bench.startup records
# it) and what a fake test server, up in about a second, waits beyond its start. A poll is one local
# HTTP request and a read of the server's /proc environment: cheap beside a server's start.
POLL_S = 0.1
# How often a stopping server's process group is checked.
STOP_POLL_S = 0.05


class Refused(Exception):
    """The server runs with an environment other than its side's."""


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def start(command: List[str], env: Dict[str, str], log_file, cwd: Path) -> subprocess.Popen:
    """A new session, so that stop() reaches every process the command starts."""
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=str(cwd), start_new_session=True)


def wait_until_ready(proc: subprocess.Popen, host: str, port: int, expected: Dict[str, Optional[str]],
                     cache_dirs: Dict[str, str], scope: str, timeout_s: float,
                     abort: Optional[Callable[[], Optional[str]]] = None) -> Dict[str, Any]:
    """Poll /health; check the environment on every poll so a wrong side is refused early.
    ``abort`` (e.g. "the client failed to start") is asked on every poll too: a reason stops the wait.
    Returns {"startup_s", "env_check"}; raises Refused (with .env_check) or RuntimeError."""
    started = time.monotonic()
    verified: Dict[int, Dict[str, Any]] = {}
    while True:
        reason = abort() if abort is not None else None
        if reason:
            raise RuntimeError(reason)
        check = server_env.check_server_env(proc.pid, expected, cache_dirs, scope, verified)
        if check["processes"] and not check["ok"]:
            raise _refused(check, server_env.describe_failure(check))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health answered")
        if openai_http.health_ok(host, port):
            break
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"/health did not answer within {timeout_s:.0f} s")
        time.sleep(POLL_S)
    startup_s = round(time.monotonic() - started, 1)
    check = server_env.check_server_env(proc.pid, expected, cache_dirs, scope, verified)
    if not check["ok"]:
        why = server_env.describe_failure(check) if check["processes"] else "no server process environment could be read"
        raise _refused(check, why)
    return {"startup_s": startup_s, "env_check": check}


def _refused(check: Dict[str, Any], why: str) -> Refused:
    error = Refused(why)
    error.env_check = check
    return error


def stop(proc: subprocess.Popen, grace_s: float) -> Dict[str, Any]:
    """SIGTERM the whole process group, SIGKILL whatever is left after the grace period."""
    pgid = proc.pid
    started = time.monotonic()
    killed = False
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while time.monotonic() - started < grace_s:
        proc.poll()
        if not server_env.group_alive(pgid):
            break
        time.sleep(STOP_POLL_S)
    else:
        killed = True
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return {"exit_code": proc.returncode, "sigkill": killed, "stop_s": round(time.monotonic() - started, 2)}


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while port_in_use(host, port) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return not port_in_use(host, port)
