"""Warm interpreters that fork the children of ``overlay_testing.run_child``.

A child must start like ``python -c CODE``: the ``sitecustomize`` on its PYTHONPATH runs first
(that is where the overlay hooks ``import vllm``), then CODE in ``__main__``. Most of such a
child's start-up is importing torch and transformers, which the overlay never patches. A server
imports them once, with no repository on its path, then forks one child per request. The child
takes the request's environment, working directory and ``sys.path``, runs site's
``sitecustomize`` step and CODE as ``-c`` would, and ends through the interpreter's normal shutdown
(atexit, non-daemon threads), so what a case sees of the overlay (hooks, status lines, strict
errors, exit codes) is what a fresh interpreter gives.

A server serves the requests whose environment equals its own outside ``PER_CHILD`` (what torch,
transformers and Triton may have read at import is the same); ``run_child`` keeps one server per
such environment and starts a fresh interpreter for cases that look at what start-up imports
(``FRESH_CHILD_CASES`` in tests/conftest.py: torch and transformers are already loaded here) and
for everything when ``GOVINDA_TEST_FRESH_CHILDREN=1``.

Programs that code under test starts itself (a benchmark's ``vllm bench serve`` clients, the steps
of scripts/dcu/check.sh) reach a server through its launcher (``LAUNCHER``, ``WarmInterpreter.launcher``),
an executable that runs like ``python``: the server forks the program with the launcher's
environment, working directory and standard streams, and what the program starts as
``sys.executable`` goes through the launcher too. A ``run_child``/``run_module`` child gets the
launcher as ``sys.executable`` only where its case opts in (``warm_executable``): the overlay's
self-test child then forks from here as well.
"""

from __future__ import annotations

