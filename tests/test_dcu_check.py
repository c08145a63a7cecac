"""scripts/dcu/check.sh on a CPU: arguments, the simulated DCU up to the GPU steps, and the
summary assembled from recorded step outputs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from overlay_testing import REPO, warm_python

CHECK = REPO / "scripts" / "dcu" / "check.sh"
MODEL = REPO / "tests" / "models" / "qwen3_5-27b-shape"


def run_check(args, env, timeout=900):
    return subprocess.run(["bash", str(CHECK), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.parametrize(
    "args",
    [[], ["--block-size"], [str(MODEL), "--block-size", "x"], [str(MODEL), "--bogus"], [str(MODEL), str(MODEL)], [str(REPO / "tests")]],
)
def test_bad_arguments_are_refused(args, base_env, tmp_path):
    done = run_check(args + ["--out", str(tmp_path)] if args else args, dict(base_env, PYTHON=sys.executable))
    assert done.returncode == 2, done.stderr
    assert "usage" in done.stderr or "config.json" in done.stderr or "numbers" in done.stderr
    assert not (tmp_path / "steps.tsv").exists()


def test_simulated_dcu_runs_up_to_the_gpu_steps(dcu_env, tmp_path):
    env = dict(dcu_env)
    env.pop("TRITON_INTERPRET", None)
    # The script's Python steps start through the warm interpreter's launcher (each imports vLLM).
    env["PYTHON"] = warm_python(env) or sys.executable
    # No --block-size: vLLM's own configuration aligns the hybrid model's pages (1552 tokens).
    done = run_check([str(MODEL), "--out", str(tmp_path)], env)
    steps = {line.split("\t")[0]: line.split("\t") for line in (tmp_path / "steps.tsv").read_text().splitlines()}
    assert list(steps) == ["doctor", "shape", "tune", "kernel_bench", "ab", "startup"]
    # The doctor resolves every patch target on the simulated ROCm platform; its kernel
    # self-test then needs a GPU, so the step fails on this machine and says why.
    doctor = (tmp_path / "doctor.txt").read_text()
    assert "vLLM platform: RocmPlatform" in doctor and "MISSING" not in doctor
    assert "no GPU visible" in doctor and steps["doctor"][1] == "failed"
    assert steps["shape"][1] == "ok"
    assert json.loads((tmp_path / "shape.json").read_text()) == {
        "block_size": 1552, "dtype": "bf16", "head_dim": 256, "num_kv_heads": 4, "num_q_heads": 24,
    }
    for name in ("tune", "kernel_bench", "ab", "startup"):
        assert steps[name][1] == "skipped" and steps[name][4] == "no GPU visible to torch"
    assert done.returncode == 1, done.stderr  # the failed doctor outranks the skipped steps
    summary = (tmp_path / "summary.md").read_text()
    assert "| kernel_bench | skipped |" in summary and "## doctor" in summary and '"head_dim": 256' in summary


def test_summary_from_recorded_step_outputs(tmp_path):
    (tmp_path / "steps.tsv").write_text(
        "doctor\tok\t0\t40\t\nshape\tok\t0\t0\t\ntune\tok\t0\t52\t\nkernel_bench\tok\t0\t300\t\nab\tfailed\t1\t900\tside govinda: no /health\n"
    )
    (tmp_path / "shape.json").write_text('{"head_dim": 256}\n')
    (tmp_path / "tune.txt").write_text("d256-q24-kv4-b1552-bf16: tuned (tuned in 41.0 s) decode m16n32w4s1pf pps 4/8\n")
    bench = {
        "sections": {
            "stream": {"status": "ok", "stream_read_GBps": 3200.0},
            "decode": {"cases": [{"case": "decode_b1_ctx32768", "time_ratios": {"graph": {"ours_over_vllm_bf16": 0.61, "ours_over_vllm_int8pth": None}},
                                  "contenders": {"ours_bs1552": {"status": "ok", "steps": [
                                      {"graph": {"eff_bw_read_GBps": 1600.0, "frac_of_stream_read_bw": 0.5}}]}}}]},
            "prefill": {"cases": [{"case": "prefill_one_shot_6144", "time_ratios": {"eager": {"ours_over_vllm_bf16": 0.9}}},
                                  {"case": "prefill_one_shot_24576", "status": "skipped"}]},
        }
    }
    (tmp_path / "kernel_bench.json").write_text(json.dumps(bench))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "dcu" / "summarize.py"), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.md").read_text()
    assert "| ab | failed | 1 | 900 | side govinda: no /health |" in summary
    assert "| decode_b1_ctx32768 | graph | 0.61x | n/a | 1.60 TB/s (50 % of streaming read) |" in summary
    assert "Streaming-read bandwidth of this device (bench/stream_read.py): 3200 GB/s." in summary
    assert "| prefill_one_shot_6144 | eager | 0.90x | n/a |  |" in summary
    assert "| prefill_one_shot_24576 | - | skipped | | |" in summary
    assert "tuned in 41.0 s" in summary and "Serving A/B" not in summary  # no A/B report recorded
    assert "## Start-up" not in summary
    (tmp_path / "dcu-startup.md").write_text("| govinda vs stock | +12.0 (130.0 vs 118.0): met |\n")
    subprocess.run([sys.executable, str(REPO / "scripts" / "dcu" / "summarize.py"), str(tmp_path)], check=True, capture_output=True)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Start-up: cold and warm" in summary and "| govinda vs stock | +12.0 (130.0 vs 118.0): met |" in summary
