"""The self-tuner (govinda_patch/int8/tuner.py) under the CPU interpreter.

Candidates run through the real kernels and are checked against the torch reference; only the
timings are injected (the interpreter's times say nothing about a GPU), so the selection logic
is tested against known speeds.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from govinda_patch.int8 import tuner
from govinda_patch.kernel_package import import_kernel
from govinda_patch.settings import Settings

lc = import_kernel("launch_configs")
attention = import_kernel("int8_paged_attention")
K = lc.KernelConfig

SHAPE = tuner.TuneShape(head_dim=64, num_q_heads=4, num_kv_heads=2, block_size=16, dtype="fp16")
TABLE = lc.ARCH_TABLES["interpreter"]


def fake_timer(seconds_by_label):
    """Times by (part, candidate label); batch-1 decode is timed once per context (the label's
    last word), and a key with that word (``(part, label, context)``) overrides the plain one."""
    calls = []

    def timer(run, part, label):
        if part == "decode_b1":
            label, context = label.rsplit(" ", 1)
            calls.append((part, label))
            return seconds_by_label.get((part, label, int(context)), seconds_by_label.get((part, label)))
        calls.append((part, label))
        return seconds_by_label[(part, label)]

    timer.calls = calls
    return timer


def test_picks_the_fastest_candidate_that_matches_the_reference(monkeypatch):
    # n16 is fast but "miscompiled" (its output is corrupted below); n24 does not compile
    # (tl.arange needs a power of two); n32 is correct but slower than n16; of the prefill tiles the
    # 32-row one is fastest.
    real = attention.paged_attention_int8

    def corrupting(*args, configs=None, **kwargs):
        out = real(*args, configs=configs, **kwargs)
        if configs is not None and kwargs.get("num_decodes") and configs.decode_config(SHAPE.head_dim).block_n == 16:
            out.add_(1.0)
        return out

    monkeypatch.setattr(attention, "paged_attention_int8", corrupting)
    candidates = lc.TuningCandidates(
        decode=(K(block_n=16), K(block_n=24), K(block_n=32)),
        programs_per_sm=(1, 2),
        batched_programs_per_sm=(1, 2),
        prefill=(K(block_m=16, block_n=16), K(block_m=32, block_n=16)),
        max_splits=16,
    )
    times = {
        ("decode_b1", "m16n16w4s1 pps1"): 1.0,
        ("decode_b1", "m16n16w4s1 pps2"): 1.0,
        ("decode_b1", "m16n32w4s1 pps1"): 3.0,
        ("decode_b1", "m16n32w4s1 pps2"): 2.0,
        ("decode_batched", "m16n32w4s1 pps2/1"): 5.0,
        ("decode_batched", "m16n32w4s1 pps2/2"): 4.0,
        ("prefill", "m16n16w4s1"): 7.0,
        ("prefill", "m32n16w4s1"): 6.0,
    }
    timer = fake_timer(times)
    result = tuner.run_tuning(SHAPE, "cpu", budget_s=600, timer=timer, candidates=candidates, base=TABLE)

    choice = lc.TunedChoice.from_json(result["choice"])
    assert choice.decode == K(block_n=32)
    assert (choice.decode_splits.programs_per_sm, choice.decode_splits.batched_programs_per_sm) == (2, 2)
    assert choice.prefill == K(block_m=32, block_n=16)
    trials = {(t["part"], t["label"]): t for t in result["trials"]}
    assert trials[("decode_b1", "m16n16w4s1 pps1")]["problem"].startswith("wrong result")
    assert trials[("decode_b1", "m16n24w4s1 pps1")]["problem"]  # compile error, recorded
    assert trials[("decode_b1", "m16n24w4s1 pps1")]["seconds"] is None
    # Rejected candidates are never timed; correct ones pass the check within the bound.
    assert ("decode_b1", "m16n16w4s1 pps1") not in timer.calls
    assert trials[("decode_b1", "m16n32w4s1 pps2")]["error_ratio"] <= 1.0
    assert result["ok"] and not result["skipped"]
    assert result["rotation"] == "none"


def test_candidates_are_checked_with_the_rotation_in_force(monkeypatch):
    # The rotated kernels are other specialisations; the check must run the ones a server with
    # GOVINDA_KV_ROTATION=hadamard launches, over rotated pages, against the rotated reference.
    monkeypatch.setenv("GOVINDA_KV_ROTATION", "hadamard")
    problems = tuner.TuneProblems(SHAPE, "cpu", tuner.INTERPRETER_WORKLOAD)
    assert problems.rotation == "hadamard"
    assert problems.check(problems.check_decode, TABLE) <= 1.0
    assert problems.check(problems.check_prefill, TABLE) <= 1.0
    # The unrotated kernels read the same pages wrongly: the check sees the difference.
    real = attention.paged_attention_int8
    monkeypatch.setattr(attention, "paged_attention_int8", lambda *a, rotation=None, **k: real(*a, rotation="none", **k))
    assert problems.check(problems.check_decode, TABLE) > 1.0


def test_batch_one_decode_is_scored_over_every_context():
    """The batch-1 decode part times each candidate at every context of the workload (the
    interpreter's 40 and 96 tokens stand for 4K/16K/32K on a GPU) and keeps the best geometric
    mean: a tile that wins one context by a little but loses the other by a lot is not chosen."""
    contexts = tuner.INTERPRETER_WORKLOAD.decode_contexts
    assert len(contexts) >= 2
    candidates = lc.TuningCandidates(
        decode=(K(block_n=16), K(block_n=32)), programs_per_sm=(1,), batched_programs_per_sm=(1,),
        prefill=(), max_splits=16,
    )
    short, long = contexts[0], contexts[-1]
    times = {
        ("decode_b1", "m16n16w4s1 pps1", short): 1.0, ("decode_b1", "m16n16w4s1 pps1", long): 8.0,  # geomean 2.83
        ("decode_b1", "m16n32w4s1 pps1", short): 1.2, ("decode_b1", "m16n32w4s1 pps1", long): 4.0,  # geomean 2.19
        ("decode_batched", "m16n32w4s1 pps1/1"): 1.0,
    }
    for context in contexts[1:-1]:
        times[("decode_b1", "m16n16w4s1 pps1", context)] = times[("decode_b1", "m16n32w4s1 pps1", context)] = 1.0
    timer = fake_timer(times)
    result = tuner.run_tuning(SHAPE, "cpu", budget_s=600, timer=timer, candidates=candidates, base=TABLE, tune_prefill=False)
    assert lc.TunedChoice.from_json(result["choice"]).decode == K(block_n=32)
    trials = {(t["part"], t["label"]): t for t in result["trials"]}
    timed = trials[("decode_b1", "m16n32w4s1 pps1")]
    assert set(timed["per_context_us"]) == {str(c) for c in contexts}
    assert timed["per_context_us"][str(long)] == pytest.approx(4e6)
    assert timer.calls.count(("decode_b1", "m16n32w4s1 pps1")) == len(contexts)


def test_budget_stops_tuning_and_keeps_the_hand_table_for_the_rest():
    # A clock that advances 10 s per reading: the decode half of a 25 s budget ends after the
    # first trial; prefill still gets its half (12.5 s) and ends after its first.
    ticks = iter(range(0, 10_000, 10))
    candidates = lc.TuningCandidates(
        decode=(K(block_n=16), K(block_n=32)),
        programs_per_sm=(1,),
        batched_programs_per_sm=(1, 2),
        prefill=(K(block_m=32, block_n=16), K(block_m=16, block_n=16)),
        max_splits=16,
    )
    timer = lambda run, part, label: 1.0  # noqa: E731
    result = tuner.run_tuning(
        SHAPE, "cpu", budget_s=25, timer=timer, candidates=candidates, base=TABLE, clock=lambda: next(ticks)
    )
    choice = lc.TunedChoice.from_json(result["choice"])
    tried = [(t["part"], t["label"]) for t in result["trials"]]
    assert tried == [("decode_b1", "m16n16w4s1 pps1"), ("prefill", "m32n16w4s1")]
    assert choice.decode == K(block_n=16)
    # The batched policy was not reached: None means "same as batch 1", the table's rule.
    assert choice.decode_splits.batched_programs_per_sm is None
    assert choice.prefill == K(block_m=32, block_n=16)
    assert "decode_b1 m16n32w4s1 pps1" in result["skipped"] and "prefill m16n16w4s1" in result["skipped"]
    assert "hand table kept for decode_batched" in result["summary"]


def test_no_budget_means_the_hand_table():
    result = tuner.run_tuning(SHAPE, "cpu", budget_s=0, timer=lambda *a: 1.0, base=TABLE)
    assert result["trials"] == []
    assert lc.TunedChoice.from_json(result["choice"]) == lc.choice_from_table(TABLE, SHAPE.head_dim)
    # Nothing was tried, so the hand table's entries were checked at the shape: both correct.
    assert result["wrong_at_shape"] is None and "WRONG" not in result["summary"]


def _corrupt(monkeypatch, part):
    """Every launch of ``part`` (decode: batches with decodes; prefill: without) is wrong, whatever
    its configs: a miscompile at this shape that no candidate and no table entry escapes."""
    real = attention.paged_attention_int8

    def corrupted(*args, **kwargs):
        out = real(*args, **kwargs)
        if bool(kwargs.get("num_decodes")) == (part == "decode"):
            out.add_(1.0)
        return out

    monkeypatch.setattr(attention, "paged_attention_int8", corrupted)


@pytest.mark.parametrize("part", ["decode", "prefill"])
def test_a_hand_table_wrong_at_the_shape_is_reported(monkeypatch, part):
    # Every candidate of the part is rejected, so the part falls back to the hand table, which is
    # then checked at the shape as well, and found wrong: the result says so (it is cached, and
    # the worker refuses it, test below). The other part passed its trials: not checked again.
    _corrupt(monkeypatch, part)
    candidates = lc.TuningCandidates(
        decode=(K(block_n=32),), programs_per_sm=(1,), batched_programs_per_sm=(1,),
        prefill=(K(block_m=32, block_n=16),), max_splits=16,
    )
    result = tuner.run_tuning(SHAPE, "cpu", budget_s=600, timer=lambda *a: 1.0, candidates=candidates, base=TABLE)
    rejected = [t for t in result["trials"] if t["problem"]]
    assert rejected and all(t["problem"].startswith("wrong result") for t in rejected)
    assert {t["part"] for t in rejected} == ({"decode_b1"} if part == "decode" else {"prefill"})
    assert result["wrong_at_shape"].startswith(f"{part}: error ") and ";" not in result["wrong_at_shape"]
    assert "WRONG at this shape" in result["summary"] and result["ok"] and result["cacheable"]


def test_a_choice_wrong_at_the_shape_fails_the_self_test_and_the_guard_keeps_vllm_stock(tmp_path, monkeypatch, capsys):
    """A worker that reads (or tunes) a result marked wrong at its shape records the device's
    self-test verdict as failed and raises: the group's guard (this start's, through the
    background prefetch, or the next start's) then keeps vLLM stock with that reason."""
    from govinda_patch.int8 import guard, selftest, selftest_prefetch

    flagged = {"ok": True, "choice": lc.choice_from_table(TABLE, 64).to_json(), "elapsed_s": 1.0,
               "wrong_at_shape": "decode: error 9.5 x the bound", "summary": "0/2 candidates usable"}
    asked = []
    monkeypatch.setattr(tuner, "cached_or_tuned", lambda settings, shape, *a, **k: asked.append(shape) or dict(flagged))
    monkeypatch.setattr(lc, "interpreting", lambda: False)  # a GPU worker's path
    monkeypatch.setattr(lc, "get_launch_configs", lambda device: TABLE)
    monkeypatch.setattr(tuner, "_device_label", lambda device: "Fake GPU|8")
    monkeypatch.setattr(selftest, "device_key", lambda index: f"Fake GPU|{index}")
    monkeypatch.setattr(selftest, "current_device_index", lambda: 0)
    monkeypatch.setenv("GOVINDA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GOVINDA_TUNE", "auto")
    tuner._launch_configs_for.cache_clear()
    settings = _settings(tmp_path)
    # The cached verdict passed before: the worker's guard would have let the group in.
    (tmp_path / "selftest").mkdir()
    passed = tmp_path / "selftest" / f"{selftest.machine_key('Fake GPU|0')}.json"
    passed.write_text(json.dumps({"ok": True, "device": "Fake GPU", "summary": {}}))
    assert guard.kernel_selftest(settings).ok

    with pytest.raises(tuner.WrongAtShape) as raised:
        tuner.launch_configs_for(SHAPE, torch.device("cuda", 0))
    assert asked == [SHAPE] and raised.value.problem is None
    assert SHAPE.key() in str(raised.value) and "error 9.5 x the bound" in str(raised.value)
    assert "verdict for this device is now failed, so vLLM runs stock from the next start" in str(raised.value)
    verdict = guard.kernel_selftest(settings)
    assert not verdict.ok and verdict.message.startswith("kernel self-test failed: the INT8 kernels give wrong results")
    assert SHAPE.key() in verdict.message and "kv_rotation=none" in verdict.message

    # The background prefetch's tuning meets the same error: one line, the verdict recorded, no raise.
    monkeypatch.setattr(tuner, "configs_here", lambda shape, index: tuner.launch_configs_for(shape, torch.device("cuda", index), tune_here=True))
    capsys.readouterr()
    selftest_prefetch._tune(settings, json.loads(SHAPE.to_json()), 0)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("govinda")]
    assert len(lines) == 1 and lines[0].startswith("govinda ERROR") and "keeps vLLM stock" in lines[0]
    assert tuner.main_cached(SHAPE.to_json(), 0) == 1


