"""The A/B runner's capacity sweep (issue #27) on CPU: pinned KV memory, a concurrency sweep through
the installed vLLM's `vllm bench serve` in one persistent client, the server's /metrics sampled
per point, KV capacity from the server log, the onset and target verdicts, the plot, a side's
sweep split over calls and joined again; and the H200 sides files against their derivation and
the committed server logs.

The fake server (tests/fake_openai_server.py) runs at most ``--capacity`` requests at once, as a
server whose KV cache holds that many; timing assertions use its configured delays with wide
margins (a loaded 2-core machine adds latency, never removes it).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import ab, ab_capacity, ab_report, ab_side, server_metrics
from bench.bench_serve_session import Session

REPO_ROOT = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO_ROOT / "tests" / "fake_openai_server.py"
TOKENIZER = REPO_ROOT / "tests" / "models" / "qwen3_5-27b-shape"
H200 = REPO_ROOT / "scripts" / "h200"
LOGS = REPO_ROOT / "reports" / "h200"
GIB = 1 << 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- pieces, no server


METRICS_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.97
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 784.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 5.0
"""


def test_metrics_page_parses_to_summed_scheduler_state():
    assert server_metrics.parse(METRICS_PAGE) == {
        "running": 4.0, "waiting": 5.0, "kv_usage": 0.97, "preemptions": 2.0, "prefix_hits": 784.0}
    series = [[0.0, 0, 0, 0.0, 1.0, 0.0], [0.5, 2, 3, 0.9, 1.0, 0.0], [1.0, 1, 0, 0.5, 4.0, 10.0]]
    summary = server_metrics.summarize(series, [], 0.5)
    assert (summary["max_running"], summary["max_waiting"], summary["preemptions"]) == (2, 3, 3.0)
    assert summary["prefix_cache_hit_tokens"] == 10.0 and summary["max_kv_usage"] == 0.9
    # KV-limited: a preemption, or never all concurrent requests running at once.
    assert server_metrics.kv_limited(summary, 2) is True
    assert server_metrics.kv_limited(dict(summary, preemptions=0.0), 2) is False
    assert server_metrics.kv_limited(dict(summary, preemptions=0.0), 4) is True
    assert server_metrics.kv_limited(None, 4) is None


def _tier(n, c, tok_s, ttft99, running, preemptions=0.0):
    return {"requested_input_len": n, "requested_max_concurrency": c, "output_throughput": tok_s,
            "p50_ttft_ms": ttft99 / 2, "p99_ttft_ms": ttft99, "p50_tpot_ms": 10.0, "p99_tpot_ms": 12.0,
            "completed": c, "num_prompts": c,
            "server_metrics": {"max_running": running, "max_waiting": c - running, "preemptions": preemptions,
                               "max_kv_usage": 1.0, "samples": 9}}


