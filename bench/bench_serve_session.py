"""A persistent ``vllm bench serve`` client: vLLM's CLI imported once, one benchmark per job.

Every run of ``vllm bench serve`` in its own process pays ~25 s on the H200 before its first
request (importing vLLM and transformers); a sweep of a dozen tiers would spend five minutes
of a ten-minute device call on that. This process imports vLLM's CLI once and then, for each job,
runs its ``main()`` with ``sys.argv = ["vllm", "bench", "serve", *args]``: the same parser, the
same client code and the same saved JSON as the command line, minus the start-up.

Protocol (bench/serve_tiers.py drives it): one JSON line per job on stdin, ``{"args": [...],
"log": PATH}``; the job's stdout and stderr go to PATH (file descriptors 1 and 2 are pointed
there, so vLLM's own log handlers follow); one JSON line per job comes back on the original
stdout, ``{"returncode": N, "seconds": S}``. A first line ``{"ready": true}`` says the CLI
imported; a failed import answers ``{"ready": false, "error": ...}`` and exits.

    python -m bench.bench_serve_session [--entry MODULE:FUNCTION]

``Session`` is the other end: it starts this process (early, so the import overlaps whatever
the caller does meanwhile, e.g. a server's start-up), sends jobs and waits for their answers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

DEFAULT_ENTRY = "vllm.entrypoints.cli.main:main"
READY_TIMEOUT_S = 600.0
OUTPUT_TAIL_LINES = 40


class SessionFailed(RuntimeError):
    pass


def _read_lines(stream, lines: "queue.Queue[Optional[str]]") -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class Session:
    """The driver: ``start()`` spawns the client process, ``run()`` one job, ``close()`` ends it."""

    def __init__(self, env: Dict[str, str], log_path: Path, entry: Optional[str] = None,
                 python: str = sys.executable, cwd: Optional[str] = None):
        self.command = [python, "-m", "bench.bench_serve_session"] + (["--entry", entry] if entry else [])
        self.env, self.log_path, self.cwd = env, Path(log_path), cwd
        self.proc: Optional[subprocess.Popen] = None
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._ready: Optional[Dict[str, Any]] = None

    def start(self) -> "Session":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env=self.env, cwd=self.cwd, text=True, bufsize=1, start_new_session=True)
        self._lines = queue.Queue()  # each process its own: a dead one's reader cannot answer for the next
        threading.Thread(target=_read_lines, args=(self.proc.stdout, self._lines), daemon=True).start()
        return self

    def _answer(self, timeout_s: float) -> Optional[Dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            try:
                return json.loads(line)
            except ValueError:
                continue  # not a protocol line (should not happen: the jobs write elsewhere)

    def start_failure(self) -> Optional[str]:
        """Why the session cannot serve jobs, once that is known without waiting (else None)."""
        while self._ready is None and self.proc is not None:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return None
            try:
                self._ready = json.loads(line or "{}") or {"ready": False, "error": "exited"}
            except ValueError:
                continue  # not a protocol line, as _answer skips them
        if self._ready is not None and not self._ready.get("ready"):
            return f"the vllm bench serve session did not start: {self._ready.get('error')} (see {self.log_path})"
        return None

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        if self.proc is None:
            self.start()
        if self._ready is None:
            self._ready = self._answer(timeout_s) or {"ready": False, "error": "no answer"}
        if not self._ready.get("ready"):
            raise SessionFailed(f"the vllm bench serve session did not start: {self._ready.get('error')} "
                                f"(see {self.log_path})")

    def run(self, args: List[str], output_path: Path, timeout_s: float) -> Dict[str, Any]:
        """One ``vllm bench serve ARGS``; the same record as a run in a process of its own."""
        started = time.monotonic()
        code: Optional[int] = None
        try:
            self.ready()
            output_path.write_bytes(b"")
            self.proc.stdin.write(json.dumps({"args": args, "log": str(output_path)}) + "\n")
            self.proc.stdin.flush()
            answer = self._answer(timeout_s)
            if answer is None:  # timed out or died: this session is done, the next run starts another
                self.close(kill=True)
            else:
                code = answer.get("returncode")
        except (SessionFailed, OSError, ValueError) as exc:
            with open(output_path, "a", encoding="utf-8") as out:
                out.write(f"{exc}\n")
            self.close(kill=True)
            code = code if code is not None else 1
        lines = output_path.read_text(encoding="utf-8", errors="replace").splitlines() if output_path.exists() else []
        return {"command": ["vllm", "bench", "serve", *args], "client": "session", "returncode": code,
                "seconds": round(time.monotonic() - started, 1), "output_file": str(output_path),
                "output_tail": lines[-OUTPUT_TAIL_LINES:]}

    def close(self, kill: bool = False) -> None:
        proc, self.proc = self.proc, None
        self._ready = None
        if proc is None:
            return
        try:
            if not kill:
                proc.stdin.close()
                proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def load_entry(spec: str) -> Callable[[], None]:
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def run_job(entry: Callable[[], None], args, log_path: str) -> int:
    """Run the CLI once with its output in log_path; its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    saved_argv = sys.argv
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            sys.argv = ["vllm", "bench", "serve", *args]
            entry()
            code = 0
        except SystemExit as exc:  # argparse errors, or a tool that exits
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - the job failed; the session carries on
            traceback.print_exc()
            code = 1
        finally:
            sys.argv = saved_argv
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entry", default=DEFAULT_ENTRY, help="MODULE:FUNCTION of the CLI (tests use a stand-in)")
    options = p.parse_args(argv)
    # The protocol keeps the original stdout; the jobs get file descriptor 1 for their output.
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    # Whatever an import prints to stdout goes to the session's log, never onto the protocol.
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        entry = load_entry(options.entry)
    except Exception as exc:  # noqa: BLE001
        protocol.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:500]}) + "\n")
        return 1
    protocol.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        started = time.monotonic()
        code = run_job(entry, [str(a) for a in job["args"]], job["log"])
        protocol.write(json.dumps({"returncode": code, "seconds": round(time.monotonic() - started, 1)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
