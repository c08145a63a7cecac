"""Issue #25: no file in the cache directory can hang a process or be trusted unchecked.

The self-test verdict, the tuned launch configs and the dispatch counters are read only from
regular files, under a lock taken with a timeout, and validated against their schema; a file that
fails is named, ignored, computed again and replaced atomically. The self-test and tuning children
are replaced by recorders (what is tested is the cache around them); ``doctor`` and ``counters``
run as the CLI, in a child with a timeout, against the same hostile files.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from govinda_patch.int8 import cache_files, child as child_runner, counters, selftest
from govinda_patch.settings import Settings
from overlay_testing import REPO, run_child, run_module

PASS = {"ok": True, "device": "test-device", "summary": {}}
# Contents no verdict may be taken from: wrong types, broken or pathological JSON, binary junk.
BAD_VERDICTS = {
    "string_false": b'{"ok": "false"}',
    "ok_number": b'{"ok": 1, "device": "x"}',
    "deep_nesting": b"[" * 100_000,
    "deep_object": b'{"ok": true, "summary": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}",
    "not_an_object": b"[true]",
    "binary": bytes(range(256)) * 4,
    "empty": b"",
    "truncated": json.dumps(PASS).encode()[:-3],
    "too_large": b'{"ok": true, "pad": "' + b"x" * (cache_files.MAX_BYTES + 10) + b'"}',
}


class _Child:
    """Stands in for the self-test child: records its calls, answers ``verdict``."""

    def __init__(self, verdict=PASS):
        self.verdict, self.calls = verdict, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return dict(self.verdict)


def _settings(cache_dir: Path) -> Settings:
    return Settings.from_env({"GOVINDA_CACHE_DIR": str(cache_dir)})


def _verdict_path(cache_dir: Path, child) -> Path:
    """Where this process's verdict lives: let one run write it, then read the name back."""
    selftest.cached_verdict(_settings(cache_dir))
    (path,) = (cache_dir / "selftest").glob("*.json")
    return path


def _special(path: Path, kind: str) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling_symlink":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "symlink_to_fifo":
        os.mkfifo(path.parent / "a-fifo")
        path.symlink_to(path.parent / "a-fifo")
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        raise ValueError(kind)


@pytest.fixture
def child(monkeypatch):
    recorder = _Child()
    monkeypatch.setattr(child_runner, "run_subcommand", recorder)
    return recorder


def _assert_rewritten(path: Path) -> None:
    assert path.is_file() and not path.is_symlink(), path
    assert json.loads(path.read_text()) == PASS
    assert not list(path.parent.glob("*.tmp"))


@pytest.mark.parametrize("name", sorted(BAD_VERDICTS))
def test_a_bad_verdict_is_named_ignored_rerun_and_replaced(tmp_path, child, name):
    path = _verdict_path(tmp_path, child)
    path.write_bytes(BAD_VERDICTS[name])
    verdict = selftest.cached_verdict(_settings(tmp_path))
    assert child.calls == 2 and verdict["ok"] is True  # the child's answer, never the file's
    assert path.name in verdict["cache_problem"] and "ran again" in verdict["cache_problem"]
    assert "\n" not in verdict["cache_problem"] and len(verdict["cache_problem"]) < 600
    _assert_rewritten(path)
    assert selftest.cached_verdict(_settings(tmp_path)) == PASS and child.calls == 2  # read back, no child


def test_a_string_false_never_turns_int8_on(tmp_path, monkeypatch):
    recorder = _Child({"ok": False, "device": "test-device", "reason": "attention max_error=1.0"})
    monkeypatch.setattr(child_runner, "run_subcommand", recorder)
    path = _verdict_path(tmp_path, recorder)
    path.write_bytes(b'{"ok": "false", "device": "somewhere"}')
    from govinda_patch.int8.guard import kernel_selftest

    verdict = kernel_selftest(Settings.from_env({"GOVINDA_CACHE_DIR": str(tmp_path), "GOVINDA_SELFTEST": "auto"}))
    assert verdict.ok is False and "max_error=1.0" in verdict.message and path.name in verdict.message


