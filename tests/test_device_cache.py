"""The self-test and tuning caches across tensor-parallel ranks: one entry per GPU model and rank
shape, one child per entry however many ranks ask at once, and no half-written entry ever."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from govinda_patch.int8 import child as child_runner
from govinda_patch.int8 import device_cache, fingerprint, selftest, tuner
from govinda_patch.settings import Settings

H200 = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, gcnArchName="")
H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, multi_processor_count=132, gcnArchName="")
DCU = SimpleNamespace(name="Hygon DCU", major=9, minor=0, multi_processor_count=64, gcnArchName="gfx928:sramecc+:xnack-")
# The attention shape of one Qwen3.5-27B rank at TP=1 and TP=2 (24 q / 4 KV heads, split by rank).
RANK_TP1 = tuner.TuneShape(head_dim=256, num_q_heads=24, num_kv_heads=4, block_size=1552, dtype="bf16")
RANK_TP2 = replace(RANK_TP1, num_q_heads=12, num_kv_heads=2)
# A choice the tuning cache accepts (it is validated before use): the interpreter table's entries.
_LC = tuner.import_kernel("launch_configs")
CHOICE = _LC.choice_from_table(_LC.ARCH_TABLES["interpreter"], 256).to_json()


def _settings(tmp_path):
    return Settings.from_env({"GOVINDA_CACHE_DIR": str(tmp_path)})


@pytest.fixture
def gpus(monkeypatch):
    """Fake visible GPUs by index: ``gpus[i] = props``; this process runs on ``gpus.current``."""
    table = {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: table[index])
    monkeypatch.setattr(selftest, "current_device_index", lambda: table.get("current"))
    return table


def test_keys_name_the_gpu_model_not_the_board(gpus):
    gpus.update({0: H200, 1: H200, 2: H100, 3: DCU})
    keys = [fingerprint.machine_key(device_cache.device_key(i)) for i in range(4)]
    assert keys[0] == keys[1]  # two boards of one model share a verdict
    assert len({keys[1], keys[2], keys[3]}) == 3
    assert "gfx928" in device_cache.device_model(3) and "sm_90" in device_cache.device_model(0)
    # A process with no GPU context yet tests the host's default device: a key of its own.
    assert fingerprint.machine_key(device_cache.device_key(None)) not in keys


def test_tuning_entries_per_gpu_model_and_rank_shape(gpus, tmp_path):
    gpus.update({0: H200, 1: H200, 2: H100})
    settings = _settings(tmp_path)

    def path(shape, index):
        return tuner.cache_path(settings, shape, tuner._device_label(torch.device("cuda", index)), "sm90")

    assert path(RANK_TP2, 0) == path(RANK_TP2, 1)
    assert path(RANK_TP2, 0) != path(RANK_TP2, 2)
    assert path(RANK_TP1, 0) != path(RANK_TP2, 0) and "q12-kv2" in path(RANK_TP2, 0).name


def test_a_rank_tests_its_own_device_and_shares_the_verdict_of_its_model(gpus, tmp_path, monkeypatch):
    calls = []

    def child(args=("selftest", "--json")):
        calls.append(args)
        return {"ok": True, "device": gpus[int(args[-1])].name, "summary": {}}

    monkeypatch.setattr(child_runner, "run_subcommand", child)
    gpus.update({0: H200, 1: H200, 2: H100})
    verdicts = []
    for rank in (0, 1, 2):
        gpus["current"] = rank
        verdicts.append(selftest.cached_verdict(_settings(tmp_path)))
    assert calls == [("selftest", "--json", "--device-index", "0"), ("selftest", "--json", "--device-index", "2")]
    assert [v["device"] for v in verdicts] == ["NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3"]


def _one_rank(kind, cache_dir, counter, barrier, results):
    """A rank's lookup; the child it would run records itself and takes a while."""
    def child(*args, **kwargs):
        with open(counter, "a") as handle:
            handle.write("x")
        time.sleep(0.3)
        return {"ok": True, "device": "fake", "summary": {}, "choice": CHOICE, "elapsed_s": 0.3}

    child_runner.run_subcommand = child
    settings = _settings(cache_dir)
    barrier.wait()
    if kind == "selftest":
        result = selftest.cached_verdict(settings)
    else:
        result = tuner.cached_or_tuned(settings, RANK_TP2, torch.device("cuda", 0), "sm90", "NVIDIA H200|sm_90")
        result.pop("from_cache")
    results.put(json.dumps(result, sort_keys=True))


@pytest.mark.parametrize("kind", ["selftest", "tune"])
def test_concurrent_ranks_run_one_child_and_read_one_whole_entry(kind, tmp_path):
    context = multiprocessing.get_context("fork")
    ranks = 4
    barrier, results = context.Barrier(ranks), context.Queue()
    counter = tmp_path / "children"
    processes = [context.Process(target=_one_rank, args=(kind, tmp_path / "cache", counter, barrier, results)) for _ in range(ranks)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0] * ranks
    assert counter.read_text() == "x"  # one child for all ranks
    answers = {results.get(timeout=5) for _ in range(ranks)}
    assert len(answers) == 1
    (entry,) = (tmp_path / "cache" / ("selftest" if kind == "selftest" else "tune")).glob("*.json")
    assert json.loads(entry.read_text())["ok"] is True
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_an_interrupted_write_leaves_the_old_entry_whole(tmp_path, monkeypatch):
    path = tmp_path / "entry.json"
    device_cache.write_json_atomically(path, {"ok": True, "n": 1})

    def crash(*args):
        raise KeyboardInterrupt  # e.g. the worker killed between write and rename

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        device_cache.write_json_atomically(path, {"ok": False, "n": 2, "pad": "y" * 100_000})
    assert json.loads(path.read_text()) == {"ok": True, "n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.json"]
