"""The background self-test of a server launch (``govinda_patch.int8.selftest_prefetch``): who
starts it, that waiters block until it is done, and that the guard's lookup finds what it wrote."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap

import pytest

from govinda_patch.int8 import child as child_runner
from govinda_patch.int8 import device_cache, selftest, selftest_prefetch
from govinda_patch.settings import Settings


def _settings(tmp_path, **extra):
    return Settings.from_env(dict({"GOVINDA_CACHE_DIR": str(tmp_path)}, **extra))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/usr/local/bin/vllm", "serve", "m"], True),
        (["/site/vllm/entrypoints/cli/main.py", "serve", "m", "--port", "8000"], True),
        (["/site/vllm/entrypoints/openai/api_server.py", "--model", "m"], True),
        (["/usr/local/bin/vllm", "bench", "serve"], False),  # a client
        (["/usr/local/bin/vllm", "chat"], False),
        (["-c"], False),
        (["/x/pytest"], False),
        ([], False),
    ],
)
def test_only_a_server_launch_starts_it(argv, expected):
    assert selftest_prefetch.is_server_launch(argv) is expected


def test_nothing_starts_outside_auto_or_outside_a_server(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a child was started"))
    server = ["/usr/local/bin/vllm", "serve", "m"]
    assert selftest_prefetch.start(_settings(tmp_path, GOVINDA_SELFTEST="inline"), server) is None
    assert selftest_prefetch.start(_settings(tmp_path, GOVINDA_SELFTEST="skip"), server) is None
    assert selftest_prefetch.start(_settings(tmp_path), ["/x/python", "script.py"]) is None


def test_a_running_prefetch_is_not_started_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a second child was started"))
    settings = _settings(tmp_path)
    directory = settings.cache_subdir("selftest")
    directory.mkdir(parents=True)
    fd = os.open(directory / selftest_prefetch.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        note = selftest_prefetch.start(settings, ["/usr/local/bin/vllm", "serve", "m"])
    finally:
        os.close(fd)
    assert "already running" in note


def test_a_waiter_returns_only_after_the_prefetch_released_its_lock(tmp_path):
    settings = _settings(tmp_path)
    directory = settings.cache_subdir("selftest")
    directory.mkdir(parents=True)
    done = tmp_path / "holder-done"
    holder = textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(directory / selftest_prefetch.LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("locked", flush=True)
        time.sleep(1.0)
        open({str(done)!r}, "w").close()
    """)
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "locked"
        selftest_prefetch.wait(settings)
        assert done.exists(), "wait returned while the prefetch still held its lock"
    finally:
        process.wait(timeout=30)
    # No prefetch at all: nothing to wait for.
    assert selftest_prefetch.wait(_settings(tmp_path / "other")) == 0.0


def test_the_prefetch_caches_under_the_key_the_guard_looks_up(tmp_path, monkeypatch):
    settings = _settings(tmp_path)
    gpu = "NVIDIA H200|sm_90|cc9.0|132cu"
    verdict = {"ok": True, "device": "NVIDIA H200", "device_key": gpu, "summary": {"none": {}}, "reason": ""}
    calls = []

    def child(args=(), **kwargs):
        calls.append(args)
        return dict(verdict)

    monkeypatch.setattr(child_runner, "run_subcommand", child)
    assert selftest_prefetch.run_prefetch(settings, 0) == 0
    assert calls == [("selftest", "--json", "--device-index", "0")]
    assert selftest_prefetch.cached_for_first_device(settings.cache_subdir("selftest"))
    # The engine's worker, on device 0 of that model, finds the verdict without a child of its own.
    monkeypatch.setattr(selftest, "current_device_index", lambda: 0)
    monkeypatch.setattr(selftest, "device_key", lambda index: gpu if index == 0 else device_cache.device_key(index))
    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: pytest.fail("the guard ran its own child"))
    assert selftest.cached_verdict(settings)["ok"] is True


def test_a_failed_prefetch_leaves_the_decision_to_the_guard(tmp_path, monkeypatch):
    settings = _settings(tmp_path)
    monkeypatch.setattr(child_runner, "run_subcommand",
                        lambda *a, **k: {"ok": False, "reason": "self-test timed out after 600s", "cacheable": False})
    assert selftest_prefetch.run_prefetch(settings, 0) == 1
    directory = settings.cache_subdir("selftest")
    assert not selftest_prefetch.cached_for_first_device(directory)
    assert not list(directory.glob("*.json"))
