"""The background self-test of a server launch (``govinda_patch.int8.selftest_prefetch``): who
starts it, that waiters block until it is done, and that the guard's lookup finds what it wrote."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from govinda_patch.int8 import child as child_runner
from govinda_patch.int8 import device_cache, fingerprint, selftest, selftest_prefetch, tuner
from govinda_patch.settings import Settings

REPO = Path(__file__).resolve().parents[1]


def _settings(tmp_path, **extra):
    return Settings.from_env(dict({"GOVINDA_CACHE_DIR": str(tmp_path)}, **extra))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["/usr/local/bin/vllm", "serve", "m"], True),
        (["/site/vllm/entrypoints/cli/main.py", "serve", "m", "--port", "8000"], True),
        (["/site/vllm/entrypoints/openai/api_server.py", "--model", "m"], True),
        (["vllm.entrypoints.cli.main", "serve", "m"], True),  # python -m, as launch_argv gives it
        (["vllm.entrypoints.openai.api_server", "--model", "m"], True),
        (["vllm.entrypoints.cli.main", "bench", "serve"], False),
        (["-m", "serve", "m"], False),  # sys.argv of python -m at start-up: the module is unknown here
        (["/usr/local/bin/vllm", "bench", "serve"], False),  # a client
        (["/usr/local/bin/vllm", "chat"], False),
        (["-c"], False),
        (["/x/pytest"], False),
        ([], False),
    ],
)
def test_only_a_server_launch_starts_it(argv, expected):
    assert selftest_prefetch.is_server_launch(argv) is expected


@pytest.mark.parametrize(
    "orig_argv",
    [
        ["/usr/bin/python3", "-m", "vllm.entrypoints.cli.main", "serve", "m"],
        ["/usr/bin/python3", "-X", "importtime", "-m", "vllm.entrypoints.cli.main", "serve", "m"],
        ["/usr/bin/python3", "-mvllm.entrypoints.cli.main", "serve", "m"],
    ],
)
def test_the_module_of_python_m_is_read_from_orig_argv(orig_argv):
    argv = selftest_prefetch.launch_argv(["-m", "serve", "m"], orig_argv)
    assert argv == ["vllm.entrypoints.cli.main", "serve", "m"]
    assert selftest_prefetch.is_server_launch(argv)


def test_launch_argv_keeps_a_resolved_program():
    argv = ["/usr/local/bin/vllm", "serve", "m"]
    assert selftest_prefetch.launch_argv(argv, ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"]) == argv


def test_a_python_m_server_is_recognised_while_its_package_is_imported(tmp_path):
    """The real interpreter: under ``python -m vllm.entrypoints.cli.main serve`` (the bench's and the
    start scripts' GOVINDA_VLLM_CMD) runpy imports the package ``vllm``, where the overlay plans,
    while sys.argv still reads ['-m', ...]; launch_argv must see through that."""
    package = tmp_path / "vllm" / "entrypoints" / "cli"  # found before any installed vLLM
    package.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text(
        "import sys\n"
        "from govinda_patch.int8 import selftest_prefetch as p\n"
        "print('SEEN', sys.argv[0], p.launch_argv(), p.is_server_launch(p.launch_argv()), flush=True)\n"
    )
    for folder in (package.parent, package):
        (folder / "__init__.py").write_text("")
    (package / "main.py").write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd()]))
    out = subprocess.run(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "m"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert "SEEN -m ['vllm.entrypoints.cli.main', 'serve', 'm'] True" in out
    out = subprocess.run(
        [sys.executable, "-c", "import vllm", "serve"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "SEEN -c ['-c', 'serve'] False" in out


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

    def test_here(device_index=None, rotations=None):
        calls.append((device_index, rotations))
        return dict(verdict)

    monkeypatch.setattr(selftest, "run_selftest", test_here)
    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: pytest.fail("the prefetch started a child"))
    assert selftest_prefetch.run_prefetch(settings, 0) == 0
    assert calls == [(0, None)]  # in the prefetch process itself, on its device, the rotation in force
    assert selftest_prefetch.cached_for_first_device(settings.cache_subdir("selftest"))
    # The engine's worker, on device 0 of that model, finds the verdict without a child of its own.
    monkeypatch.setattr(selftest, "current_device_index", lambda: 0)
    monkeypatch.setattr(selftest, "device_key", lambda index: gpu if index == 0 else device_cache.device_key(index))
    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: pytest.fail("the guard ran its own child"))
    assert selftest.cached_verdict(settings)["ok"] is True
    # So does a process with no GPU context (the API server, whose guard ran a 10-16 s child of its
    # own on every cold start while the verdict sat under the GPU model's key).
    monkeypatch.setattr(selftest, "current_device_index", lambda: None)
    assert selftest.cached_verdict(settings)["device_key"] == gpu
    assert [p.name for p in settings.cache_subdir("selftest").glob("*.json") if not p.name.startswith("default-")] \
        == [f"{fingerprint.machine_key(gpu)}.json"]


@pytest.mark.parametrize("how", ["uncacheable", "raised"])
def test_a_failed_prefetch_leaves_the_decision_to_the_guard(tmp_path, monkeypatch, how):
    settings = _settings(tmp_path)

    def failing(device_index=None, rotations=None):
        if how == "raised":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return {"ok": False, "reason": "no GPU visible", "cacheable": False}

    monkeypatch.setattr(selftest, "run_selftest", failing)
    assert selftest_prefetch.run_prefetch(settings, 0) == 1
    directory = settings.cache_subdir("selftest")
    assert not selftest_prefetch.cached_for_first_device(directory)
    assert not list(directory.glob("*.json"))


def test_a_hung_prefetch_ends_its_process(tmp_path):
    """The work runs in the prefetch process, not a child with a timeout: its watchdog must still
    end a call that never returns (a hung GPU kernel): the process's exit frees the prefetch lock,
    so the engine stops waiting."""
    code = textwrap.dedent("""
        import time
        from govinda_patch.int8 import selftest_prefetch
        with selftest_prefetch._watchdog(0.5):
            time.sleep(30)
        print("returned")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO), GOVINDA_DISABLE="1"))
    assert done.returncode != 0 and "returned" not in done.stdout
    assert "Timeout (0:00:00.500000)!" in done.stderr and "line 5" in done.stderr  # faulthandler: where it hung
    # Finished in time: the watchdog is off again and the process goes on.
    with selftest_prefetch._watchdog(0.5):
        pass
    time.sleep(1.0)