def test_with_choice_builds_a_new_table_and_changes_the_launch():
    before = {key: table for key, table in lc.ARCH_TABLES.items()}
    choice = lc.TunedChoice(K(block_n=16), K(block_m=32, block_n=16), replace(TABLE.decode_splits, programs_per_sm=1))
    tuned = lc.with_choice(TABLE, 64, choice)
    assert dict(lc.ARCH_TABLES) == before and lc.ARCH_TABLES["interpreter"].decode_config(64) == K(block_n=32, d_slice=32)
    with pytest.raises(TypeError):  # the tables are read-only: a variant is a new table, passed in
        lc.ARCH_TABLES["interpreter"] = tuned
    with pytest.raises(TypeError):
        lc.ARCH_TABLES["interpreter"].decode[64] = K(block_n=16)
    assert tuned.decode_config(64) == K(block_n=16) and tuned.prefill_config(64) == K(block_m=32, block_n=16)
    assert tuned.decode_config(128) == TABLE.decode_config(128)  # other head sizes untouched
    assert lc.TunedChoice.from_json(json.loads(json.dumps(choice.to_json()))) == choice
    # The split count (hence the grid and the workspace) follows the configs passed in.
    cpu = torch.device("cpu")
    assert attention.decode_splits_for(1, 2, cpu, tuned) != attention.decode_splits_for(1, 2, cpu)