def test_verdicts_take_the_onset_of_any_bf16_side_and_its_best_numbers():
    sides = {
        # fa3 runs out first (at c=4); triton is slower but never out of room below 8.
        "fa3": [_tier(8, 1, 100, 50, 1), _tier(8, 2, 190, 60, 2), _tier(8, 4, 200, 900, 2), _tier(8, 8, 210, 2000, 2)],
        "triton": [_tier(8, 1, 90, 70, 1), _tier(8, 2, 170, 80, 2), _tier(8, 4, 300, 100, 4), _tier(8, 8, 220, 3000, 4, 1.0)],
        "int8": [_tier(8, 1, 99, 50, 1), _tier(8, 2, 180, 55, 2), _tier(8, 4, 500, 60, 4), _tier(8, 8, 330, 500, 8)],
    }
    result = {"config": {"capacity": {"candidate": "int8", "bf16_sides": ["fa3", "triton"], "min_tok_s_ratio": 1.6,
                                      "max_ttft_p99_ratio": 0.7, "min_tok_s_ratio_below": 0.98}},
              "sides": [{"name": n, "status": "ok", "bench": {"tiers": t}} for n, t in sides.items()]}
    verdict = ab_capacity.verdicts(result)["8"]
    assert verdict["onset"] == 4
    rows = {r["concurrency"]: r for r in verdict["rows"]}
    assert rows[1]["regime"] == "below onset" and rows[1]["verdict"] == "MET"  # 99/100 >= 0.98
    assert rows[2]["verdict"] == "MISSED: tok/s 0.95x (target >= 0.98x)"  # 180/190
    # From the onset on, against the best bf16 number per metric (here both triton's).
    assert (rows[4]["best_bf16_tok_s_side"], rows[4]["best_bf16_ttft_side"]) == ("triton", "triton")
    assert rows[4]["tok_s_ratio"] == pytest.approx(500 / 300) and rows[4]["ttft_p99_ratio"] == pytest.approx(0.6)
    assert rows[4]["regime"] == "at/above onset" and rows[4]["verdict"] == "MET"
    assert rows[8]["tok_s_ratio"] == pytest.approx(1.5) and rows[8]["best_bf16_ttft_side"] == "fa3"
    assert rows[8]["verdict"] == "MISSED: tok/s 1.50x (target >= 1.6x)"
    # A point without the candidate's numbers is NO DATA, never a pass.
    result["sides"][2]["bench"]["tiers"].pop()
    assert {r["concurrency"]: r for r in ab_capacity.verdicts(result)["8"]["rows"]}[8]["verdict"] == "NO DATA"


def test_a_side_split_over_calls_keeps_every_tier_once():
    first = {"name": "a", "status": "ok", "problems": [], "startup_s": 300,
             "bench": {"tool": "vllm bench serve", "tiers": [_tier(8, 1, 1, 1, 1), _tier(8, 2, 2, 2, 2)]}}
    second = {"name": "a", "status": "ok", "problems": ["late"], "startup_s": 120,
              "bench": {"tool": "vllm bench serve", "tiers": [_tier(16, 1, 3, 3, 1), _tier(8, 2, 9, 9, 2)]}}
    merged = ab_report.merge_side_tiers(first, second)
    keys = [(t["requested_input_len"], t["requested_max_concurrency"], t["output_throughput"]) for t in merged["bench"]["tiers"]]
    assert keys == [(8, 1, 1), (8, 2, 9), (16, 1, 3)]  # the later call's tier replaces the same point
    assert merged["startup_s"] == 120 and merged["earlier_calls"][0]["startup_s"] == 300
    assert merged["earlier_calls"][0]["tiers"] == ["8"]
    failed = dict(first, status="error", error="boom", problems=["p"])
    again = ab_report.merge_side_tiers(failed, second)
    assert "earlier call: p" in again["problems"] and any("status error: boom" in p for p in again["problems"])
    # Without merge_tiers a later record replaces the earlier one whole, as before.
    base = {"sides": [first], "runs": []}
    assert ab_report.merge_results([base, {"sides": [second], "runs": []}])["sides"] == [second]


STAND_IN_CLI = """
import json, sys, time
print("a library that prints on import", flush=True)  # must not reach the protocol
print(flush=True)
def main():
    args = sys.argv[3:]
    print("stand-in for", " ".join(sys.argv[:3]), flush=True)
    if "--crash" in args:
        raise RuntimeError("crashed as asked")
    if "--exit" in args:
        sys.exit(int(args[args.index("--exit") + 1]))
    if "--hang" in args:
        time.sleep(60)
    with open(args[args.index("--out") + 1], "w") as f:
        json.dump({"args": args, "pid": __import__("os").getpid()}, f)
"""