import builtins
import gc
import importlib
import importlib.machinery
import json
import os
import queue
import runpy
import select
import shlex
import shutil
import signal
import site
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Imported once in each server (those missing from a line's environment are left out): what the
# children spend most of their start-up on. None of them is a target of patches.yaml.
PRELOAD = ("torch", "transformers", "transformers.models.auto.configuration_auto",
           "transformers.models.auto.tokenization_auto", "transformers.models.auto.image_processing_auto",
           "transformers.models.auto.processing_auto", "transformers.modeling_utils", "openai", "aiohttp")
# Variables a request may set apart from its server's: read only after the fork (the overlay's
# switches and path, vLLM's, which the server never imports, the CUDA device list, which torch
# reads at CUDA initialisation, and pytest's name of the running case). Every other variable is
# part of the server's key: transformers
# imports Triton, whose ``triton.jit`` reads TRITON_INTERPRET when a function is decorated.
PER_CHILD_PREFIXES = ("GOVINDA_", "VLLM_")
PER_CHILD = {"PYTHONPATH", "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST",
             # what a shell sets for every command it runs, and the interpreter a script is told to use
             # (scripts/dcu/check.sh: $PYTHON, which may be this server's launcher)
             "PWD", "OLDPWD", "SHLVL", "_", "PYTHON",
             # read when inductor first needs its cache, which then sets it (a process that has imported
             # vLLM here carries it)
             "TORCHINDUCTOR_CACHE_DIR"}
# Modules the server must not hold: ours, and vLLM (the overlay hooks its import).
NOT_PRELOADED = ("vllm", "govinda_patch", "sitecustomize", "bench", "amdsmi")
# Stock vLLM modules a probe child imports (no overlay on its path) to learn which other modules
# they pull in; the server then imports those too, so a child's ``import vllm`` finds them loaded.
# The patch targets of patches.yaml and what the cases import most, the two test models' classes
# and the model loader among them (they bring the quantization and kernel libraries, tracing, and
# on 0.33 the CUTLASS DSL: ~1-2 s of each child's start-up otherwise); one that fails is skipped.
PROBED_VLLM_MODULES = ("vllm", "vllm.config", "vllm.engine.arg_utils", "vllm.platforms", "vllm.platforms.cuda",
                       "vllm.platforms.interface", "vllm.v1.attention.backends.registry",
                       "vllm.v1.attention.backends.triton_attn", "vllm.model_executor.models.config",
                       "vllm.model_executor.layers.attention.attention", "vllm.v1.kv_cache_interface",
                       "vllm.v1.core.kv_cache_utils", "vllm.config.vllm", "vllm.model_executor.model_loader",
                       "vllm.model_executor.models.llama", "vllm.model_executor.models.qwen3_5")


def _is_per_child(name: str) -> bool:
    return name in PER_CHILD or name.startswith(PER_CHILD_PREFIXES)


def server_environment(environ: dict, import_environ: dict | None = None) -> dict:
    """What the server runs with: ``environ`` minus every per-child variable. Given what vLLM's
    import sets (``import_environ``, a server's ``import_environ``), also minus those variables
    where they have that value: the server imported vLLM's dependencies with them in force, and a
    process that has imported vLLM (this one, after an in-process case) passes them on."""
    import_environ = import_environ or {}
    return {k: v for k, v in environ.items() if not _is_per_child(k) and import_environ.get(k, None) != v}


class WarmInterpreter:
    """Client side: start the server, fork a child per ``run``, stop it."""

    def __init__(self, environ: dict):
        self.environ = server_environment(environ)
        self._dir = tempfile.mkdtemp(prefix="govinda-warm-")
        self.socket_path = os.path.join(self._dir, "socket")
        self.launcher = os.path.join(self._dir, "python")
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
             f"import warm_interpreter; sys.path.pop(0); warm_interpreter.serve({self.socket_path!r})"],
            env=self.environ, cwd=str(REPO / "tests"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            bufsize=1)
        self._lock = threading.Lock()
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_replies, daemon=True).start()
        ready = self._reply(timeout=600)
        if ready.get("ready") is not True:
            raise RuntimeError(f"warm interpreter did not start: {ready}")
        self.import_environ = ready.get("import_environ", {})
        # A shell script, not a "#!python" line: those are limited in length and take one option.
        code = os.path.join(self._dir, "launcher.py")
        with open(code, "w") as launcher:
            launcher.write(LAUNCHER.format(python=sys.executable, socket=self.socket_path))
        with open(self.launcher, "w") as launcher:
            launcher.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S {shlex.quote(code)} \"$@\"\n")
        os.chmod(self.launcher, 0o755)

    def alive(self) -> bool:
        return self.process.poll() is None

    def _read_replies(self) -> None:
        for line in self.process.stdout:
            self._replies.put(json.loads(line))
        self._replies.put(None)

    def _reply(self, timeout: float) -> dict:
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if reply is None:
            raise RuntimeError(f"warm interpreter exited (rc={self.process.wait()})")
        return reply

    def run(self, code: str, env: dict, cwd: Path, timeout: float, out_dir: Path,
            argv: list | None = None, warm_executable: bool = False) -> subprocess.CompletedProcess:
        """Like ``subprocess.run([sys.executable, "-c", code], ...)`` with captured text output
        (``argv``: ``subprocess.run([sys.executable, *argv], ...)`` instead). ``warm_executable``:
        the child's ``sys.executable`` is this server's launcher, so the interpreters it starts
        that way (the overlay's self-test child) are forked from here too."""
        stdout, stderr = out_dir / "stdout", out_dir / "stderr"
        request = {"argv": argv or ["-c", code], "env": env, "cwd": str(cwd), "stdout": str(stdout),
                   "stderr": str(stderr), "warm_executable": bool(warm_executable)}
        with self._lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            pid = self._reply(timeout=60)["pid"]
            try:
                status = self._reply(timeout=timeout)["returncode"]
            except TimeoutError:
                os.kill(pid, 9)
                self._reply(timeout=60)
                raise subprocess.TimeoutExpired(["-c", code], timeout) from None
        read = lambda path: path.read_text(errors="replace") if path.exists() else ""
        return subprocess.CompletedProcess(["-c", code], status, read(stdout), read(stderr))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