@pytest.mark.parametrize("kind", ["fifo", "symlink_to_fifo", "dangling_symlink", "socket", "directory", "device"])
def test_a_verdict_path_that_is_not_a_regular_file_never_blocks(tmp_path, child, kind):
    path = _verdict_path(tmp_path, child)
    _special(path, kind)
    verdict = selftest.cached_verdict(_settings(tmp_path))
    assert child.calls == 2 and verdict["ok"] is True, verdict
    assert path.name in verdict["cache_problem"], verdict
    if kind == "directory":  # cannot be replaced by a file: the verdict stays uncached, and says so
        assert "not cached" in verdict["uncached"]
    else:
        _assert_rewritten(path)


@pytest.mark.parametrize("kind", ["fifo", "symlink_to_fifo", "socket", "device"])
def test_a_lock_that_is_not_a_regular_file_is_replaced(tmp_path, child, kind):
    path = _verdict_path(tmp_path, child)
    lock = path.parent / ".lock"
    _special(lock, kind)
    verdict = selftest.cached_verdict(_settings(tmp_path))
    assert child.calls == 1 and verdict["ok"] is True  # the good verdict is still read
    assert ".lock" in verdict["cache_problem"] and "replaced" in verdict["cache_problem"], verdict
    assert lock.is_file() and not lock.is_symlink()


def test_a_lock_that_is_a_directory_leaves_the_cache_usable(tmp_path, child):
    (tmp_path / "selftest" / ".lock").mkdir(parents=True)
    verdict = selftest.cached_verdict(_settings(tmp_path))
    assert verdict["ok"] is True and "cannot be used as a lock" in verdict["cache_problem"]
    assert selftest.cached_verdict(_settings(tmp_path))["ok"] is True and child.calls == 1  # still cached


def test_a_lock_held_past_the_timeout_is_given_up(tmp_path, child, monkeypatch):
    monkeypatch.setattr(cache_files, "LOCK_TIMEOUT_S", 0.3)
    directory = tmp_path / "selftest"
    directory.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\nf = open(sys.argv[1], 'w')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\ntime.sleep(60)", str(directory / ".lock")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        verdict = selftest.cached_verdict(_settings(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert verdict["ok"] is True and child.calls == 1
    assert "another process held" in verdict["lock_note"] and "0.3 s" in verdict["lock_note"]
    assert "cache_problem" not in verdict  # a busy lock is no fault of the cache
    assert selftest.cached_verdict(_settings(tmp_path)) == PASS  # it still wrote the verdict


def test_the_lock_timeout_bounds_the_wait():
    # The target of the issue: no process waits more than 10 s on a cache file.
    assert 0 < cache_files.LOCK_TIMEOUT_S <= 10


def test_the_guard_reports_a_replaced_file_as_one_warning(tmp_path, child):
    from govinda_patch.int8.guard import kernel_selftest

    settings = Settings.from_env({"GOVINDA_CACHE_DIR": str(tmp_path), "GOVINDA_SELFTEST": "auto"})
    path = _verdict_path(tmp_path, child)
    _special(path, "fifo")
    verdict = kernel_selftest(settings)
    assert verdict.ok is True and verdict.warning is not None
    assert path.name in verdict.warning and "FIFO" in verdict.warning and "\n" not in verdict.warning
    assert kernel_selftest(settings).warning is None  # replaced: the next process reads it quietly


# ----------------------------------------------------------------------------- tuned launch configs
@pytest.fixture
def tuning(monkeypatch):
    torch = pytest.importorskip("torch")
    from govinda_patch.int8 import tuner

    lc = tuner.import_kernel("launch_configs")
    good = {"ok": True, "choice": lc.choice_from_table(lc.ARCH_TABLES["interpreter"], 64).to_json(), "elapsed_s": 1.0,
            "summary": "1/1 candidates usable"}
    recorder = _Child(good)
    monkeypatch.setattr(child_runner, "run_subcommand", recorder)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    shape = tuner.TuneShape(head_dim=64, num_q_heads=4, num_kv_heads=2, block_size=16, dtype="bf16")
    args = (shape, torch.device("cuda", 0), "interpreter", "Fake GPU|8")
    return tuner, recorder, args, good