def test_session_runs_jobs_in_one_process_and_outlives_failures(tmp_path):
    (tmp_path / "stand_in_cli.py").write_text(STAND_IN_CLI)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO_ROOT)]))
    session = Session(env, tmp_path / "session.log", entry="stand_in_cli:main", cwd=str(REPO_ROOT)).start()
    try:
        first = session.run(["--out", str(tmp_path / "1.json")], tmp_path / "1.log", timeout_s=60)
        second = session.run(["--out", str(tmp_path / "2.json")], tmp_path / "2.log", timeout_s=60)
        crash = session.run(["--crash"], tmp_path / "3.log", timeout_s=60)
        exit_3 = session.run(["--exit", "3"], tmp_path / "4.log", timeout_s=60)
        hung = session.run(["--hang"], tmp_path / "5.log", timeout_s=2)
        after = session.run(["--out", str(tmp_path / "6.json")], tmp_path / "6.log", timeout_s=60)
    finally:
        session.close()
    assert first["returncode"] == second["returncode"] == 0 and first["client"] == "session"
    one, two = (json.loads((tmp_path / f"{k}.json").read_text()) for k in (1, 2))
    assert one["pid"] == two["pid"]  # one interpreter for both runs
    assert one["args"] == ["--out", str(tmp_path / "1.json")] and first["command"][:3] == ["vllm", "bench", "serve"]
    # Each job's output lands in its own log (file descriptors 1 and 2 follow), none in the protocol.
    assert (tmp_path / "1.log").read_text().strip() == "stand-in for vllm bench serve"
    assert crash["returncode"] == 1 and "crashed as asked" in (tmp_path / "3.log").read_text()
    assert exit_3["returncode"] == 3
    # A job past its time: that session is ended, the next job gets a fresh one.
    assert hung["returncode"] is None and after["returncode"] == 0
    assert json.loads((tmp_path / "6.json").read_text())["pid"] != one["pid"]
    broken = Session(env, tmp_path / "broken.log", entry="no_such_module:main", cwd=str(REPO_ROOT)).start()
    try:
        deadline = time.monotonic() + 60
        while broken.start_failure() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "No module named 'no_such_module'" in broken.start_failure()
        assert "a library that prints on import" in (tmp_path / "session.log").read_text()
        failed = broken.run(["--out", "x"], tmp_path / "7.log", timeout_s=60)
        assert failed["returncode"] == 1 and "did not start" in (tmp_path / "7.log").read_text()
    finally:
        broken.close()


# ----------------------------------------------------------------------------- the sweep end to end


