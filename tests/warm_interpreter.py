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
"""

from __future__ import annotations

import builtins
import gc
import importlib
import importlib.machinery
import json
import os
import queue
import site
import subprocess
import sys
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
PER_CHILD = {"PYTHONPATH", "CUDA_VISIBLE_DEVICES", "PYTEST_CURRENT_TEST"}
# Modules the server must not hold: ours, and vLLM (the overlay hooks its import).
NOT_PRELOADED = ("vllm", "govinda_patch", "sitecustomize", "bench", "amdsmi")
# Stock vLLM modules a probe child imports (no overlay on its path) to learn which other modules
# they pull in; the server then imports those too, so a child's ``import vllm`` finds them loaded.
# The patch targets of patches.yaml and what the cases import most; one that fails is skipped.
PROBED_VLLM_MODULES = ("vllm", "vllm.config", "vllm.engine.arg_utils", "vllm.platforms", "vllm.platforms.cuda",
                       "vllm.platforms.interface", "vllm.v1.attention.backends.registry",
                       "vllm.v1.attention.backends.triton_attn", "vllm.model_executor.models.config",
                       "vllm.model_executor.layers.attention.attention", "vllm.v1.kv_cache_interface",
                       "vllm.v1.core.kv_cache_utils", "vllm.config.vllm")


def _is_per_child(name: str) -> bool:
    return name in PER_CHILD or name.startswith(PER_CHILD_PREFIXES)


def server_environment(environ: dict) -> dict:
    """What the server runs with: ``environ`` minus every per-child variable."""
    return {k: v for k, v in environ.items() if not _is_per_child(k)}


class WarmInterpreter:
    """Client side: start the server, fork a child per ``run``, stop it."""

    def __init__(self, environ: dict):
        self.environ = server_environment(environ)
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
             "import warm_interpreter; sys.path.pop(0); warm_interpreter.serve()"],
            env=self.environ, cwd=str(REPO / "tests"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            bufsize=1)
        self._lock = threading.Lock()
        self._replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_replies, daemon=True).start()
        ready = self._reply(timeout=600)
        if ready.get("ready") is not True:
            raise RuntimeError(f"warm interpreter did not start: {ready}")

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

    def run(self, code: str, env: dict, cwd: Path, timeout: float, out_dir: Path) -> subprocess.CompletedProcess:
        """Like ``subprocess.run([sys.executable, "-c", code], ...)`` with captured text output."""
        stdout, stderr = out_dir / "stdout", out_dir / "stderr"
        request = {"code": code, "env": env, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr)}
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


# ------------------------------------------------------------------------------------ server side
def serve() -> None:
    """The server's loop; returns only in a forked child, which then runs its request's code."""
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
    _preload_what_vllm_imports()
    # What the preloads picked up from the checkout (transformers imports our ``kernels``
    # namespace to see it is not the HF package) is imported again by each child, on its own path.
    for name in [n for n, m in list(sys.modules.items()) if _from_checkout(m)]:
        del sys.modules[name]
    held = [m for m in sys.modules if m.split(".")[0] in NOT_PRELOADED]
    if held:
        raise RuntimeError(f"the warm interpreter must not import {held}")
    protocol_in, protocol_out = sys.stdin, sys.stdout
    # What is loaded now stays untouched by the collector, so forked children share its pages.
    gc.collect()
    gc.freeze()
    print(json.dumps({"ready": True}), file=protocol_out, flush=True)
    for line in protocol_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_the_child(request, base_path)
            return  # back in ``-c``: the child's code ran; the interpreter shuts down normally
        print(json.dumps({"pid": pid}), file=protocol_out, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=protocol_out, flush=True)


def _preload_what_vllm_imports() -> None:
    """Import what stock vLLM imports, vLLM itself left out.

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
        return
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
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # not the server's read-ahead of requests
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    # sys.path as ``-c`` builds it: '' first, then PYTHONPATH, then the interpreter's own entries.
    python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [""] + python_path + base_path
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    sys.argv = ["-c"]
    _reseed()
    sys.modules.pop("sitecustomize", None)
    site.execsitecustomize()
    main = sys.modules["__main__"]
    namespace = vars(main)
    namespace.clear()
    namespace.update({"__name__": "__main__", "__doc__": None, "__package__": None, "__spec__": None,
                      "__loader__": importlib.machinery.BuiltinImporter, "__builtins__": builtins})
    exec(compile(request["code"], "<string>", "exec"), namespace)


def _reseed() -> None:
    """Fresh interpreters draw new seeds; forked ones would all share the server's."""
    import random

    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