# An executable that runs like ``python`` for programs this process does not start itself (a
# benchmark's client, a shell script's steps): ``-m MODULE``, ``-c CODE`` or ``SCRIPT``, then the
# program's arguments. It hands its environment, working directory and standard streams to the
# server, which forks the program as it forks run_child's children; its exit status (or signal)
# is the program's. Signals it gets go to the program, which is killed if the launcher dies.
# Other options, an environment the server does not serve, or no server: the real interpreter.
LAUNCHER = """import json, os, signal, socket, struct, sys
PYTHON, SOCKET = {python!r}, {socket!r}
argv = sys.argv[1:]
if not argv or argv[0].startswith("-") and (argv[0] not in ("-m", "-c") or len(argv) < 2):
    os.execv(PYTHON, [PYTHON] + argv)
try:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(SOCKET)
    request = json.dumps({{"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}}).encode()
    socket.send_fds(server, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    replies = server.makefile("r")
    first = json.loads(replies.readline() or "{{}}")
except OSError:
    first = {{}}
if "pid" not in first:
    os.execv(PYTHON, [PYTHON] + argv)
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(number, lambda number, frame: os.kill(first["pid"], number))
last = json.loads(replies.readline() or '{{"returncode": -9}}')
code = last["returncode"]
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


# ------------------------------------------------------------------------------------ server side
def serve(socket_path: str) -> None:
    """The server's loop; returns only in a forked child, which then runs its request's code.

    Requests come on stdin from the pytest process (one at a time) and on ``socket_path`` from
    launchers (``LAUNCHER``), whose programs run side by side with it."""
    own = dict(os.environ)  # before an import can change it
    base_path = [entry for entry in sys.path if entry != ""]
    # Preloaded where a default child starts (tests/, the repository next on the path): transformers
    # looks for optional packages by name (``kernels`` finds our kernels/ directory) and keeps the answer.
    sys.path.insert(1, str(REPO))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    sys.path.remove(str(REPO))
    import_environ = _preload_what_vllm_imports()
    own = server_environment(own, import_environ)
    # What the preloads picked up from the checkout (transformers imports our ``kernels``
    # namespace to see it is not the HF package) is imported again by each child, on its own path.
    for name in [n for n, m in list(sys.modules.items()) if _from_checkout(m)]:
        del sys.modules[name]
    held = [m for m in sys.modules if m.split(".")[0] in NOT_PRELOADED]
    if held:
        raise RuntimeError(f"the warm interpreter must not import {held}")
    protocol_out = sys.stdout
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    # What is loaded now stays untouched by the collector, so forked children share its pages.
    gc.collect()
    gc.freeze()
    print(json.dumps({"ready": True, "import_environ": import_environ}), file=protocol_out, flush=True)
    pending = b""
    pipe_child = None  # the pid of the pytest process's request
    launched = {}  # pid -> its launcher's connection (None once the launcher is gone)
    while True:
        waiting = [0, listener] + [c for c in launched.values() if c is not None]
        # Children are reaped by polling: a short wait while any runs.
        readable = select.select(waiting, [], [], 0.02 if pipe_child or launched else None)[0]
        if 0 in readable:
            data = os.read(0, 1 << 16)
            if not data:  # the pytest process is done
                break
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    _leave_the_server(listener, launched)
                    request = json.loads(line)
                    if request.get("warm_executable"):  # opted in: see WarmInterpreter.run
                        sys.executable = os.path.join(os.path.dirname(socket_path), "python")
                    _become_the_child(request, base_path)
                    return  # back in ``-c``: the child's code ran; the interpreter shuts down normally
                print(json.dumps({"pid": pid}), file=protocol_out, flush=True)
                pipe_child = pid
        if listener in readable:
            connection = listener.accept()[0]
            request, fds = _receive_launch(connection)
            if request is None or server_environment(request["env"], import_environ) != own:
                _answer(connection, {"fresh": True})
                connection.close()
            else:
                pid = os.fork()
                if pid == 0:
                    _leave_the_server(listener, launched)
                    connection.close()
                    # What it starts as ``sys.executable`` (a probe, a self-test) comes here too.
                    sys.executable = os.path.join(os.path.dirname(socket_path), "python")
                    _become_the_launched(request, fds, base_path)
                    return
                _answer(connection, {"pid": pid})
                launched[pid] = connection
            for fd in fds:
                os.close(fd)
        for pid, connection in list(launched.items()):
            if connection is not None and connection in readable:  # its launcher is gone
                connection.close()
                launched[pid] = None
                os.kill(pid, signal.SIGKILL)
        while pipe_child or launched:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = os.waitstatus_to_exitcode(status)
            if pid == pipe_child:
                print(json.dumps({"returncode": code}), file=protocol_out, flush=True)
                pipe_child = None
            elif launched.get(pid) is not None:
                _answer(launched[pid], {"returncode": code})
                launched[pid].close()
            launched.pop(pid, None)
    for pid in launched:
        os.kill(pid, signal.SIGKILL)


def _answer(connection, reply: dict) -> None:
    try:
        connection.sendall((json.dumps(reply) + "\n").encode())
    except OSError:
        pass


def _receive_launch(connection):
    """A launcher's request and its three standard streams' descriptors; (None, fds) if garbled."""
    connection.settimeout(30)
    fds = []
    try:
        data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
        while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            more = connection.recv(1 << 16)
            if not more:
                return None, fds
            data += more
        request = json.loads(data[4:4 + struct.unpack("!I", data[:4])[0]])
    except (OSError, ValueError):
        return None, fds
    connection.settimeout(None)
    return (request, fds) if len(fds) == 3 else (None, fds)


def _leave_the_server(listener, launched: dict) -> None:
    """In a forked child: drop the server's socket and its launchers' connections."""
    listener.close()
    for connection in launched.values():
        if connection is not None:
            connection.close()


def _preload_what_vllm_imports() -> dict:
    """Import what stock vLLM imports, vLLM itself left out; returns the variables its import sets.

    A forked probe imports ``PROBED_VLLM_MODULES`` and reports the modules that came with them
    and the environment variables vLLM's import set (some libraries read those when imported).
    The server imports the reported modules with those variables in force, then restores its
    environment, which every child replaces with its own anyway. A probe that fails preloads
    nothing more.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe
        os.close(read_end)
        code = 1
        try:
            null = os.open(os.devnull, os.O_WRONLY)  # vLLM logs to stdout, the protocol's channel
            os.dup2(null, 1)
            os.dup2(null, 2)
            before, environ = set(sys.modules), dict(os.environ)
            for name in PROBED_VLLM_MODULES:
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
            loaded = [name for name, module in list(sys.modules.items())
                      if name not in before and name.split(".")[0] not in NOT_PRELOADED
                      and module is not None and not _from_checkout(module)]
            changed = {k: v for k, v in os.environ.items() if environ.get(k) != v}
            with os.fdopen(write_end, "w") as out:
                json.dump({"modules": loaded, "environ": changed}, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as reply:
        text = reply.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not text:
        return {}
    probe = json.loads(text)
    saved = dict(os.environ)
    os.environ.update(probe["environ"])
    protocol = os.dup(1)
    os.dup2(2, 1)  # whatever an import prints stays off the protocol's channel
    try:
        for name in probe["modules"]:
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except Exception:
                pass
    finally:
        sys.stdout.flush()
        os.dup2(protocol, 1)
        os.close(protocol)
        os.environ.clear()
        os.environ.update(saved)
    return probe["environ"]


def _from_checkout(module) -> bool:
    attributes = getattr(module, "__dict__", {})  # not getattr: a lazy module would import on access
    locations = [attributes.get("__file__")]
    path = attributes.get("__path__")
    if isinstance(path, (list, tuple)) or type(path).__name__ == "_NamespacePath":
        locations += list(path)
    # The environment may live inside the checkout (scripts/setup.sh's default .venv): not ours.
    ours, environment = os.path.realpath(REPO) + os.sep, os.path.realpath(sys.prefix) + os.sep
    real = [os.path.realpath(p) for p in locations if isinstance(p, str)]
    return any(p.startswith(ours) and not p.startswith(environment) for p in real)


def _become_the_child(request: dict, base_path: list) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # not the server's pipe of requests
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    _run_program(request["argv"], request["env"], request["cwd"], base_path)


def _become_the_launched(request: dict, fds: list, base_path: list) -> None:
    for fd, stream in zip(fds, (0, 1, 2)):
        os.dup2(fd, stream)
        os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)
    _run_program(request["argv"], request["env"], request["cwd"], base_path)


