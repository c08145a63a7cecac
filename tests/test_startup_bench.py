"""``python -m bench.startup`` against tests/fake_openai_server.py (``--startup-phases``: it logs cold
lines on empty caches and warm ones when it finds its own artefact of the earlier start), the
comparison with its targets, and the H200 script. No timing is asserted."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import startup, startup_report

REPO_ROOT = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO_ROOT / "tests" / "fake_openai_server.py"
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher(tmp_path: Path) -> str:
    path = tmp_path / "serve.sh"
    path.write_text(f'#!/bin/sh\nexec "{PYTHON}" "{FAKE_SERVER}" --startup-phases "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_startup_end_to_end_cold_then_warm_per_side(tmp_path):
    requests = {name: tmp_path / f"{name}.requests.jsonl" for name in ("stock", "govinda")}
    sides = tmp_path / "sides.json"
    sides.write_text(json.dumps({
        "name": "st",
        "model": "fake-model",
        "server_command": _launcher(tmp_path),
        "health_timeout_s": 60,
        "stop_grace_s": 5,
        "baseline": "stock",
        "bench": {"input_lens": [6144]},  # an A/B sides file: its bench settings are not used here
        "log_patterns": {"engine_init": {"regex": "init engine", "min": 1}},
        "sides": [
            {"name": "stock", "env": {"GOVINDA_DISABLE": "1"}, "server_args": ["--request-log", str(requests["stock"])]},
            {"name": "govinda", "env": {"GOVINDA_DISABLE": "0"}, "server_args": ["--request-log", str(requests["govinda"])]},
        ],
    }))
    work = tmp_path / "work"
    leftover = work / "govinda" / "cache" / "vllm" / "fake-compiled-graph"  # from "an earlier run": must go
    leftover.parent.mkdir(parents=True)
    leftover.write_text("stale")
    done = subprocess.run(
        [PYTHON, "-m", "bench.startup", "--sides", str(sides), "--port", str(free_port()), "--work-dir", str(work),
         "--report-dir", str(tmp_path / "reports"), "--prompt-tokens", "64", "256"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "reports" / "st-startup.json").read_text())
    assert result["schema"] == startup.SCHEMA and result["baseline"] == "stock"
    assert result["meta"]["command"][1:3] == ["-m", "bench.startup"] and result["meta"]["date"]
    assert result["meta"]["host"]["node"]
    stock, govinda = result["sides"]
    for side in (stock, govinda):
        assert side["status"] == "ok", side
        cold, warm = side["starts"]
        assert (cold["start"], warm["start"]) == ("cold", "warm")
        assert cold["status"] == warm["status"] == "ok" and cold["problems"] == warm["problems"] == []
        assert cold["launch_to_health_s"] > 0 and warm["launch_to_health_s"] > 0
        # One cache root per side, the same for both starts: emptied before the cold one, kept for the warm one.
        assert cold["cache_dirs"] == warm["cache_dirs"]
        assert set(cold["cache_dirs"]) == {"VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "GOVINDA_CACHE_DIR"}
        assert all(Path(path).parent == work / side["name"] / "cache" for path in cold["cache_dirs"].values())
        assert all(entry["files"] == 0 for entry in cold["cache_before"].values())
        assert warm["cache_before"] == cold["cache_after"] and warm["cache_before"]["VLLM_CACHE_ROOT"]["files"] == 1
        for start in (cold, warm):  # what the server processes really had
            observed = start["env_check"]["processes"][0]["observed"]
            assert {key: observed[key] for key in start["cache_dirs"]} == start["cache_dirs"]
        # The fake logs cold lines on empty caches and warm ones on its earlier artefact.
        assert cold["phases"]["torch_compile_s"] == 22.37 and cold["phases"]["graph_compile_s"] == 10.2
        assert cold["phases"]["graph_cache_load_s"] is None and cold["phases"]["init_engine_s"] == 85.71
        assert warm["phases"]["torch_compile_s"] == 3.1 and warm["phases"]["graph_cache_load_s"] == 0.512
        assert warm["phases"]["graph_compile_s"] is None and warm["phases"]["init_engine_s"] == 30.5
        assert cold["phases"]["model_load_s"] == warm["phases"]["model_load_s"] == 2.402183
        assert cold["phases"]["cuda_graph_capture_s"] == 11.0
        assert cold["log_counts"]["engine_init"]["ok"]
        # Two probes, sized in tokens after the first answer (the fake counts words), max_tokens 8.
        assert [r["prompt_tokens"] for r in cold["requests"]] == [64, 256]
        assert all(r["completion_tokens"] == 8 and "error" not in r for r in cold["requests"])
        assert Path(cold["log_path"]).name == "cold.server.log" and Path(warm["log_path"]).name == "warm.server.log"
    sent = [json.loads(line) for line in requests["govinda"].read_text().splitlines()]
    assert len(sent) == 4 and {r["max_tokens"] for r in sent} == {8} and {r["temperature"] for r in sent} == {0}
    assert sent[0]["prompt"] != sent[1]["prompt"] and sent[0]["prompt"] == sent[2]["prompt"]
    # The overlay's lines: tuned on the cold start, cached on the warm one; none on the stock side.
    cold, warm = govinda["starts"]
    assert cold["overlay"]["selftest"] == "passed" and cold["phases"]["overlay_tune_s"] == 24.8
    assert cold["overlay"]["launch_configs"]["d128-q32-kv8-b16-bf16"]["origin"] == "tuned"
    assert warm["overlay"]["launch_configs"]["d128-q32-kv8-b16-bf16"]["origin"] == "cached"
    assert warm["phases"]["overlay_tune_s"] is None
    assert warm["cache_before"]["GOVINDA_CACHE_DIR"]["files"] >= 1
    assert stock["starts"][0]["overlay"]["selftest"] is None
    # Our kernels' Triton metadata newer than the launch, split at the engine's start line: the
    # cold start compiled two before it and one in it; the warm start only loaded them.
    compiles = cold["our_compiles"]
    assert [c["kernel"] for c in compiles["compiles"]] == ["_store_kv_int8_kernel", "_gather_kv_kernel", "_gather_kv_kernel"]
    assert (compiles["before_engine"], compiles["in_engine"]) == (2, 1)
    assert compiles["compiles"][1]["at_s"] < compiles["engine_start_s"] <= compiles["compiles"][2]["at_s"]
    # Each compile's specialization from its .ttir and metadata; the engine's gather compile names
    # the argument the background specialized otherwise.
    assert compiles["compiles"][0]["spec"] == {"args": {"cache_ptr": "!tt.ptr<i8>/16", "stride_block": "i32/16"},
                                               "num_warps": 4, "num_stages": 1}
    assert "unlike_background" not in compiles["compiles"][1]
    assert compiles["compiles"][2]["unlike_background"] == "stride_block: i32 -> i32/16"
    assert warm["our_compiles"]["compiles"] == [] and warm["our_compiles"]["in_engine"] is None
    assert stock["starts"][0]["our_compiles"] == {"engine_start_s": None, "before_engine": None, "in_engine": None,
                                                  "compiles": []}
    assert stock["starts"][0]["cache_after"]["GOVINDA_CACHE_DIR"]["files"] == 0
    # JIT lines: a vLLM kernel on every start, and with the overlay one of ours.
    assert [s["jit"]["kernels"] for s in stock["starts"]] == [["_compute_slot_mapping_kernel"]] * 2
    assert [(s["jit"]["count"], s["jit"]["ours"]) for s in govinda["starts"]] == [(2, 1), (2, 1)]
    (row,) = result["comparison"]
    assert (row["side"], row["baseline"]) == ("govinda", "stock")
    for kind in ("cold", "warm"):
        assert isinstance(row[kind]["added_s"], float) and isinstance(row[kind]["met"], bool)
        assert row[kind]["phases_added_s"]["init_engine_s"] == 0.0
    assert row["jit"]["side"]["ours"] == 2 and row["jit"]["met"] is False
    md = (tmp_path / "reports" / "st-startup.md").read_text()
    assert "| govinda | cold |" in md and "| stock | warm |" in md and "`_gather_kv_kernel` (ours)" in md
    assert "govinda vs stock" in md and "govinda vs stock" in done.stdout  # the comparison is printed too
    assert "| 2 / 1 |" in md and "0 (no engine line)" in md
    late = md.split("## Our kernels compiled after the engine started")[1].split("##")[0]
    assert "- govinda cold (engine started at +" in late and "`_gather_kv_kernel` (+" in late
    assert "_store_kv_int8_kernel" not in late
    assert "  - `_gather_kv_kernel` against the background's: stride_block: i32 -> i32/16" in late


def test_only_one_side_per_call_and_report_only_joins(tmp_path):
    sides = tmp_path / "sides.json"
    sides.write_text(json.dumps({
        "name": "split", "model": "fake-model", "server_command": _launcher(tmp_path), "health_timeout_s": 60,
        "stop_grace_s": 5, "sides": [{"name": "a", "env": {"GOVINDA_DISABLE": "1"}}, {"name": "b", "env": {"GOVINDA_DISABLE": "0"}}],
    }))
    common = ["--sides", str(sides), "--name", "split", "--work-dir", str(tmp_path / "work"), "--prompt-tokens", "8"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert startup.main(common + ["--port", str(free_port()), "--report-dir", str(first), "--only", "a"]) == 0
    assert startup.main(common + ["--port", str(free_port()), "--report-dir", str(second), "--only", "b"]) == 0
    alone = startup_report.load_result(second / "split.json")
    assert [s["name"] for s in alone["sides"]] == ["b"] and alone["comparison"][0]["cold"]["added_s"] is None
    joined = tmp_path / "joined"
    assert startup.main(["--report-only", str(first / "split.json"), str(second / "split.json"), "--report-dir", str(joined)]) == 0
    result = startup_report.load_result(joined / "split.json")
    assert [s["name"] for s in result["sides"]] == ["a", "b"] and len(result["runs"]) == 2
    assert isinstance(result["comparison"][0]["warm"]["added_s"], float)
    with pytest.raises(SystemExit, match="no side named"):
        startup.main(["--report-only", str(first / "split.json"), "--baseline", "zz"])
    # The same side from another call is a second start of it, kept beside the first (not replacing it).
    again = tmp_path / "again"
    assert startup.main(["--report-only", str(first / "split.json"), str(second / "split.json"), str(first / "split.json"),
                         "--report-dir", str(again)]) == 0
    result = startup_report.load_result(again / "split.json")
    assert [(s["name"], s.get("repeat_of")) for s in result["sides"]] == [("a", None), ("b", None), ("a_2", "a")]
    (row,) = result["comparison_means"]
    assert row["sides"] == ["b"] and row["baseline_sides"] == ["a", "a_2"] and row["cold"]["baseline_n"] == 2
    assert "## Means over repeated starts" in (again / "split.md").read_text()


def test_sides_file_may_not_set_the_caches(tmp_path):
    sides = tmp_path / "sides.json"
    sides.write_text(json.dumps({"model": "m", "env": {"TRITON_CACHE_DIR": "/keep"},
                                 "sides": [{"name": "a"}, {"name": "b", "env": {"GOVINDA_CACHE_DIR": "/mine"}}]}))
    with pytest.raises(SystemExit, match="GOVINDA_CACHE_DIR, TRITON_CACHE_DIR"):
        startup.main(["--sides", str(sides)])


def _result(**health):
    """A result of two sides; health: {"side_kind": seconds or None}."""
    def side(name, jit_ours):
        starts = []
        for kind in ("cold", "warm"):
            events = [{"kernel": "_gather_kv_kernel", "ours": True}] * jit_ours + [{"kernel": "k", "ours": False}]
            starts.append({"start": kind, "status": "ok", "problems": [], "launch_to_health_s": health.get(f"{name}_{kind}"),
                           "phases": {"init_engine_s": 10.0}, "jit": {"count": len(events), "ours": jit_ours, "events": events}})
        return {"name": name, "starts": starts}

    return {"name": "r", "baseline": "stock", "sides": [side("stock", 0), side("govinda", health.get("ours", 0))]}


def test_comparison_against_the_targets():
    (row,) = startup_report.compare(_result(stock_cold=100.0, govinda_cold=119.5, stock_warm=40.0, govinda_warm=43.5))
    assert row["cold"]["added_s"] == 19.5 and row["cold"]["met"] is True and row["cold"]["ratio"] == 1.195
    assert row["warm"]["added_s"] == 3.5 and row["warm"]["met"] is False
    assert row["jit"]["met"] is True and row["jit"]["side"]["count"] == 2
    (row,) = startup_report.compare(_result(stock_cold=100.0, govinda_cold=None, ours=1))
    assert row["cold"]["added_s"] is None and row["cold"]["met"] is None and row["warm"]["met"] is None
    assert row["jit"]["met"] is False and row["jit"]["side"]["our_kernels"] == ["_gather_kv_kernel"]
    lines = startup_report.comparison_lines({"name": "r", "baseline": "stock", "sides": _result()["sides"]})
    assert "no data" in lines[-1]


def test_means_over_sides_of_one_configuration():
    def side(name, disable, cold, warm, status="ok"):
        return {"name": name, "env": {"GOVINDA_DISABLE": disable}, "server_args": ["--x"],
                "starts": [{"start": "cold", "status": status, "launch_to_health_s": cold},
                           {"start": "warm", "status": "ok", "launch_to_health_s": warm}]}

    result = {"name": "r", "baseline": "fa3", "sides": [
        side("fa3", "1", 120.0, 60.0), side("ours", "0", 130.0, 59.0), side("fa3_again", "1", 110.0, 52.0),
        side("ours_again", "0", 104.0, 61.0), side("ours_failed", "0", 10.0, 62.0, status="failed")]}
    (row,) = startup_report.compare_means(result)
    assert row["sides"] == ["ours", "ours_again", "ours_failed"] and row["baseline_sides"] == ["fa3", "fa3_again"]
    cold, warm = row["cold"], row["warm"]
    # A start that did not come up counts in no mean.
    assert (cold["n"], cold["mean_s"], cold["baseline_mean_s"], cold["added_s"]) == (2, 117.0, 115.0, 2.0)
    assert cold["met"] is True and cold["baseline_spread_s"] == 10.0 and cold["within_spread"] is True
    assert (warm["n"], warm["mean_s"], warm["added_s"], warm["met"]) == (3, 60.67, 4.67, False)
    assert warm["baseline_spread_s"] == 8.0 and warm["within_spread"] is True
    lines = startup_report.means_lines(result)
    assert lines[-1].startswith("| ours + ours_again + ours_failed vs fa3 + fa3_again | 117.0 (2) vs 115.0 (2), +2.0: met")
    # A record without its flags is a server of its own, never a repeat.
    unrecorded = dict(result, sides=[s if s["name"] != "ours_again" else {k: v for k, v in s.items() if k != "server_args"}
                                     for s in result["sides"]])
    assert [row["sides"] for row in startup_report.compare_means(unrecorded)] == [["ours", "ours_failed"], ["ours_again"]]
    # Flags differ: another server, so no repeats and no means table.
    result["sides"][2]["server_args"] = ["--y"]
    result["sides"] = result["sides"][:3]
    assert startup_report.compare_means(result) == [] and startup_report.means_lines(result) == []


def test_h200_script_runs_one_side_of_the_dense_shape(tmp_path):
    script = REPO_ROOT / "scripts" / "h200" / "startup.sh"
    assert subprocess.run(["sh", "-n", str(script)]).returncode == 0
    text = script.read_text()
    sides_file = REPO_ROOT / "scripts" / "h200" / "ab_dense128_bench_serve.yaml"
    assert str(sides_file.relative_to(REPO_ROOT)) in text and "bench.startup" in text
    config = startup.config_from_args(startup.build_arg_parser().parse_args(["--sides", str(sides_file)]))
    assert config.name == "h200-dense128-bench-serve-startup" and config.model == "/tmp/llama8b-shape"
    assert {"govinda", "fa3_bf16"} <= {s.name for s in config.sides} and config.baseline_name() == "fa3_bf16"
    done = subprocess.run(["sh", str(script)], cwd=REPO_ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "usage" in done.stderr
    # SHAPE=qwen35 picks the 64-layer sides file, whose model is the carried folder itself.
    qwen = startup.config_from_args(startup.build_arg_parser().parse_args(
        ["--sides", str(REPO_ROOT / "scripts" / "h200" / "ab_qwen35_64layer_bench_serve.yaml")]))
    assert "fa3_bf16" in {s.name for s in qwen.sides} and "ab_qwen35_64layer_bench_serve.yaml" in text
    assert "--baseline fa3_bf16" in text  # the Qwen3.5 file's first side is TRITON_ATTN
    # Its start-up sides file: FA3, the overlay, FA3 again (the A/A side), FA3 the baseline.
    aa = startup.config_from_args(startup.build_arg_parser().parse_args(
        ["--sides", str(REPO_ROOT / "scripts" / "h200" / "ab_qwen35_64layer_startup.yaml")]))
    assert [s.name for s in aa.sides] == ["fa3_bf16", "govinda", "fa3_bf16_again"] and aa.baseline_name() == "fa3_bf16"
    assert aa.model == qwen.model and aa.server_args == qwen.server_args
    done = subprocess.run(["sh", str(script), "govinda"], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "SHAPE": "qwen3"})
    assert done.returncode == 2 and "SHAPE must be dense128 or qwen35" in done.stderr


def test_engine_start_read_from_a_real_server_log():
    """The engine's start line of the H200's Qwen3.5 cold start (vLLM 0.26), in the launch's year."""
    from bench import startup_compiles

    log = (REPO_ROOT / "reports" / "h200" / "startup_qwen35" / "govinda.cold.server.log").read_text()
    launched = time.mktime(time.strptime("2026-12-06 09:37:05", "%Y-%m-%d %H:%M:%S"))
    assert startup_compiles.engine_start_epoch(log, launched) - launched == 67.0  # 09:38:12
    assert startup_compiles.engine_start_epoch("no engine here\n", launched) is None


def test_an_engine_compile_is_explained_against_the_closest_background_compile():
    from bench import startup_compiles

    def compile_of(kernel, warps=4, **args):
        return {"kernel": kernel, "spec": {"args": args, "num_warps": warps, "num_stages": 1}}

    engine = compile_of("k", n="i32", stride="i32/16")
    background = [compile_of("k", warps=8, n="i32", stride="i32"), compile_of("k", stride="i32/16"),
                  compile_of("other", n="i32", stride="i32/16")]
    # The second differs in one way (n was 1 there, so Triton folded it), the first in two.
    assert startup_compiles.unlike_background(engine, background) == "n: folded (== 1) -> i32"
    assert startup_compiles.unlike_background(engine, background[2:]) == "no background compile of this kernel"
    assert startup_compiles.unlike_background(engine, [compile_of("k", n="i32", stride="i32/16")]) == (
        "same arguments and options (a constexpr or the source differs)")
    assert startup_compiles.unlike_background(engine, [{"kernel": "k", "spec": None}]) == "specialization not readable"