def _launcher(tmp_path: Path) -> str:
    path = tmp_path / "serve.sh"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SERVER}" --token-delay 0.03 --ttft 0.05 '
                    f'--tokenizer "{TOKENIZER}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def _capacity_sides(tmp_path: Path) -> str:
    data = {
        "name": "capsweep", "model": "fake-model", "server_command": _launcher(tmp_path),
        "health_timeout_s": 60, "stop_grace_s": 5, "kv_cache_memory_bytes": 3 * GIB,
        "bench": {"input_lens": [32, 64], "max_concurrency": [1, 2, 4], "output_len": 24, "num_prompts": 1,
                  "warmup_requests": 1, "client": "session", "sample_metrics": True, "metrics_interval_s": 0.05,
                  "tier_seeds": "point", "tokenizer": str(TOKENIZER)},
        "capacity": {"candidate": "int8", "bf16_sides": ["bf16"]},
        "sides": [
            # Room for two requests, the candidate for four; the bf16 side also "preempts" its waiters.
            {"name": "bf16", "env": {"GOVINDA_DISABLE": 1},
             "server_args": ["--capacity", "2", "--preempt-waiting", "--kv-tokens", "32768"]},
            {"name": "int8", "env": {"GOVINDA_DISABLE": 0}, "server_args": ["--capacity", "4", "--kv-tokens", "63536"]},
        ],
    }
    path = tmp_path / "sides.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_capacity_sweep_end_to_end_and_split_over_calls(tmp_path, warm_bench_clients):
    sides = _capacity_sides(tmp_path)
    common = ["--sides", sides, "--work-dir", str(tmp_path / "work")]
    assert ab.main(common + ["--port", str(free_port()), "--report-dir", str(tmp_path / "whole")]) == 0
    result = json.loads((tmp_path / "whole" / "capsweep.json").read_text())
    bf16, int8 = result["sides"]
    for side, tokens in ((bf16, 32768), (int8, 63536)):
        assert side["status"] == "ok" and side["problems"] == []
        # The same pinned KV memory reached every server, and the runner read its start-up lines.
        assert side["server_args"][:2] == ["--kv-cache-memory-bytes", str(3 * GIB)]
        assert side["kv_cache"]["tokens"] == tokens and side["kv_cache"]["reserved_gib"] == 3.0
        tiers = side["bench"]["tiers"]
        assert [(t["requested_input_len"], t["requested_max_concurrency"]) for t in tiers] == \
            [(n, c) for n in (32, 64) for c in (1, 2, 4)]
        assert all(t["bench_serve"]["client"] == "session" and t["completed"] == t["num_prompts"] for t in tiers)
        assert all(t["seed"] == 1 + 1000 * t["requested_input_len"] + t["requested_max_concurrency"] for t in tiers)
        assert all(t["server_metrics"]["samples"] >= 3 and not t["server_metrics"]["errors"] for t in tiers)
        by_point = {(t["requested_input_len"], t["requested_max_concurrency"]): t for t in tiers}
        for n in (32, 64):
            for c in (1, 2):  # below both capacities: every request ran at once
                assert by_point[(n, c)]["server_metrics"]["max_running"] == c
            four = by_point[(n, 4)]["server_metrics"]
            if side is bf16:
                assert four["max_running"] == 2 and four["max_waiting"] >= 1 and four["preemptions"] >= 1
            else:
                assert four["max_running"] == 4 and four["preemptions"] == 0
    verdicts = result["capacity"]
    assert verdicts["32"]["onset"] == verdicts["64"]["onset"] == 4
    for n in ("32", "64"):
        at_four = verdicts[n]["rows"][-1]
        # Half the room: the bf16 side serves four requests in two waves, the candidate in one.
        assert at_four["regime"] == "at/above onset" and at_four["tok_s_ratio"] > 1.3
        assert at_four["ttft_p99_ratio"] < 0.7
    md = (tmp_path / "whole" / "capsweep.md").read_text()
    assert "KV memory pinned on every side: 3,221,225,472 bytes (3.00 GiB" in md
    assert "| bf16 | 3.00 | 32,768 |" in md and "The bf16 sides are first KV-limited at **concurrency 4**." in md
    assert re.search(r"\| 4 \| bf16 \| [\d.]+ \| \d+ / \d+ \| [\d.]+ / [\d.]+ \| 4/4 \| 2 \| [12] \| [1-9]\d* \| 100% \| \*\*yes\*\* \|", md)
    _check_png(tmp_path / "whole" / "capsweep.png", md)

    # int8's 64-token points again in a call of their own (as a device session splits a side): joined
    # with the first result, the side has every point once, the later call's where both measured
    # one; a point's prompts do not depend on how the calls split the sweep.
    split = tmp_path / "split"
    assert ab.main(common + ["--only", "int8", "--input-lens", "64", "--keep-caches", "--port", str(free_port()),
                             "--report-dir", str(split)]) == 0
    part = json.loads((split / "capsweep.json").read_text())["sides"][0]["bench"]["tiers"]
    assert [(t["requested_input_len"], t["requested_max_concurrency"]) for t in part] == [(64, 1), (64, 2), (64, 4)]
    joined = tmp_path / "joined"
    code = ab.main(["--report-only", str(tmp_path / "whole" / "capsweep.json"), str(split / "capsweep.json"),
                    "--merge-tiers", "--report-dir", str(joined)])
    assert code == 0
    rejoined = json.loads((joined / "capsweep.json").read_text())
    again = rejoined["sides"][1]
    assert [(t["requested_input_len"], t["requested_max_concurrency"]) for t in again["bench"]["tiers"]] == \
        [(n, c) for n in (32, 64) for c in (1, 2, 4)]
    assert again["bench"]["tiers"][3:] == part and again["bench"]["tiers"][:3] == int8["bench"]["tiers"][:3]
    assert [t["seed"] for t in again["bench"]["tiers"]] == [t["seed"] for t in int8["bench"]["tiers"]]
    assert again["earlier_calls"][0]["tiers"] == ["32", "32@c2", "32@c4"] and rejoined["capacity"]["64"]["onset"] == 4