SERVER = ["/usr/local/bin/vllm", "serve", "/models/m", "--max-model-len", "32768"]
SHAPE = {"head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8, "block_size": 16, "dtype": "bf16"}


def test_a_server_launch_hands_its_command_line_to_the_prefetch(tmp_path, monkeypatch):
    started = []

    class Process:
        pid = 4321

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", lambda command, **kwargs: started.append(command) or Process())
    note = selftest_prefetch.start(_settings(tmp_path), SERVER)
    assert "self-test and the launch-config tuning started in the background (pid 4321)" in note
    (command,) = started
    assert command[-3:-1] == ["--prefetch", "--launch-argv"] and json.loads(command[-1]) == SERVER
    started.clear()
    note = selftest_prefetch.start(_settings(tmp_path / "off", GOVINDA_TUNE="off"), SERVER)
    assert note.startswith("kernel self-test started in the background")


class _Recorder:
    """tuner.launch_configs_for in the prefetch: what it was asked, and a canned description."""

    def __init__(self, description="", error=None):
        self.calls, self.description, self.error = [], description, error

    def __call__(self, shape, device, tune_here=False):
        self.calls.append((shape, device, tune_here))
        print("govinda INFO [pid 1] tune: chose m16n64 (21/21 candidates usable, 11.0 s)", file=sys.stderr)
        if self.error is not None:
            raise self.error
        return None, self.description


def _passing_selftest(monkeypatch):
    verdict = {"ok": True, "device": "NVIDIA H200", "device_key": "NVIDIA H200|sm_90|cc9.0|132cu", "summary": {}, "reason": ""}
    monkeypatch.setattr(selftest, "run_selftest", lambda *a, **k: dict(verdict))
    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: pytest.fail("the prefetch started a child"))