BAD_TUNE_ENTRIES = {
    "failed_result": b'{"ok": false, "reason": "x", "choice": {"decode": {}, "prefill": {}, "decode_splits": {}}}',
    "choice_a_string": b'{"ok": true, "choice": "{}"}',
    "choice_of_other_fields": b'{"ok": true, "choice": {"decode": {"warp_count": 4}, "prefill": {}, "decode_splits": {}}}',
    "nested_value": b'{"ok": true, "choice": {"decode": {"block_n": [16]}, "prefill": {}, "decode_splits": {}}}',
    "elapsed_a_string": b'{"ok": true, "elapsed_s": "1.0", "choice": {"decode": {}, "prefill": {}, "decode_splits": {}}}',
    "deep_nesting": b"[" * 100_000,
}


@pytest.mark.parametrize("name", sorted(BAD_TUNE_ENTRIES) + ["fifo"])
def test_a_bad_tuning_entry_is_named_retuned_and_replaced(tmp_path, tuning, name):
    tuner, recorder, args, good = tuning
    settings = _settings(tmp_path)
    tuner.cached_or_tuned(settings, *args)
    (path,) = (tmp_path / "tune").glob("*.json")
    if name == "fifo":
        _special(path, "fifo")
    else:
        path.write_bytes(BAD_TUNE_ENTRIES[name])
    result = tuner.cached_or_tuned(settings, *args)
    assert recorder.calls == 2 and result["ok"] is True and result["from_cache"] is False
    assert path.name in result["cache_problem"] and "tuned again" in result["cache_problem"]
    assert json.loads(path.read_text())["choice"] == good["choice"]
    again = tuner.cached_or_tuned(settings, *args)
    assert again["from_cache"] is True and recorder.calls == 2 and "cache_problem" not in again


def test_a_busy_tuning_lock_keeps_the_hand_table_for_this_start(tmp_path, tuning, monkeypatch):
    tuner, recorder, args, _ = tuning
    monkeypatch.setattr(cache_files, "LOCK_TIMEOUT_S", 0.2)
    path = tuner.cache_path(_settings(tmp_path), args[0], args[3], args[2])
    path.parent.mkdir(parents=True)
    with open(path.parent / ".lock", "w") as held:  # flock: a second open file contends, even in-process
        fcntl.flock(held, fcntl.LOCK_EX)
        result = tuner.cached_or_tuned(_settings(tmp_path), *args)
    assert result["busy"] is True and result["ok"] is False and recorder.calls == 0
    assert "next start" in result["reason"]


# ----------------------------------------------------------------------------- dispatch counters
def test_counters_skip_and_name_bad_snapshots_and_write_over_a_fifo(tmp_path, monkeypatch):
    monkeypatch.setenv("GOVINDA_CACHE_DIR", str(tmp_path))
    directory = tmp_path / "counters"
    directory.mkdir()
    (directory / "1.json").write_text(json.dumps({"pid": 1, "time": 1.0, "counters": {"decode": 4}}))
    (directory / "2.json").write_bytes(b"[" * 100_000)
    (directory / "3.json").write_text(json.dumps({"pid": "3", "counters": {"decode": 1}}))
    (directory / "4.json").write_text(json.dumps({"pid": 4, "counters": {"decode": "many"}}))
    os.mkfifo(directory / "5.json")
    os.mkfifo(directory / f"{os.getpid()}.json")  # where this process writes its own snapshot
    snapshots, ignored = counters.read_all()
    assert [s["pid"] for s in snapshots] == [1]
    assert len(ignored) == 5
    for name in ("2.json", "3.json", "4.json", "5.json", f"{os.getpid()}.json"):
        assert len([line for line in ignored if f"/{name}:" in line]) == 1, ignored
    monkeypatch.setattr(counters, "_counts", counters.Counter())
    counters.bump("decode")  # a plain open of the FIFO would block here
    assert counters.flush()
    own = json.loads((directory / f"{os.getpid()}.json").read_text())
    assert own["pid"] == os.getpid() and own["counters"] == {"decode": 1}


