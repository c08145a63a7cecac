"""The environment check: the real environment of every process of a server against a side's.

Processes and their environments come from psutil. What psutil cannot say is kept here: a worker
renamed with setproctitle leaves only a remnant of its environment (see environ_overwritten).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil

# govinda_patch/int8/selftest.py runs the kernel self-test in a child process tree with
# GOVINDA_DISABLE=1 and this marker set.
OVERLAY_SELFTEST_MARKER = "GOVINDA_SELFTEST_CHILD"
CMDLINE_CHARS = 300
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError, PermissionError)


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _live(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False


def server_processes(root_pid: int, scope: str = "tree") -> List[Dict[str, Any]]:
    """The launched process, its live descendants and the live members of its process group."""
    try:
        root = psutil.Process(root_pid)
        family = [root] if scope == "leader" else [root] + root.children(recursive=True)
    except _GONE:
        family = []
    if scope != "leader":
        # The group catches processes orphaned by an exiting launcher (start_new_session: pgid == pid).
        known = {p.pid for p in family}
        family += [p for p in psutil.process_iter() if p.pid not in known and _pgid(p.pid) == root_pid]
    out = []
    for process in family:
        if not _live(process):
            continue
        try:
            out.append({"pid": process.pid, "comm": process.name()})
        except _GONE:
            continue
    return out


def group_alive(pgid: int) -> bool:
    return any(_pgid(p.pid) == pgid and _live(p) for p in psutil.process_iter())


def read_environ(pid: int) -> Optional[Dict[str, str]]:
    """A process's environment as it was exec'd with (None if gone or unreadable)."""
    try:
        return psutil.Process(pid).environ()
    except _GONE:
        return None


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()[:CMDLINE_CHARS]
    except _GONE:
        return ""


def _inside(path: str, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def env_problems(environ: Dict[str, str], expected: Dict[str, Optional[str]], cache_dirs: Dict[str, str]) -> List[str]:
    problems = []
    for key, want in sorted(expected.items()):
        have = environ.get(key)
        if want is None and have is not None:
            problems.append(f"{key}={have!r} but this side requires it unset")
        elif want is not None and have != want:
            problems.append(f"{key}={have!r} but this side requires {want!r}")
    cache_root = Path(cache_dirs["VLLM_CACHE_ROOT"]).parent
    have_root = environ.get("VLLM_CACHE_ROOT")
    if have_root is None or Path(have_root).resolve() != Path(cache_dirs["VLLM_CACHE_ROOT"]).resolve():
        problems.append(f"VLLM_CACHE_ROOT={have_root!r} but this side's is {cache_dirs['VLLM_CACHE_ROOT']!r}")
    # vLLM itself repoints Triton's and Inductor's caches into VLLM_CACHE_ROOT when it compiles,
    # so "inside the side's cache dir" is the requirement, not equality.
    for key in sorted(set(cache_dirs) - {"VLLM_CACHE_ROOT"}):
        have = environ.get(key)
        if have is None or not _inside(have, cache_root):
            problems.append(f"{key}={have!r} is not inside this side's cache dir {str(cache_root)!r}")
    return problems


def environ_overwritten(environ: Dict[str, str], command_line: str) -> bool:
    """True when the environment read no longer shows the process's environment.

    vLLM names its worker processes ("VLLM::EngineCore") with setproctitle, which writes the
    title over the argv/environ memory that /proc/<pid>/cmdline and /environ read; what is left
    of the environ is a remnant (seen on the H200: PATH but none of the variables set before it).
    """
    return "PATH" not in environ or command_line.startswith("VLLM::")


def check_server_env(
    root_pid: int, expected, cache_dirs, scope: str, verified: Optional[Dict[int, Dict[str, Any]]] = None
) -> Dict[str, Any]:
    """Check every server process's environment; ``verified`` (kept across polls) remembers
    each process that passed while its environ was still readable."""
    shown_keys = sorted(set(expected) | set(cache_dirs) | {"PYTHONPATH"})
    checked = []
    unverifiable = []
    for proc in server_processes(root_pid, scope):
        environ = read_environ(proc["pid"])
        if not environ:  # exited meanwhile, or a kernel thread / zombie without an environment
            continue
        if environ.get(OVERLAY_SELFTEST_MARKER) == "1":
            continue  # the overlay's kernel self-test (and its compiler children) run with it off on purpose
        command_line = cmdline(proc["pid"])
        if environ_overwritten(environ, command_line):
            earlier = (verified or {}).get(proc["pid"])
            if earlier is not None:
                checked.append(dict(earlier, note="checked before setproctitle overwrote its environ"))
            else:  # it inherited its parent's environment; the parent is checked
                unverifiable.append({"pid": proc["pid"], "comm": proc["comm"], "cmdline": command_line})
            continue
        entry = {
            "pid": proc["pid"],
            "comm": proc["comm"],
            "cmdline": command_line,
            "observed": {key: environ.get(key) for key in shown_keys},
            "problems": env_problems(environ, expected, cache_dirs),
        }
        if verified is not None and not entry["problems"]:
            verified[proc["pid"]] = entry
        checked.append(entry)
    ok = bool(checked) and not any(p["problems"] for p in checked)
    return {"ok": ok, "processes": checked, "checked": len(checked), "environ_overwritten": unverifiable}


def describe_failure(check: Dict[str, Any]) -> str:
    bad = [p for p in check["processes"] if p["problems"]]
    first = bad[0]
    return f"environment mismatch in pid {first['pid']} ({first['comm']}): " + "; ".join(first["problems"])