def _run_program(argv: list, env: dict, cwd: str, base_path: list) -> None:
    """``python ARGV`` from here on: ``-c CODE``, ``-m MODULE`` or ``SCRIPT``, then its arguments."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    # sys.path as the interpreter builds it: '' (-c), the working directory (-m) or the script's
    # directory first, then PYTHONPATH, then the interpreter's own entries.
    first = {"-c": "", "-m": os.getcwd()}.get(argv[0]) if argv[0] in ("-c", "-m") else \
        os.path.dirname(os.path.realpath(argv[0]))
    python_path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [first] + python_path + base_path
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.argv = [argv[0]] + argv[2:] if argv[0] in ("-c", "-m") else list(argv)
    _reseed()
    sys.modules.pop("sitecustomize", None)
    site.execsitecustomize()
    if argv[0] == "-m":  # runpy puts the module's file in sys.argv[0] and runs it as __main__
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    if argv[0] != "-c":
        runpy.run_path(argv[0], run_name="__main__")
        return
    main = sys.modules["__main__"]
    namespace = vars(main)
    namespace.clear()
    namespace.update({"__name__": "__main__", "__doc__": None, "__package__": None, "__spec__": None,
                      "__loader__": importlib.machinery.BuiltinImporter, "__builtins__": builtins})
    exec(compile(argv[1], "<string>", "exec"), namespace)


def _reseed() -> None:
    """Fresh interpreters draw new seeds; forked ones would all share the server's."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