def test_the_prefetch_tunes_the_shape_vllm_configures_from_the_launch(tmp_path, monkeypatch, capsys):
    from govinda_patch.int8 import launch_shape

    settings = _settings(tmp_path, GOVINDA_TUNE_BUDGET_S="30")
    _passing_selftest(monkeypatch)
    asked = []
    monkeypatch.setattr(launch_shape, "predict", lambda argv, timeout_s: asked.append(list(argv)) or dict(SHAPE))
    run = _Recorder("tuned (tuned in 11.0 s) decode m16n64w4s1ds128r128 pps 4/4")
    monkeypatch.setattr(tuner, "launch_configs_for", run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert selftest_prefetch.run_prefetch(settings, 1, SERVER) == 0
    assert asked == [SERVER]
    # What `tune --cached` does, here: the tuning in this process, on the tested device.
    assert run.calls == [(tuner.TuneShape(**SHAPE), torch.device("cuda", 1), True)]
    err = capsys.readouterr().err
    assert "kernel self-test (background) passed" in err
    assert "launch configs in the background, " in err and "d128-q32-kv8-b16-bf16: tuned (tuned in 11.0 s)" in err
    assert "tune: chose" not in err  # the engine's tuning phase is read from that line (bench/startup_phases.py)


def test_a_dense_models_shape_comes_from_its_config_without_asking_vllm(tmp_path, monkeypatch):
    """A local Llama-family model with plain arguments: the shape is read from config.json, so the
    tuning starts right after the self-test and no vLLM import runs beside it."""
    from govinda_patch.int8 import launch_shape

    model = tmp_path / "llama"
    model.mkdir()
    config = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "torch_dtype": "bfloat16"}
    (model / "config.json").write_text(json.dumps(config))
    _passing_selftest(monkeypatch)
    monkeypatch.setattr(launch_shape, "predict", lambda argv, timeout_s: pytest.fail("vLLM was asked"))
    run = _Recorder("tuned")
    monkeypatch.setattr(tuner, "launch_configs_for", run)
    argv = ["/usr/local/bin/vllm", "serve", str(model), "--max-model-len", "32768", "--port", "8000"]
    assert selftest_prefetch.run_prefetch(_settings(tmp_path / "cache"), 0, argv) == 0
    ((shape, _, _),) = run.calls
    assert shape == tuner.TuneShape(**SHAPE)


@pytest.mark.parametrize("case", ["unpredicted", "failed_selftest", "tune_off", "tune_fails", "tune_raises"])
def test_the_background_tuning_is_left_to_the_engine_when_it_cannot_help(tmp_path, monkeypatch, capsys, case):
    from govinda_patch.int8 import launch_shape

    settings = _settings(tmp_path, **({"GOVINDA_TUNE": "off"} if case == "tune_off" else {}))
    if case == "failed_selftest":
        monkeypatch.setattr(selftest, "run_selftest",
                            lambda *a, **k: {"ok": False, "device": "x", "device_key": "x|y", "reason": "mismatch"})
    else:
        _passing_selftest(monkeypatch)
    shape = {"skip": "the overlay does not serve this model here"} if case == "unpredicted" else dict(SHAPE)
    monkeypatch.setattr(launch_shape, "predict", lambda argv, timeout_s: shape)
    if case == "tune_raises":
        run = _Recorder(error=RuntimeError("boom"))
    else:
        run = _Recorder("hand table cuda_sm90: x (tuning failed: tuning process exited 1: RuntimeError: boom)")
    monkeypatch.setattr(tuner, "launch_configs_for", run)
    assert selftest_prefetch.run_prefetch(settings, 0, SERVER) == 0
    err = capsys.readouterr().err
    if case == "unpredicted":
        assert not run.calls and "not tuned in the background: the overlay does not serve" in err
    elif case in ("failed_selftest", "tune_off"):
        assert not run.calls and "launch configs" not in err
    elif case == "tune_raises":
        assert len(run.calls) == 1 and "launch configs in the background" in err and "RuntimeError: boom" in err
    else:  # the tuner's last progress lines go with the failure
        (line,) = [l for l in err.splitlines() if "launch configs in the background" in l]
        assert "tuning failed" in line and line.endswith("| govinda INFO [pid 1] tune: chose m16n64 (21/21 candidates usable, 11.0 s)")


def test_the_wait_covers_the_background_tuning(tmp_path):
    settings = _settings(tmp_path, GOVINDA_TUNE_BUDGET_S="60")
    longer = _settings(tmp_path, GOVINDA_TUNE_BUDGET_S="120")
    assert selftest_prefetch.wait_limit_s(longer) - selftest_prefetch.wait_limit_s(settings) == 60
    assert selftest_prefetch.wait_limit_s(settings) > selftest_prefetch.WAIT_LIMIT_S + 60