class _Recorder:
    def __init__(self, result):
        self.result, self.calls = result, []

    def __call__(self, args, **kwargs):
        self.calls.append(args)
        return dict(self.result)


def _settings(tmp_path, **env):
    return Settings.from_env({"GOVINDA_CACHE_DIR": str(tmp_path), **env})


def test_choice_is_cached_per_shape_and_force_retunes(tmp_path, monkeypatch):
    from govinda_patch.int8 import child as child_runner

    good = {"ok": True, "choice": lc.choice_from_table(TABLE, 64).to_json(), "elapsed_s": 1.0}
    child = _Recorder(good)
    monkeypatch.setattr(child_runner, "run_subcommand", child)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    args = (SHAPE, torch.device("cuda", 0), "interpreter", "Fake GPU|8")

    first = tuner.cached_or_tuned(_settings(tmp_path), *args)
    second = tuner.cached_or_tuned(_settings(tmp_path), *args)
    assert len(child.calls) == 1 and not first["from_cache"] and second["from_cache"]
    assert second["choice"] == good["choice"]
    other = replace(SHAPE, block_size=32)
    tuner.cached_or_tuned(_settings(tmp_path), other, *args[1:])
    assert len(child.calls) == 2  # another shape: its own entry
    tuner.cached_or_tuned(_settings(tmp_path, GOVINDA_TUNE="force"), *args)
    assert len(child.calls) == 3
    assert "--shape" in child.calls[0] and json.loads(child.calls[0][child.calls[0].index("--shape") + 1])["head_dim"] == 64