def test_a_bump_never_waits_on_the_file_system(tmp_path, monkeypatch):
    """The snapshot is written by the counters' own thread: a forward pass that crosses a power of
    two goes on while the file system is still busy (here: a write held until the bumps returned)."""
    monkeypatch.setenv("GOVINDA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(counters, "_counts", counters.Counter())
    release, writers = threading.Event(), []
    real_write = counters.write_json_atomically

    def held_write(path, payload):
        writers.append(threading.get_ident())
        assert release.wait(30), "the write was waited for by the bump"
        real_write(path, payload)

    monkeypatch.setattr(counters, "write_json_atomically", held_write)
    counters.bump("decode")
    counters.bump("decode")  # 2: asked again while the first write is held
    release.set()
    assert counters.flush(30)
    assert writers and threading.get_ident() not in writers
    own = json.loads((tmp_path / "counters" / f"{os.getpid()}.json").read_text())
    assert own["counters"] == {"decode": 2}  # the last write has the latest counts


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")  # the point of the case
def test_a_forked_child_writes_its_own_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("GOVINDA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(counters, "_counts", counters.Counter())
    counters.bump("decode")
    assert counters.flush(30)  # this process's writer thread is running
    pid = os.fork()
    if pid == 0:  # the child has no writer thread: its bump must start its own
        code = 2
        try:
            counters.bump("decode")
            code = 0 if counters.flush(30) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    child = json.loads((tmp_path / "counters" / f"{pid}.json").read_text())
    assert child["pid"] == pid and child["counters"] == {"decode": 2}


# ----------------------------------------------------------------------------- the CLI
def _cli(args, env, timeout=240):
    return subprocess.run([sys.executable, "-m", "govinda_patch", *args], cwd=REPO / "tests", env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_counters_command_on_hostile_files_prints_bounded_lines(base_env, tmp_path):
    directory = tmp_path / "counters"
    directory.mkdir()
    (directory / "7.json").write_text(json.dumps({"pid": 7, "counters": {"prefill\x1b[31m": 2}}))
    (directory / "8.json").write_bytes(b"[" * 100_000)
    os.mkfifo(directory / "9.json")
    done = _cli(["counters"], dict(base_env, GOVINDA_CACHE_DIR=str(tmp_path)), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "\x1b" not in done.stdout
    lines = done.stdout.splitlines()
    assert any(line.startswith("warning: ignored") and "8.json" in line for line in lines), lines
    assert any("9.json" in line and "FIFO" in line for line in lines), lines
    assert "pid 7: prefill\\x1b[31m=2" in lines, lines


def test_doctor_on_a_fifo_verdict_and_lock_finishes_and_names_them(dcu_env, tmp_path):
    directory = tmp_path / "selftest"
    directory.mkdir()
    os.mkfifo(directory / ".lock")
    env = dict(dcu_env, GOVINDA_CACHE_DIR=str(tmp_path), GOVINDA_SELFTEST="auto")
    env.pop("TRITON_INTERPRET", None)  # no GPU: the (real) self-test child fails fast
    # The doctor process has no device context: its verdict is the default device's.
    os.mkfifo(directory / _default_verdict_name(env))
    started = time.monotonic()
    # Forked from the warm interpreter: the doctor imports vLLM.
    # Its self-test child (``sys.executable -m govinda_patch``) is forked from it as well.
    done = run_module("govinda_patch", ["doctor"], env, timeout=240, cwd=REPO / "tests", warm_executable=True)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if "self-test for group int8_kv" in l)
    assert "FAILED" in line and "no GPU" in line and ".lock" in line and "FIFO" in line, line
    assert done.returncode == 1 and time.monotonic() - started < 240


def _default_verdict_name(env) -> str:
    code = ("from govinda_patch.int8.device_cache import device_key\n"
            "from govinda_patch.int8.fingerprint import machine_key\n"
            "print(machine_key(device_key(None)) + '.json')")
    done = run_child(code, env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
