"""The kernel self-test started early, in the background, when a vLLM server launches
(``GOVINDA_SELFTEST=auto``; ``inline`` keeps it where the guard asks, during model construction).

A server's API process imports vLLM tens of seconds before its engine process builds the model
(issue #29: the inline test added ~15 s to every cold start). So the API process, right after the
overlay is planned, starts ``python -m govinda_patch selftest --prefetch``: a child with the overlay
off, which runs the self-test on the first visible GPU, caches its verdict under that GPU's key
(the one the engine's guard looks up), and then tunes the launch's attention shape, all in that one
process (one torch import, one GPU context; a watchdog bounds each part as a child's timeout
would). Nothing in the API process touches the GPU.

The prefetch holds ``selftest/.prefetch.lock`` for its whole life: the API process takes the
``flock`` before it starts the child and hands the descriptor over, so there is no moment a waiter
could miss it. The engine waits on that lock (``wait``) before its worker initialises the device
(vLLM measures free GPU memory there, so no other process of ours may hold any) and again in the
guard, bounded by the self-test's own timeout. A prefetch that fails in any way only costs its
time: the guard finds no entry and runs the self-test itself, as ``inline`` does.

On a warm start an alias file (``selftest/default-<key>.json``: which GPU model the first visible
device was) shows the verdict is already cached, and nothing is started.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import io
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from ..excerpt import clip
from . import cache_files, child, device_alias
from .device_cache import write_json_atomically
from .fingerprint import machine_key

logger = logging.getLogger("govinda")

LOCK_NAME = ".prefetch.lock"
WAIT_POLL_S = 0.05
# The prefetch's self-test is stopped after child.SELFTEST_TIMEOUT_S (_watchdog); this covers its start and the write.
WAIT_LIMIT_S = child.SELFTEST_TIMEOUT_S + 60.0
# vLLM's configuration of the launch's arguments (an import of vLLM, no GPU), beside the self-test.
SHAPE_TIMEOUT_S = 180.0
# The engine's other specializations after the tuning (engine_launches): a few compiles.
ENGINE_LAUNCHES_TIMEOUT_S = 120.0


# What launch_argv gives for ``python -m`` launches of a server.
CLI_MODULE = "vllm.entrypoints.cli.main"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def launch_argv(argv: Optional[Sequence[str]] = None, orig_argv: Optional[Sequence[str]] = None) -> list:
    """The program and its arguments as launched. While ``sitecustomize`` runs, ``python -m MOD ...``
    shows ``sys.argv == ['-m', ...]`` (runpy puts the module's path there only later), so the
    module's name is taken from ``sys.orig_argv``."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or argv[0] != "-m":
        return argv
    orig = list(getattr(sys, "orig_argv", ()) if orig_argv is None else orig_argv)
    for index, word in enumerate(orig[1:], 1):
        if word == "-m" and index + 1 < len(orig):
            return [orig[index + 1]] + argv[1:]
        if word.startswith("-m") and len(word) > 2:  # python -mvllm.entrypoints.cli.main
            return [word[2:]] + argv[1:]
    return argv


def is_server_launch(argv: Sequence[str]) -> bool:
    """``vllm serve ...``, ``python -m vllm.entrypoints.cli.main serve ...`` or
    ``python -m vllm.entrypoints.openai.api_server ...`` (as a script path, or as the module name
    :func:`launch_argv` gives at start-up): the processes that start an engine soon."""
    if not argv:
        return False
    program = str(argv[0]).replace("\\", "/")
    subcommand = argv[1] if len(argv) > 1 else ""
    if os.path.basename(program) == "vllm" or program.endswith("vllm/entrypoints/cli/main.py") or program == CLI_MODULE:
        return subcommand == "serve"
    return program.endswith("vllm/entrypoints/openai/api_server.py") or program == API_SERVER_MODULE


def cached_for_first_device(directory: Path) -> bool:
    """True when the alias names a GPU model whose verdict is cached (never raises)."""
    return device_alias.first_device_key(directory) is not None


def start(settings, argv: Optional[Sequence[str]] = None) -> Optional[str]:
    """Start the background self-test if this process launches a server and no verdict is cached.

    Returns what happened, for the caller's one log line (None: nothing to say). Never raises.
    """
    argv = launch_argv() if argv is None else list(argv)
    if settings.selftest != "auto" or not is_server_launch(argv):
        return None
    directory = settings.cache_subdir("selftest")
    if directory is None:
        return None  # uncached: the guard runs the test where it is needed
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if cached_for_first_device(directory):
            return None
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        return f"self-test not started early ({type(exc).__name__}: {clip(exc, 200)}); it runs inline"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "self-test already running in the background (another server's prefetch)"
        process = subprocess.Popen(
            [sys.executable, "-m", "govinda_patch", "selftest", "--prefetch", "--launch-argv", json.dumps(argv)],
            env=child.child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(fd,),
        )
    except OSError as exc:
        return f"self-test not started early ({type(exc).__name__}: {clip(exc, 200)}); it runs inline"
    finally:
        os.close(fd)  # the child's copy keeps the lock until it exits
    threading.Thread(target=process.wait, name="govinda-selftest-prefetch", daemon=True).start()  # reap it
    also = " and the launch-config tuning" if settings.tune == "auto" else ""
    return f"kernel self-test{also} started in the background (pid {process.pid}), beside vLLM's start-up"


def wait_limit_s(settings) -> float:
    """How long a waiter may block: the prefetch's self-test, shape probe and tuning, each bounded."""
    from .tuner import TUNE_TIMEOUT_MARGIN_S

    return WAIT_LIMIT_S + SHAPE_TIMEOUT_S + settings.tune_budget_s + TUNE_TIMEOUT_MARGIN_S


def wait_before_device(settings) -> float:
    """The engine's wait before its worker initialises the GPU (``guards.EARLY_STARTS``): as
    :func:`wait`, with one log line when it blocked. Never raises."""
    waited = wait(settings)
    if waited >= 0.1:
        logger.info("waited %.1f s for the background self-test and tuning before the GPU's initialisation", waited)
    return waited


def wait(settings, limit_s: Optional[float] = None) -> float:
    """Block while a background self-test (and tuning) runs; return the seconds waited. Never raises."""
    directory = settings.cache_subdir("selftest")
    if directory is None or settings.selftest == "skip":
        return 0.0
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return 0.0  # none was ever started here (or the path is unusable: the guard reports that)
    begin = time.monotonic()
    try:
        if limit_s is None:
            limit_s = wait_limit_s(settings)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return time.monotonic() - begin
            except OSError:
                if time.monotonic() - begin > limit_s:
                    return time.monotonic() - begin
                time.sleep(WAIT_POLL_S)
    finally:
        os.close(fd)


def run_prefetch(settings, device_index: int = 0, argv: Optional[Sequence[str]] = None) -> int:
    """The ``selftest --prefetch`` process: test the device here, cache the verdict under the
    device model the test reports, and record that model in the alias; then, with the launch's
    command line (``argv``) and ``GOVINDA_TUNE=auto``, tune the attention shape vLLM will build
    from it (:mod:`launch_shape`, read beside the self-test) into the cache the engine's tuner
    reads (a plain dense launch's shape comes from its ``config.json`` at once). Exit status 0 unless
    the verdict could not be cached (the guard then runs the test)."""
    from .cache_schemas import SelftestVerdict

    directory = settings.cache_subdir("selftest")
    if directory is None:
        return 1
    began = time.monotonic()
    shape: dict = {}
    reader = None
    if argv and settings.tune == "auto":
        from .launch_shape import read  # never raises: a failure is a {"skip": why} shape

        reader = threading.Thread(target=lambda: shape.update(read(argv, SHAPE_TIMEOUT_S)), name="govinda-launch-shape")
        reader.start()
    verdict = _selftest_here(device_index)
    key = verdict.get("device_key")
    if not verdict.get("cacheable", True) or not isinstance(key, str):
        print(f"govinda: self-test prefetch not cached: {clip(verdict.get('reason') or 'no device key', 300)}", file=sys.stderr)
        return 1
    path = directory / f"{machine_key(key)}.json"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with cache_files.locked(directory / ".lock"):
            try:
                present = cache_files.read_validated(path, SelftestVerdict)
            except cache_files.BadCacheFile:
                present = None
            if present is None:
                write_json_atomically(path, verdict)
            write_json_atomically(device_alias.alias_path(directory), {"device_key": key})
    except OSError as exc:
        print(f"govinda: self-test prefetch not cached: {type(exc).__name__}: {clip(exc, 300)}", file=sys.stderr)
        return 1
    state = "passed" if verdict.get("ok") is True else "FAILED"
    print(f"govinda INFO [pid {os.getpid()}] kernel self-test (background) {state} on {clip(verdict.get('device'), 100)} "
          f"in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    if reader is not None:
        reader.join()
        if verdict.get("ok") is True:
            _tune(settings, shape, device_index, argv)
    return 0


@contextlib.contextmanager
def _watchdog(timeout_s: float):
    """What a child's timeout did for the work now done in this process: a GPU call that hangs
    past ``timeout_s`` makes faulthandler dump the stacks and end the process, which frees the
    prefetch lock (the guard then finds no verdict and tests inline)."""
    stream = sys.__stderr__
    try:
        faulthandler.dump_traceback_later(timeout_s, exit=True, file=stream)
        armed = True
    except (AttributeError, ValueError, OSError):  # no stderr with a file descriptor
        armed = False
    try:
        yield
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


def _selftest_here(device_index: int) -> dict:
    """The self-test in this process, as ``selftest --json`` would answer; never raises."""
    from . import selftest

    try:  # what it writes to stderr (warnings) stays out of the server's log, as a child's did
        with _watchdog(child.SELFTEST_TIMEOUT_S), contextlib.redirect_stderr(io.StringIO()):
            return selftest.run_selftest(device_index)
    except Exception as exc:
        return {"ok": False, "reason": f"self-test raised {type(exc).__name__}: {clip(exc, 300)}", "cacheable": False}


def _tune(settings, shape: dict, device_index: int, argv: Sequence[str] = ()) -> None:
    """What ``tune --cached`` does, in this process, for the predicted shape: what the engine's
    tuner would run for it, so the engine finds the choice cached. One line on stderr, whatever happens."""
    from . import tuner

    prefix = f"govinda INFO [pid {os.getpid()}] launch configs"
    if "skip" in shape or not shape:
        print(f"{prefix} not tuned in the background: {clip(shape.get('skip') or 'no shape', 300)}; "
              "the engine tunes them", file=sys.stderr, flush=True)
        return
    began = time.monotonic()
    try:
        tune_shape = tuner.TuneShape.from_json(json.dumps(shape))
        # The tuner's progress lines stay out of the server's log, as a tuning child's did: there they
        # would read as the engine's own tuning (bench/startup_phases.py); a failure keeps the last two.
        progress = io.StringIO()
        with _watchdog(settings.tune_budget_s + tuner.TUNE_TIMEOUT_MARGIN_S), contextlib.redirect_stderr(progress):
            configs, answer = tuner.configs_here(tune_shape, device_index)
        compiled = _compile_engine_launches(tune_shape, device_index, configs, argv)
        if compiled:
            answer += "; " + compiled
        if "tuning failed" in answer:
            answer += " | " + " | ".join(progress.getvalue().strip().splitlines()[-2:])
    except tuner.WrongAtShape as exc:  # the verdict is recorded failed: the engine's guard keeps vLLM stock
        stock = ("the engine's self-test guard reads the failed verdict and keeps vLLM stock" if exc.problem is None
                 else f"the failed verdict could not be recorded ({clip(exc.problem, 200)}): the engine meets the error itself")
        print(f"govinda ERROR [pid {os.getpid()}] launch configs in the background, {time.monotonic() - began:.1f} s: "
              f"{clip(exc.reason, 500)}; {stock}", file=sys.stderr, flush=True)
        return
    except Exception as exc:
        answer = f"{shape}: {type(exc).__name__}: {clip(exc, 300)}"
    print(f"{prefix} in the background, {time.monotonic() - began:.1f} s: {clip(answer, 520)}", file=sys.stderr, flush=True)


def _compile_engine_launches(tune_shape, device_index: int, configs, argv: Sequence[str] = ()) -> str:
    """The engine's other specializations (:mod:`engine_launches`) with the configs it will read,
    for the block tables of the launch ``argv``, into the on-disk Triton cache; a clause for the
    status line ("" without a GPU to compile for). Never raises: the engine then compiles them
    itself, as before."""
    from . import engine_launches
    from ..kernel_package import import_kernel
    from ..settings import kv_rotation
    from .launch_shape import max_model_len_arg

    try:
        import torch

        if configs is None or not torch.cuda.is_available() or import_kernel("launch_configs").interpreting():
            return ""
        with _watchdog(ENGINE_LAUNCHES_TIMEOUT_S), contextlib.redirect_stderr(io.StringIO()):
            widths = engine_launches.table_widths(tune_shape.block_size, max_model_len_arg(argv))
            done = engine_launches.compile_engine_launches(
                tune_shape, torch.device("cuda", device_index), configs, kv_rotation(), widths)
    except Exception as exc:
        return f"the engine's other launches not compiled ({type(exc).__name__}: {clip(exc, 200)})"
    return f"the engine's other launches compiled ({done['launches']} in {done['seconds']:.1f} s)"