def test_tune_cached_tunes_in_its_own_process_and_servers_then_read_it(tmp_path, monkeypatch):
    """`tune --cached` (the background prefetch, the DCU check) is a process of its own: it tunes
    there instead of starting a child that would import torch and set up the GPU again."""
    from govinda_patch.int8 import child as child_runner

    good = {"ok": True, "choice": lc.choice_from_table(TABLE, 64).to_json(), "elapsed_s": 1.0}
    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: pytest.fail("a tuning child was started"))
    calls = []
    monkeypatch.setattr(tuner, "tune_result", lambda shape, index, budget_s: calls.append((shape, index, budget_s)) or dict(good))
    settings = _settings(tmp_path)
    args = (SHAPE, torch.device("cuda", 1), "interpreter", "Fake GPU|8")
    first = tuner.cached_or_tuned(settings, *args, tune_here=True)
    assert calls == [(SHAPE, 1, settings.tune_budget_s)] and first["ok"] and not first["from_cache"]
    later = tuner.cached_or_tuned(settings, *args)  # a server's engine: from the cache, no child
    assert later["from_cache"] and later["choice"] == good["choice"] and len(calls) == 1

    asked = []
    monkeypatch.setattr(tuner, "launch_configs_for", lambda shape, device, tune_here=False: asked.append(tune_here) or (None, "tuned (cached) x"))
    assert tuner.main_cached(SHAPE.to_json(), 0) == 0 and asked == [True]


