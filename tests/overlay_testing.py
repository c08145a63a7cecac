"""Helpers for the overlay tests: run Python in a fresh interpreter with the overlay on PYTHONPATH.

The overlay acts at interpreter start-up (sitecustomize), so most tests start a subprocess of the
same interpreter against the REAL installed vLLM. ``dcu_env`` adds the simulated DCU (a fake
``amdsmi`` reporting gfx90a, see tests/dcu_sim) so ``vllm.platforms.rocm`` imports on a CPU.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from importlib import metadata
from pathlib import Path

from packaging.version import Version

from warm_interpreter import WarmInterpreter, server_environment

REPO = Path(__file__).resolve().parent.parent
DCU_SIM = REPO / "tests" / "dcu_sim"
VLLM_VERSION = Version(metadata.version("vllm"))
RESULT_MARK = "RESULT-JSON:"


def child_env(cache_dir: Path, dcu: bool = False) -> dict:
    """Environment for a child: the repo on PYTHONPATH, no inherited GOVINDA_* switches; with
    ``dcu`` a simulated Hygon DCU (vLLM's ROCm platform activates; kernels are trusted, CPU only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVINDA_")}
    env["PYTHONPATH"] = str(REPO)
    env["GOVINDA_CACHE_DIR"] = str(cache_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if dcu:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DCU_SIM)])
        env["GOVINDA_PLATFORM"] = "rocm"
        env["GOVINDA_SELFTEST"] = "skip"
    return env


def logged_shape_key(model_dir) -> str:
    """The tuner's key (head size, heads, block size, dtype) that the committed H200 server logs of
    ``model_dir`` at --max-model-len 32768 show for their INT8 attention layers."""
    keys = set()
    for log in (REPO / "reports" / "h200").glob("*.log"):
        text = log.read_text(errors="replace")
        if f"/{model_dir.name}'" in text and "max_seq_len=32768" in text:
            keys.update(re.findall(r"INT8 attention launch configs for (\S+):", text))
    assert len(keys) == 1, keys
    return keys.pop()


def vllm_is(spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return VLLM_VERSION in SpecifierSet(spec)


class ChildResult:
    def __init__(self, completed: subprocess.CompletedProcess):
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        lines = [line[len(RESULT_MARK):] for line in completed.stdout.splitlines() if line.startswith(RESULT_MARK)]
        self.result = json.loads(lines[-1]) if lines else None

    def govinda_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("govinda ")]

    def __repr__(self) -> str:
        return f"rc={self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-5000:]}"


# One warm interpreter per environment key (server_environment); few keys occur in one session.
# None: that server could not start (said once on stderr); its children start fresh.
_warm: dict[frozenset, WarmInterpreter | None] = {}
MAX_WARM_INTERPRETERS = 3


# What vLLM's import sets in the environment (from the first server): once a case has imported vLLM
# here, every child's environment carries it, which must not call for servers of its own.
_import_environ: dict = {}


def _warm_for(env: dict) -> WarmInterpreter | None:
    key = frozenset(server_environment(env, _import_environ).items())
    if key not in _warm:
        if len(_warm) >= MAX_WARM_INTERPRETERS:
            return None
        try:
            warm = WarmInterpreter(env)
            atexit.register(warm.close)
            if not _import_environ:
                _import_environ.update(warm.import_environ)
                key = frozenset(server_environment(env, _import_environ).items())
            _warm[key] = warm
        except (OSError, RuntimeError, TimeoutError) as error:
            sys.stderr.write(f"overlay_testing: warm interpreter unavailable, children start fresh: {error}\n")
            _warm[key] = None
    warm = _warm[key]
    return warm if warm is not None and warm.alive() else None


def _warm_unless_fresh(env: dict, fresh: bool = False) -> WarmInterpreter | None:
    """The warm interpreter serving ``env``, or None for a fresh interpreter (``fresh``, or
    GOVINDA_TEST_FRESH_CHILDREN=1 for everything)."""
    if fresh or os.environ.get("GOVINDA_TEST_FRESH_CHILDREN", "") == "1":
        return None
    return _warm_for(env)


def run_child(code: str, env: dict, timeout: float = 300, cwd: Path | None = None, fresh: bool = False,
              warm_executable: bool = False) -> ChildResult:
    """Run ``code`` as ``python -c`` does; it reports with ``report(obj)`` (JSON on stdout).

    The child is forked from this session's warm interpreter (tests/warm_interpreter.py: torch and
    transformers already imported) when ``env`` allows it; ``fresh`` (or an ``env`` it does not
    serve) starts a new interpreter instead. ``warm_executable``: a forked child's ``sys.executable``
    is the warm launcher, so what it starts as ``python -m ...`` (the overlay's self-test child) is
    forked too; only for cases whose nested interpreters take no descriptors beyond stdin, stdout
    and stderr (the launcher passes just those; a held lock's descriptor stays with the launcher)."""
    prelude = f"import json as _json\ndef report(obj):\n    print({RESULT_MARK!r} + _json.dumps(obj), flush=True)\n"
    code = prelude + textwrap.dedent(code)
    cwd = cwd or REPO / "tests"
    warm = _warm_unless_fresh(env, fresh)
    if warm is not None:
        with tempfile.TemporaryDirectory(prefix="govinda-child-") as out_dir:
            return ChildResult(warm.run(code, env, cwd, timeout, Path(out_dir), warm_executable=warm_executable))
    completed = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return ChildResult(completed)


def warm_python(env: dict) -> str | None:
    """An executable that runs like this interpreter for programs started by code under test (a
    benchmark's clients, a script's steps), forked from the warm interpreter that serves ``env``
    (tests/warm_interpreter.py, ``LAUNCHER``); None where there is none (then use sys.executable)."""
    warm = _warm_unless_fresh(env)
    return warm.launcher if warm is not None else None


def run_module(module: str, args, env: dict, timeout: float = 300, cwd: Path | None = None,
               fresh: bool = False, warm_executable: bool = False) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` with captured text output, like ``subprocess.run(..., capture_output=True,
    text=True)``: forked from the warm interpreter as ``run_child``'s children are, or that command
    line itself when ``fresh`` (or an ``env`` the warm interpreters do not serve); ``warm_executable``
    as for ``run_child``."""
    args = [str(a) for a in args]
    command = [sys.executable, "-m", module, *args]
    cwd = Path(cwd or REPO / "tests")
    warm = _warm_unless_fresh(env, fresh)
    if warm is None:
        return subprocess.run(command, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="govinda-child-") as out_dir:
        done = warm.run("", env, cwd, timeout, Path(out_dir), argv=command[1:], warm_executable=warm_executable)
    return subprocess.CompletedProcess(command, done.returncode, done.stdout, done.stderr)