def _check_png(png: Path, md: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists() and "Plot skipped" in md
        return
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "![capacity sweep](capsweep.png)" in md


def test_session_client_failure_stops_the_side_during_start_up(tmp_path):
    """A client that cannot start is found while the server starts, not after it."""
    data = json.loads(Path(_capacity_sides(tmp_path)).read_text())
    data["bench"]["session_entry"] = "no_such_module:main"
    data["sides"][0]["server_args"] += ["--startup-delay", "20"]
    (tmp_path / "broken.json").write_text(json.dumps(data))
    code = ab.main(["--sides", str(tmp_path / "broken.json"), "--only", "bf16", "--port", str(free_port()),
                    "--work-dir", str(tmp_path / "work"), "--report-dir", str(tmp_path / "rep")])
    assert code == 2
    (side,) = json.loads((tmp_path / "rep" / "capsweep.json").read_text())["sides"]
    assert side["status"] == "error" and "session did not start" in side["error"]
    assert side["stop"]["stop_s"] < 15  # stopped before the server's 20 s start-up ended


# ----------------------------------------------------------------------------- the H200 sides files


def _actual_usage(log: Path) -> dict:
    text = log.read_text()
    usage = re.search(r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, "
                      r"([\d.]+) GiB for non-torch memory", text)
    graphs = re.search(r"Estimated CUDA graph memory: ([\d.]+) GiB", text)
    return {"weights": float(usage.group(1)), "activation": float(usage.group(2)),
            "non_torch": float(usage.group(3)), "graphs": float(graphs.group(1))}


# Log patterns that committed logs older than the pattern cannot satisfy.
PREDATED = {"kv_memory_pinned", "our_kernels_jit_during_inference"}


def test_qwen35_capacity_sides_file_pins_what_a_64_gib_card_leaves():
    config = ab.parse_config(["--sides", str(H200 / "ab_qwen35_64layer_capacity.yaml")])
    assert [s.name for s in config.sides] == ["govinda", "fa3_bf16", "triton_bf16", "upstream_int8"]
    assert config.capacity["candidate"] == "govinda" and config.capacity["bf16_sides"] == ["fa3_bf16", "triton_bf16"]
    assert config.bench["input_lens"] == [8192, 16384] and config.bench["max_concurrency"] == [1, 2, 4, 8, 16, 32]
    assert config.bench["client"] == "session" and config.bench["sample_metrics"] is True
    # The pinned KV memory is vLLM 0.26's own budget of a 64 GiB card at utilization 0.9, with the
    # weights and overheads vLLM logged for this shape on the H200 (FA3 bf16 side).
    usage = _actual_usage(LOGS / "serve64_bench_serve_fa3_bf16.log")
    expected = 64 * 0.9 - usage["weights"] - usage["activation"] - usage["non_torch"] - usage["graphs"]
    assert abs(config.kv_cache_memory_bytes / GIB - expected) < 0.005
    assert config.server_args[-2:] == ["--kv-cache-memory-bytes", str(config.kv_cache_memory_bytes)]
    # A 64 GB card's scheduler defaults (vLLM: below 70 GiB, 2048 batched tokens, 256 sequences).
    args = config.server_args
    assert args[args.index("--max-num-batched-tokens") + 1] == "2048" and args[args.index("--max-num-seqs") + 1] == "256"
    govinda, fa3, triton, upstream = config.sides
    for side, log in ((govinda, "serve64_bench_serve_8k_conc_govinda.log"), (fa3, "serve64_bench_serve_fa3_bf16.log"),
                      (triton, "serve64_bench_serve_triton_bf16.log"), (upstream, "serve64_upstream_int8.log")):
        counts = ab_side.count_log_patterns(LOGS / log, side.log_patterns)
        # Those logs predate pinned KV memory and the prefill warm-up (their first prefill
        # compiled the gather kernel): every other pattern holds on them.
        assert counts["kv_memory_pinned"]["count"] == 0
        assert all(c["ok"] for name, c in counts.items() if name not in PREDATED), (side.name, counts)
    # Each backend pattern fails on another side's log.
    assert not ab_side.count_log_patterns(LOGS / "serve64_bench_serve_fa3_bf16.log", upstream.log_patterns)["kv_cache_dtype"]["ok"]
    assert not ab_side.count_log_patterns(LOGS / "serve64_triton_bf16.log", fa3.log_patterns)["attention_backend"]["ok"]


def test_dense_capacity_sides_file_and_the_pinned_line():
    config = ab.parse_config(["--sides", str(H200 / "ab_dense128_capacity.yaml")])
    assert config.model == "/tmp/llama8b-shape" and config.kv_cache_memory_bytes == 4 * GIB
    assert [s.name for s in config.sides] == ["govinda", "fa3_bf16", "triton_bf16", "upstream_int8"]
    assert "--max-num-batched-tokens" not in config.server_args  # the issue's own measurement: H200 defaults
    govinda, fa3, _, _ = config.sides
    for side, log in ((govinda, "dense128_bench_serve_govinda.log"), (fa3, "dense128_bench_serve_fa3_bf16.log")):
        counts = ab_side.count_log_patterns(LOGS / log, side.log_patterns)
        assert all(c["ok"] for name, c in counts.items() if name not in PREDATED), (side.name, counts)
    # vLLM 0.26's line for a pinned KV memory (gpu_worker.determine_available_memory) matches the pattern.
    line = ("(EngineCore pid=1) INFO 12-02 10:00:00 [gpu_worker.py:479] Initial free memory 125.0 GiB, reserved "
            "4.0 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling.")
    pinned = [p for p in config.log_patterns if p.name == "kv_memory_pinned"]
    pattern = re.compile(pinned[0].regex) if pinned else None
    assert pattern is not None and pattern.search(line)


def test_kv_memory_flag_is_refused_twice_and_overridable(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: m\nkv_cache_memory_bytes: 100\nsides: [{name: a, server_args: [--kv-cache-memory-bytes, 5]}, {name: b}]\n")
    with pytest.raises(ValueError, match="no side may also pass"):
        ab.parse_config(["--sides", str(path)])
    path.write_text("model: m\nkv_cache_memory_bytes: 100\ncapacity: {candidate: b, bf16_sides: [c]}\nsides: [{name: a}, {name: b}]\n")
    with pytest.raises(ValueError, match="unknown: \\['c'\\]"):
        ab.parse_config(["--sides", str(path)])
    path.write_text("model: m\nkv_cache_memory_bytes: 100\nsides: [{name: a}, {name: b}]\n")
    config = ab.parse_config(["--sides", str(path), "--kv-cache-memory-bytes", "7"])
    assert config.server_args == ["--kv-cache-memory-bytes", "7"]


def test_ab_bench_serve_skips_the_client_check_for_a_session_client(tmp_path):
    """The device script: a session sides file starts its client beside the server instead."""
    checkout = tmp_path / "c"
    (checkout / "scripts" / "h200").mkdir(parents=True)
    (checkout / "bench").symlink_to(REPO_ROOT / "bench")
    for name in ("ab_bench_serve.sh", "carried.sh"):
        (checkout / "scripts" / "h200" / name).symlink_to(H200 / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (checkout / "scripts" / "h200" / "env.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    calls = tmp_path / "calls"
    (bin_dir / "python3").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$1 $2" >> "{calls}"
        case "$1 $2" in
          "-m bench.ab") exit 0 ;;
          "-m vllm.entrypoints.cli.main") exit 0 ;;
        esac
        exec "{sys.executable}" "$@"
        """))
    (bin_dir / "python3").chmod(0o755)
    env = dict(os.environ, OUT=str(tmp_path / "out"))
    for name, client in (("session.yaml", "session"), ("process.yaml", "process")):
        (checkout / name).write_text(f"model: /models/m\nbench: {{client: {client}}}\nsides: [{{name: a}}, {{name: b}}]\n")
        calls.write_text("")
        run = subprocess.run(["sh", "scripts/h200/ab_bench_serve.sh", "--sides", name, "a"], cwd=checkout, env=env,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        checked = "-m vllm.entrypoints.cli.main" in calls.read_text()
        assert checked is (client == "process") and "-m bench.ab" in calls.read_text()