def test_failed_tuning_is_not_cached(tmp_path, monkeypatch):
    from govinda_patch.int8 import child as child_runner

    child = _Recorder({"ok": False, "reason": "tuning timed out", "cacheable": False})
    monkeypatch.setattr(child_runner, "run_subcommand", child)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    args = (SHAPE, torch.device("cuda", 0), "interpreter", "Fake GPU|8")
    for _ in range(2):
        assert not tuner.cached_or_tuned(_settings(tmp_path), *args)["ok"]
    assert len(child.calls) == 2


def test_worker_lookup_falls_back_to_the_hand_table_without_a_gpu(monkeypatch):
    monkeypatch.setenv("GOVINDA_TUNE", "auto")
    configs, description = tuner.launch_configs_for(SHAPE, torch.device("cpu"))
    assert configs is TABLE and "hand table interpreter" in description and "no GPU" in description


@pytest.mark.parametrize("text", ['{"head_dim": 64}', '{"head_dim": 64, "num_q_heads": 3, "num_kv_heads": 2, "block_size": 16, "dtype": "bf16"}'])
def test_bad_shape_is_refused(text):
    with pytest.raises((TypeError, ValueError)):
        tuner.TuneShape.from_json(text)


def test_prefill_is_not_tuned_when_another_kernel_runs_prefills():
    candidates = lc.TuningCandidates(
        decode=(K(block_n=16),), programs_per_sm=(1,), batched_programs_per_sm=(1,),
        prefill=(K(block_m=32, block_n=16),), max_splits=16,
    )
    timer = lambda run, part, label: 1.0  # noqa: E731
    result = tuner.run_tuning(
        SHAPE, "cpu", budget_s=600, timer=timer, candidates=candidates, base=TABLE, tune_prefill=False
    )
    assert [t["part"] for t in result["trials"]] == ["decode_b1", "decode_batched"]
    assert lc.TunedChoice.from_json(result["choice"]).prefill == TABLE.prefill_config(SHAPE.head_dim)
    assert "hand table kept" not in result["summary"]  # skipped on purpose, not for lack of budget
