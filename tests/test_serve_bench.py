"""CPU tests of the serving benchmark tools against tests/fake_openai_server.py.

Timing assertions only use bounds derived from the fake server's configured delays with wide
margins (a loaded 2-core CI machine adds latency, never removes it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

from bench import ab, ab_config, ab_side, ab_sla, openai_http, serve_tiers, server_env, sides_file  # noqa: E402
from bench.server import port_in_use  # noqa: E402
from overlay_testing import warm_python  # noqa: E402

FAKE_SERVER = REPO_ROOT / "tests" / "fake_openai_server.py"
# The synthetic Qwen3.5-shape tokenizer (8192 byte-level BPE tokens) `vllm bench serve` builds prompts with.
TOKENIZER = REPO_ROOT / "tests" / "models" / "qwen3_5-27b-shape"
PYTHON = sys.executable

# Field names that `vllm bench serve --save-result --save-detailed` writes (vllm/benchmarks/serve.py,
# 0.18.1 and 0.26).
VLLM_RESULT_FIELDS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
    "start_times", "generated_texts", "errors", "max_output_tokens_per_s", "max_concurrent_requests",
} | {
    f"{stat_}_{metric}_ms"
    for stat_ in ("mean", "median", "std", "p50", "p90", "p99")
    for metric in ("ttft", "tpot", "itl", "e2el")
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_run(count: int) -> int:
    """A port whose next ``count - 1`` ports are free too (a parallel A/B gives side k port + k; a
    lone free port's neighbour may be any process's, e.g. a client's ephemeral port)."""
    for _ in range(200):
        base, held = free_port(), []
        try:
            for offset in range(count):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no run of {count} free ports found")


def get_json(url: str):
    return openai_http.http_json(url, None, timeout_s=5)


def wait_for_health(port: int, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "fake server exited during start-up"
        if openai_http.health_ok("127.0.0.1", port):
            return
        time.sleep(0.1)
    raise AssertionError("fake server did not answer /health")


class FakeServer:
    def __init__(self, *flags: str, env=None, python=PYTHON) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [python, str(FAKE_SERVER), "fake-model", str(self.port), *flags],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        wait_for_health(self.port, self.proc)
        self.base_url = f"http://127.0.0.1:{self.port}"

    def requests(self):
        return get_json(self.base_url + "/debug/requests")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def fake_server_factory():
    servers = []

    def start(*flags: str, env=None, python=PYTHON) -> FakeServer:
        server = FakeServer(*flags, env=env, python=python)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def read_request_log(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def shared_heads(prompt_heads, chars: int = 32) -> int:
    """How many prompts start like another one (a shared first KV block would be a cache hit)."""
    heads = [h[:chars] for h in prompt_heads]
    return len(heads) - len(set(heads))


# ----------------------------------------------------------------------------- serve_tiers


def test_serve_tiers_runs_vllm_bench_serve(fake_server_factory, tmp_path, warm_bench_clients):
    """The installed vLLM's own client against the fake: what it sends, and what we keep."""
    ttft_s, token_delay_s, output_len = 0.08, 0.02, 5
    request_log = tmp_path / "requests.jsonl"
    # The fake runs forked from the warm interpreter that serves the clients (aiohttp and transformers
    # already imported: ~3 s less to start). Nothing here reads its /proc environment, which is the
    # warm server's; the env-checking cases start it with this interpreter. PYTHONUNBUFFERED as the
    # clients' environment has it (serve_tiers.client_env), so one warm interpreter serves both.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    server = fake_server_factory("--ttft", str(ttft_s), "--token-delay", str(token_delay_s),
                                 "--tokenizer", str(TOKENIZER), "--request-log", str(request_log),
                                 env=env, python=warm_python(env) or PYTHON)
    result_file = tmp_path / "result.json"
    code = serve_tiers.main([
        "--base-url", server.base_url, "--tokenizer", str(TOKENIZER), "--input-lens", "48,80",
        "--output-len", str(output_len), "--num-prompts", "2", "--work-dir", str(tmp_path / "work"),
        "--result-file", str(result_file), "--quiet",
    ])
    assert code == 0
    result = json.loads(result_file.read_text())
    assert result["tool"] == "vllm bench serve" and result["warmup"]["returncode"] == 0
    seen = read_request_log(request_log)
    # One warm-up request (its own run of the tool), then two per tier; every one is the random
    # dataset's text prompt, streamed with usage, ignore_eos and the requested output length.
    assert len(seen) == 1 + 2 + 2
    assert all(r["prompt_kind"] == "text" and r["stream"] and r["include_usage"] for r in seen)
    assert all(r["ignore_eos"] is True and r["max_tokens"] == output_len for r in seen)
    assert seen[0]["prompt_len"] == 48  # the warm-up runs at the first tier's length
    # No prompt starts like another: the warm-up is not the first measured prompt, tiers differ.
    assert shared_heads([r["prompt_head"] for r in seen]) == 0

    measured = seen[1:]
    for k, tier in enumerate(result["tiers"]):
        mine = measured[2 * k:2 * k + 2]
        assert tier["requested_input_len"] == (48, 80)[k] and tier["seed"] == 1 + k
        assert VLLM_RESULT_FIELDS <= set(tier)
        assert tier["completed"] == 2 and tier["failed"] == 0 and tier["completion_rate"] == 1.0
        # What the tool reports as sent is what the server counted with the same tokenizer.
        assert tier["input_lens"] == [r["prompt_len"] for r in mine]
        assert all(abs(n - tier["requested_input_len"]) <= 2 for n in tier["input_lens"])
        assert tier["output_lens"] == [output_len, output_len]
        assert all(len(itl) == output_len - 1 for itl in tier["itls"])
        assert all(ttft_s <= t < ttft_s + 5.0 for t in tier["ttfts"])
        assert tier["p99_tpot_ms"] >= 0.5 * token_delay_s * 1000
        assert tier["bench_serve"]["returncode"] == 0
        command = tier["bench_serve"]["command"]
        for flag in ("--ignore-eos", "--save-result", "--save-detailed"):
            assert flag in command
        assert command[command.index("--max-concurrency") + 1] == "1"
        assert command[command.index("--dataset-name") + 1] == "random"
    summary = serve_tiers.format_summary(result)
    assert " 48 " in summary and " 80 " in summary


def test_serve_tiers_records_a_failed_tool_run(tmp_path):
    config = serve_tiers.BenchConfig(
        tokenizer=str(TOKENIZER), input_lens=[16], num_prompts=2, warmup_requests=0, progress=False,
        vllm_command=[PYTHON, "-c", "import sys; print('no such tool'); sys.exit(3)"], work_dir=str(tmp_path),
    )
    (tier,) = serve_tiers.run(config)["tiers"]
    assert tier["completed"] == 0 and tier["completion_rate"] == 0.0
    assert "exit code 3" in tier["error"] and "no such tool" in tier["error"]
    result = {"config": {"sla_factor": 1.5, "min_completion": 0.99}, "baseline": "a",
              "sides": [{"name": "a", "status": "ok", "bench": {"tiers": [tier]}}]}
    (row,) = ab_sla.tier_rows(result)["16"]
    assert row["verdict"].startswith("ERROR: vllm bench serve exit code 3") and row["score"] == 0.0


FAKE_TOOL = """
import json, sys
a = sys.argv
def flag(name):
    return a[a.index(name) + 1]
n = int(flag("--num-prompts"))
if "--save-result" in a:
    with open(flag("--result-dir") + "/" + flag("--result-filename"), "w") as f:
        json.dump({"completed": n, "num_prompts": n, "failed": 0, "output_throughput": 10.0 * int(flag("--max-concurrency")),
                   "p99_ttft_ms": 100.0, "p99_tpot_ms": 10.0, "input_lens": [int(flag("--random-input-len"))] * n}, f)
"""


def test_serve_tiers_concurrency_list_runs_every_pair_and_reports_each(tmp_path):
    """max_concurrency as a list: each input length at each concurrency, num_prompts per slot."""
    config = serve_tiers.BenchConfig(
        tokenizer=str(TOKENIZER), input_lens=[16, 32], num_prompts=2, max_concurrency=[1, 4], warmup_requests=1,
        progress=False, vllm_command=[PYTHON, "-c", FAKE_TOOL], work_dir=str(tmp_path),
    )
    result = serve_tiers.run(config)
    pairs = [(t["requested_input_len"], t["requested_max_concurrency"], t["num_prompts"]) for t in result["tiers"]]
    assert pairs == [(16, 1, 2), (16, 4, 8), (32, 1, 2), (32, 4, 8)]
    for tier in result["tiers"]:
        command = tier["bench_serve"]["command"]
        assert command[command.index("--max-concurrency") + 1] == str(tier["requested_max_concurrency"])
    sides = [{"name": name, "status": "ok", "bench": result} for name in ("a", "b")]
    report = {"config": {"sla_factor": 1.5, "min_completion": 0.99}, "baseline": "a", "sides": sides}
    rows = ab_sla.tier_rows(report)
    assert list(rows) == ["16", "16@c4", "32", "32@c4"]
    assert rows["16@c4"][1]["output_throughput"] == 40.0 and rows["16@c4"][1]["verdict"] == "PASS"
    assert ab_sla.tier_title("16@c4") == "Input 16 tokens, concurrency 4" and ab_sla.tier_title("16") == "Input 16 tokens"
    with pytest.raises(ValueError, match="max_concurrency"):
        serve_tiers.BenchConfig(tokenizer="t", max_concurrency=[]).validate()


def test_sides_file_schema_gives_a_bounded_error(tmp_path):
    """Unknown keys, wrong types and bad regexes each name their place; the message stays short."""
    good = {"model": "m", "env": {"A": 1, "B": True, "C": None}, "sides": [{"name": "a"}, {"name": "b", "port": "9001"}]}
    parsed = sides_file.parse_sides(good, "good.yaml")
    assert sides_file.env_strings(parsed.env) == {"A": "1", "B": "1", "C": None} and parsed.sides[1].port == 9001
    cases = (({"sides": [{"name": "a", "colour": "red"}]}, "sides.0.colour"),
             ({"port": "eighty"}, "port"),
             ({"env_check_scope": "forest"}, "env_check_scope"),
             ({"log_patterns": {"x": {"regex": "("}}}, "log_patterns.x"),
             ({"log_patterns": {"x": "("}}, "log_patterns"),
             ({"bogus": 1}, "bogus"))
    for data, where in cases:
        with pytest.raises(ValueError, match=re.escape(where)) as caught:
            sides_file.parse_sides(data, "bad.yaml")
        assert str(caught.value).startswith("bad.yaml: invalid sides file: ")
    many = {f"k{i}": i for i in range(50)}
    message = str(pytest.raises(ValueError, sides_file.parse_sides, many, "bad.yaml").value)
    assert "(and 45 more)" in message and len(message) < 6 * sides_file.ERROR_CHARS
    with pytest.raises(ValueError, match="mapping at the top level"):
        sides_file.parse_sides([1, 2], "list.yaml")
    path = tmp_path / "sides.yaml"
    path.write_text("model: m\nsides: [{name: a}, {name: a2, env: {X: 1}}]\nhealth_timeout_s: 5\n")
    config = ab.parse_config(["--sides", str(path)])
    assert config.health_timeout_s == 5.0 and config.sides[1].env == {"X": "1"}
    path.write_text("model: m\nsides: [{name: a, envv: {}}, {name: b}]\n")
    with pytest.raises(ValueError, match="sides.0.envv"):
        ab.parse_config(["--sides", str(path)])


# ----------------------------------------------------------------------------- ab: env checks


def _config(tmp_path, sides, **overrides) -> ab_config.AbConfig:
    values = dict(name="t", model="m", sides=sides, work_dir=str(tmp_path / "work"), report_dir=str(tmp_path / "rep"))
    values.update(overrides)
    return ab_config.AbConfig(**values)


def test_expected_env_and_problems(tmp_path):
    a = ab_config.Side("a", env={"GOVINDA_DISABLE": "1"})
    b = ab_config.Side("b", env={"GOVINDA_DISABLE": "0", "GOVINDA_PATCHES_FILE": "p.yaml"})
    config = _config(tmp_path, [a, b])
    assert ab_config.expected_env(config, a) == {"GOVINDA_DISABLE": "1", "GOVINDA_PATCHES_FILE": None}
    assert ab_config.expected_env(config, b) == {"GOVINDA_DISABLE": "0", "GOVINDA_PATCHES_FILE": "p.yaml"}

    caches = ab_side.side_cache_dirs(config, a)
    assert caches != ab_side.side_cache_dirs(config, b)
    good = dict(caches, GOVINDA_DISABLE="1")
    assert server_env.env_problems(good, ab_config.expected_env(config, a), caches) == []
    # vLLM repoints Triton/Inductor caches inside VLLM_CACHE_ROOT: still this side's.
    inside = dict(good, TRITON_CACHE_DIR=caches["VLLM_CACHE_ROOT"] + "/torch_compile_cache/x/triton_cache")
    assert server_env.env_problems(inside, ab_config.expected_env(config, a), caches) == []

    wrong_value = server_env.env_problems(dict(good, GOVINDA_DISABLE="0"), ab_config.expected_env(config, a), caches)
    leaked = server_env.env_problems(dict(good, GOVINDA_PATCHES_FILE="p.yaml"), ab_config.expected_env(config, a), caches)
    missing = server_env.env_problems({k: v for k, v in good.items() if k != "GOVINDA_DISABLE"}, ab_config.expected_env(config, a), caches)
    shared_cache = server_env.env_problems(
        dict(good, TRITON_CACHE_DIR=ab_side.side_cache_dirs(config, b)["TRITON_CACHE_DIR"]), ab_config.expected_env(config, a), caches
    )
    assert len(wrong_value) == 1 and "GOVINDA_DISABLE" in wrong_value[0]
    assert len(leaked) == 1 and "requires it unset" in leaked[0]
    assert len(missing) == 1 and "GOVINDA_DISABLE=None" in missing[0]
    assert len(shared_cache) == 1 and "TRITON_CACHE_DIR" in shared_cache[0]


def test_proc_environ_matches_what_the_server_sees(tmp_path, fake_server_factory, monkeypatch):
    a = ab_config.Side("a", env={"GOVINDA_DISABLE": "1", "GOVINDA_LOG_LEVEL": "debug"})
    b = ab_config.Side("b", env={"GOVINDA_PATCHES_FILE": "p.yaml"})
    config = _config(tmp_path, [a, b])
    caches = ab_side.side_cache_dirs(config, a)
    # A key exported in the runner's own shell must not leak into a side that did not set it.
    monkeypatch.setenv("GOVINDA_PATCHES_FILE", "exported-in-my-shell")
    env = ab_side.side_process_env(config, a, caches)
    assert "GOVINDA_PATCHES_FILE" not in env

    server = fake_server_factory(env=env)
    seen_by_server = get_json(server.base_url + "/debug/env")
    check = server_env.check_server_env(server.proc.pid, ab_config.expected_env(config, a), caches, "tree")
    assert check["ok"], check
    (proc,) = check["processes"]
    assert proc["pid"] == seen_by_server["pid"]
    for key in ("GOVINDA_DISABLE", "GOVINDA_LOG_LEVEL", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        assert proc["observed"][key] == seen_by_server["env"][key]
    assert "GOVINDA_PATCHES_FILE" not in seen_by_server["env"] and proc["observed"]["GOVINDA_PATCHES_FILE"] is None

    # The same server judged as side b (which needs GOVINDA_PATCHES_FILE) is refused.
    refused = server_env.check_server_env(server.proc.pid, ab_config.expected_env(config, b), caches, "tree")
    assert not refused["ok"]
    assert any("GOVINDA_PATCHES_FILE" in p for p in refused["processes"][0]["problems"])


def test_env_check_handles_renamed_workers_and_the_selftest_child(tmp_path, monkeypatch):
    """What the H200 run showed: vLLM's EngineCore renames itself with setproctitle, which leaves
    only a remnant in /proc/<pid>/environ; the overlay's self-test child runs with
    GOVINDA_DISABLE=1 on purpose (and so do its compiler children)."""
    side = ab_config.Side("on", env={"GOVINDA_DISABLE": "0"})
    config = _config(tmp_path, [side])
    caches = ab_side.side_cache_dirs(config, side)
    expected = ab_config.expected_env(config, side)
    good = dict(caches, GOVINDA_DISABLE="0", PATH="/usr/bin")
    remnant = {"PATH": "/usr/bin"}  # what the renamed EngineCore showed
    processes = {
        10: ("python3", "python3 -m vllm.entrypoints.cli.main serve m", good),
        11: ("VLLM::EngineCor", "VLLM::EngineCore", good),
        12: ("python3", "python3 -m govinda_patch selftest --json", dict(good, GOVINDA_DISABLE="1", GOVINDA_SELFTEST_CHILD="1")),
        13: ("gcc-real", "gcc -shared x.c", dict(good, GOVINDA_DISABLE="1", GOVINDA_SELFTEST_CHILD="1")),
    }
    monkeypatch.setattr(server_env, "server_processes", lambda root, scope: [{"pid": p, "comm": c} for p, (c, _, _) in processes.items()])
    monkeypatch.setattr(server_env, "cmdline", lambda pid: processes[pid][1])
    monkeypatch.setattr(server_env, "read_environ", lambda pid: processes[pid][2])

    verified = {}
    first = server_env.check_server_env(10, expected, caches, "tree", verified)
    assert first["ok"] and first["checked"] == 1 and first["environ_overwritten"] == [{"pid": 11, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore"}]
    # Seen before the rename: the earlier verdict stands once its environ is a remnant.
    processes[11] = ("python3", "python3 -c from multiprocessing.spawn import spawn_main", good)
    server_env.check_server_env(10, expected, caches, "tree", verified)
    processes[11] = ("VLLM::EngineCor", "VLLM::EngineCore", remnant)
    later = server_env.check_server_env(10, expected, caches, "tree", verified)
    assert later["ok"] and later["checked"] == 2 and later["environ_overwritten"] == []
    # A real mismatch in a readable process is still refused; the selftest marker alone is not a pass.
    processes[10] = ("python3", "python3 -m vllm.entrypoints.cli.main serve m", dict(good, GOVINDA_DISABLE="1"))
    refused = server_env.check_server_env(10, expected, caches, "tree", verified)
    assert not refused["ok"] and any("GOVINDA_DISABLE" in p for p in refused["processes"][0]["problems"])


# ----------------------------------------------------------------------------- ab: end to end


def _launcher(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _sides_file(tmp_path: Path, data) -> str:
    path = tmp_path / "sides.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_ab_two_sides_caches_log_counts_sla_and_report(tmp_path, warm_bench_clients):
    launcher = _launcher(tmp_path, "serve.sh",
                         f'exec "{PYTHON}" "{FAKE_SERVER}" --token-delay 0.002 --tokenizer "{TOKENIZER}" "$@"\n')
    logs = {name: tmp_path / f"{name}.requests.jsonl" for name in ("baseline", "govinda")}
    sides = _sides_file(tmp_path, {
        "name": "abtest",
        "model": "fake-model",
        "server_command": launcher,
        "health_timeout_s": 30,
        "stop_grace_s": 5,
        "bench": {"input_lens": [32], "output_len": 4, "num_prompts": 2, "warmup_requests": 0,
                  "tokenizer": str(TOKENIZER)},
        "log_patterns": {"govinda_status": "govinda:"},
        "sides": [
            {"name": "baseline", "env": {"GOVINDA_DISABLE": 1},
             "server_args": ["--ttft", "0.005", "--request-log", str(logs["baseline"])],
             "log_patterns": {"govinda_status": {"regex": "govinda:", "max": 0}}},
            # 100x the baseline's TTFT, and every second request fails.
            {"name": "govinda", "env": {"GOVINDA_DISABLE": 0, "GOVINDA_PATCHES_FILE": "p.yaml"},
             "server_args": ["--ttft", "0.5", "--fail-every", "2", "--request-log", str(logs["govinda"])],
             "log_patterns": {"govinda_status": {"regex": "govinda:", "min": 1}}},
        ],
    })
    port = free_port()
    code = ab.main(["--sides", sides, "--port", str(port), "--work-dir", str(tmp_path / "work"),
                    "--report-dir", str(tmp_path / "reports")])
    assert code == 0
    result = json.loads((tmp_path / "reports" / "abtest.json").read_text())
    base, gov = result["sides"]
    assert base["status"] == "ok" and gov["status"] == "ok"
    assert base["problems"] == [] and gov["problems"] == []
    # Exec'ing launcher: the checked process is the server itself, with this side's values.
    for side, disable, patches in ((base, "1", None), (gov, "0", "p.yaml")):
        assert side["env_check"]["ok"] and side["env_check"]["checked"] >= 1
        observed = side["env_check"]["processes"][0]["observed"]
        assert observed["GOVINDA_DISABLE"] == disable
        assert observed["GOVINDA_PATCHES_FILE"] == patches
        assert observed["VLLM_CACHE_ROOT"] == side["cache_dirs"]["VLLM_CACHE_ROOT"]
        assert str(tmp_path / "work" / side["name"]) in observed["TRITON_CACHE_DIR"]
    assert not set(base["cache_dirs"].values()) & set(gov["cache_dirs"].values())
    assert base["log_counts"]["govinda_status"]["count"] == 0
    assert gov["log_counts"]["govinda_status"]["count"] == 1
    # Counters the (fake) overlay wrote into the side's own GOVINDA_CACHE_DIR.
    assert base["govinda_counters"]["total"] == {}
    assert gov["govinda_counters"]["total"] == {"fake_decode": 1}
    # Each side was measured by `vllm bench serve`; the tier record is the JSON it saved.
    prompts = {}
    for side in (base, gov):
        tier = side["bench"]["tiers"][0]
        assert side["bench"]["tool"] == "vllm bench serve" and tier["label"] == side["name"]
        assert VLLM_RESULT_FIELDS <= set(tier)
        saved = json.loads(Path(tier["bench_serve"]["result_file"]).read_text())
        assert {k: tier[k] for k in saved} == saved
        seen = read_request_log(logs[side["name"]])
        assert tier["input_lens"] == [r["prompt_len"] for r in seen]  # failed requests included
        prompts[side["name"]] = [r["prompt_head"] for r in seen]
    assert base["bench"]["tiers"][0]["completed"] == 2 and base["bench"]["tiers"][0]["output_lens"] == [4, 4]
    gov_tier = gov["bench"]["tiers"][0]
    assert gov_tier["completed"] == 1 and gov_tier["failed"] == 1 and gov_tier["completion_rate"] == 0.5
    assert gov_tier["output_lens"] == [4, 0]
    # Same seed, same tokenizer: both sides got the same prompts.
    assert prompts["baseline"] == prompts["govinda"]

    # The tool's TTFT P99 of the govinda side breaks the 1.5x SLA, and half its requests failed.
    rows = {row["side"]: row for row in result["sla"]["32"]}
    assert rows["baseline"]["verdict"] == "PASS" and rows["baseline"]["score"] > 0
    assert rows["baseline"]["p99_ttft_ms"] == base["bench"]["tiers"][0]["p99_ttft_ms"]
    assert rows["govinda"]["verdict"].startswith("FAIL") and "TTFT" in rows["govinda"]["verdict"]
    assert "completion 50.0%" in rows["govinda"]["verdict"]
    assert rows["govinda"]["score"] == 0.0
    assert rows["govinda"]["p99_ttft_ms_ratio"] > 1.5
    assert rows["baseline"]["input_tokens_sent"] == serve_tiers.input_len_range(base["bench"]["tiers"][0])

    md_path = tmp_path / "reports" / "abtest.md"
    md = md_path.read_text()
    assert "## Input 32 tokens" in md and "| baseline | ok |" in md and "FAIL: completion 50.0% < 99%; TTFT P99" in md
    assert "measured with `vllm bench serve`" in md
    assert "- govinda: fake_decode=1" in md
    png = tmp_path / "reports" / "abtest.png"
    try:
        import matplotlib  # noqa: F401

        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "![A/B plot](abtest.png)" in md
    except ImportError:
        assert not png.exists() and "Plot skipped" in md

    md_path.unlink()
    assert ab.main(["--report-only", str(tmp_path / "reports" / "abtest.json")]) == 0
    assert md_path.read_text() == md


def test_ab_refuses_side_whose_server_env_differs(tmp_path, warm_bench_clients):
    # The launcher does not exec, and its child gets a variable only the other side may set:
    # the runner must look at the child's /proc environ and refuse the first side.
    launcher = _launcher(
        tmp_path, "leaky.sh",
        f'GOVINDA_PATCHES_FILE=p.yaml "{PYTHON}" "{FAKE_SERVER}" --ttft 0.001 --token-delay 0.001 "$@"\n',
    )
    port = free_port()
    code = ab.main([
        "--side", "clean", "GOVINDA_DISABLE=1",
        "--side", "patched", "GOVINDA_DISABLE=0", "GOVINDA_PATCHES_FILE=p.yaml",
        "--name", "refusal", "--model", "fake-model", "--port", str(port), "--server-cmd", launcher,
        "--input-lens", "16", "--output-len", "2", "--num-prompts", "1", "--warmup-requests", "0",
        "--tokenizer", str(TOKENIZER), "--health-timeout", "30",
        "--stop-grace", "5", "--work-dir", str(tmp_path / "work"), "--report-dir", str(tmp_path / "reports"),
    ])
    assert code == 2
    result = json.loads((tmp_path / "reports" / "refusal.json").read_text())
    clean, patched = result["sides"]
    assert clean["status"] == "refused" and "bench" not in clean
    assert "GOVINDA_PATCHES_FILE" in clean["error"] and "requires it unset" in clean["error"]
    offenders = [p for p in clean["env_check"]["processes"] if p["problems"]]
    assert offenders and all("fake_openai_server" in p["cmdline"] for p in offenders)
    assert patched["status"] == "ok" and patched["bench"]["tiers"][0]["completed"] == 1
    # The refused server (launcher and child) was stopped: the second side could bind the port.
    assert not port_in_use("127.0.0.1", port)
    md = (tmp_path / "reports" / "refusal.md").read_text()
    assert "| clean | refused |" in md and "NO DATA" in md


def test_ab_only_runs_one_side_and_keeps_the_others(tmp_path):
    # The greedy workload: what is tested here is the runner's bookkeeping, not the tool.
    launcher = _launcher(tmp_path, "serve.sh", f'exec "{PYTHON}" "{FAKE_SERVER}" "$@"\n')
    common = ["--side", "a", "GOVINDA_DISABLE=1", "--side", "b", "GOVINDA_DISABLE=0", "--name", "split",
              "--model", "fake-model", "--server-cmd", launcher, "--workload", "greedy", "--stop-grace", "5",
              "--work-dir", str(tmp_path / "work")]
    first = tmp_path / "first"
    assert ab.main(common + ["--port", str(free_port()), "--report-dir", str(first), "--only", "a",
                             "--log-dir", str(first / "logs")]) == 0
    partial = json.loads((first / "split.json").read_text())
    assert [s["name"] for s in partial["sides"]] == ["a"]
    assert "fake server: pid" in (first / "logs" / "a.server.log").read_text()
    assert "| a | ok |" in (first / "split.md").read_text()

    second = tmp_path / "second"
    assert ab.main(common + ["--port", str(free_port()), "--report-dir", str(second), "--only", "b",
                             "--merge-with", str(first / "split.json"), "--side-args", "b", "--ttft 0.002"]) == 0
    merged = json.loads((second / "split.json").read_text())
    assert [s["name"] for s in merged["sides"]] == ["a", "b"]
    assert merged["sides"][1]["server_args"] == ["--ttft", "0.002"]
    assert merged["sides"][0] == partial["sides"][0]  # side a's record is carried over untouched
    assert [run["sides"] for run in merged["runs"]] == [["a"], ["b"]]
    (row,) = merged["agreement"]
    assert row["side"] == "b" and row["baseline"] == "a" and row["identical"] == row["prompts"] > 0

    # The same report from the two files of separate calls (the second one alone, here: b only).
    alone = tmp_path / "alone"
    assert ab.main(common + ["--port", str(free_port()), "--report-dir", str(alone), "--only", "b"]) == 0
    rebuilt = tmp_path / "rebuilt"
    assert ab.main(["--report-only", str(first / "split.json"), str(alone / "split.json"),
                    "--report-dir", str(rebuilt)]) == 0
    joined = json.loads((rebuilt / "split.json").read_text())
    assert [s["name"] for s in joined["sides"]] == ["a", "b"] and joined["sides"][0] == partial["sides"][0]
    assert [run["sides"] for run in joined["runs"]] == [["a"], ["b"]]
    assert joined["agreement"][0]["identical"] == row["identical"]
    # Another baseline for the same files (a side of another run is missing, say).
    assert ab.main(["--report-only", str(first / "split.json"), str(alone / "split.json"),
                    "--baseline", "b", "--report-dir", str(rebuilt)]) == 0
    rebased = json.loads((rebuilt / "split.json").read_text())
    assert rebased["baseline"] == "b"
    assert [(r["side"], r["baseline"]) for r in rebased["agreement"]] == [("a", "b")]
    with pytest.raises(SystemExit, match="no side named 'c'"):
        ab.main(["--report-only", str(first / "split.json"), "--baseline", "c", "--report-dir", str(rebuilt)])


def test_ab_parallel_runs_every_side_at_once_on_its_own_port_and_gpu(tmp_path):
    # Side a's launcher waits until side b's has started: only a parallel run gets both up.
    marker = tmp_path / "b-started"
    launcher = _launcher(tmp_path, "serve.sh", f"""\
        if [ "$CUDA_VISIBLE_DEVICES" = 0 ]; then
            i=0; until [ -e "{marker}" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 7; sleep 0.1; done
        else
            touch "{marker}"
        fi
        exec "{PYTHON}" "{FAKE_SERVER}" "$@"
    """)
    port = free_port_run(2)
    code = ab.main(["--side", "a", "GOVINDA_DISABLE=1", "--side", "b", "GOVINDA_DISABLE=0", "--parallel",
                    "--name", "par", "--model", "fake-model", "--server-cmd", launcher, "--workload", "greedy",
                    "--port", str(port), "--stop-grace", "5", "--health-timeout", "30",
                    "--work-dir", str(tmp_path / "work"), "--report-dir", str(tmp_path / "reports")])
    assert code == 0
    result = json.loads((tmp_path / "reports" / "par.json").read_text())
    a, b = result["sides"]
    assert a["status"] == b["status"] == "ok"
    assert a["command"][-2:] == ["fake-model", str(port)] and b["command"][-2:] == ["fake-model", str(port + 1)]
    # The GPU assignment is a side variable like any other: declared, set and verified.
    for side, gpu in ((a, "0"), (b, "1")):
        assert side["env"]["CUDA_VISIBLE_DEVICES"] == gpu
        assert all(p["observed"]["CUDA_VISIBLE_DEVICES"] == gpu for p in side["env_check"]["processes"])
    assert result["agreement"][0]["identical"] == result["agreement"][0]["prompts"] > 0
    assert "the sides ran at the same time" in (tmp_path / "reports" / "par.md").read_text()
    with pytest.raises(ValueError, match="distinct ports"):
        ab.parse_config(["--sides", _sides_file(tmp_path, {"model": "m", "parallel": True, "port": 9000,
                                                            "sides": [{"name": "x", "port": 9001}, {"name": "y"}]})])


def test_ab_through_start_vllm_bench_script(tmp_path):
    """The locked bench script: only --port/--max-model-len reach the server, caches are kept."""
    fake_cmd = f"{PYTHON} {FAKE_SERVER}"
    sides = _sides_file(tmp_path, {
        "name": "script",
        "model": "fake-model",
        "env": {"GOVINDA_VLLM_CMD": fake_cmd},
        "bench": {"workload": "greedy", "prompts": ["one", "two"]},
        "health_timeout_s": 30,
        "stop_grace_s": 5,
        "sides": [{"name": "off", "env": {"GOVINDA_DISABLE": "1"}}, {"name": "on", "env": {"GOVINDA_DISABLE": "0"}}],
    })
    code = ab.main(["--sides", sides, "--port", str(free_port()), "--work-dir", str(tmp_path / "work"),
                    "--report-dir", str(tmp_path / "reports")])
    assert code == 0
    result = json.loads((tmp_path / "reports" / "script.json").read_text())
    for side in result["sides"]:
        assert side["status"] == "ok"
        (proc,) = side["env_check"]["processes"]  # the script exec'd: one process, the server
        assert "fake_openai_server" in proc["cmdline"]
        assert proc["observed"]["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)
        assert proc["observed"]["VLLM_CACHE_ROOT"] == side["cache_dirs"]["VLLM_CACHE_ROOT"]
        log = Path(side["log_path"]).read_text()
        assert "ignoring flags ['--max-model-len', '32768']" in log


def test_h200_bench_serve_sides_file(tmp_path, monkeypatch):
    """The 64-layer A/B through `vllm bench serve`: three sides, and log patterns that prove each
    side's attention backend, checked against the committed H200 server logs."""
    path = REPO_ROOT / "scripts" / "h200" / "ab_qwen35_64layer_bench_serve.yaml"
    config = ab.parse_config(["--sides", str(path)])
    assert config.workload() == "tiers" and config.baseline_name() == "triton_bf16"
    assert [s.name for s in config.sides] == ["triton_bf16", "govinda", "fa3_bf16"]
    assert config.bench["input_lens"] == [6144, 12288, 24576] and config.bench["output_len"] == 256
    assert serve_tiers.BenchConfig(tokenizer=config.model, **config.bench).max_concurrency == 1
    assert [s.env for s in config.sides] == [{"GOVINDA_DISABLE": "1"}, {"GOVINDA_DISABLE": "0"}, {"GOVINDA_DISABLE": "1"}]
    assert [s.server_args for s in config.sides] == [["--attention-backend", "TRITON_ATTN"], [], []]
    logs = REPO_ROOT / "reports" / "h200"
    triton, govinda, fa3 = config.sides
    counts = ab_side.count_log_patterns(logs / "serve64_triton_bf16.log", triton.log_patterns)
    assert all(c["ok"] for c in counts.values()), counts
    counts = ab_side.count_log_patterns(logs / "serve64_govinda.log", govinda.log_patterns)
    # That log predates the FA3 prefill (#15): its two patterns must not match it, and must match
    # the lines a Hopper worker now writes (the builder's choice line, the counters line).
    fa3_prefill = {"prefill_kernel_fa3", "prefill_fa3_dispatch"}
    assert all(c["ok"] for name, c in counts.items() if name not in fa3_prefill), counts
    assert all(counts[name]["count"] == 0 for name in fa3_prefill), counts
    import torch

    from govinda_patch.int8 import prefill_kernel
    from govinda_patch.kernel_package import import_kernel

    monkeypatch.setattr(prefill_kernel, "fa3_varlen", lambda: (print, "FA3 (vllm.vllm_flash_attn)"))
    choice = prefill_kernel.resolve(import_kernel("launch_configs").ARCH_TABLES["cuda_sm90"], 256, torch.device("cuda"), environ={})
    (tmp_path / "hopper.log").write_text(
        f"govinda INFO [pid 7] INT8 prefill kernel: {choice.description}\n"
        "govinda INFO [pid 7] dispatch counters: decode_attention_calls=64 prefill_attention_calls=32 prefill_fa3_calls=32\n"
    )
    counts = ab_side.count_log_patterns(tmp_path / "hopper.log", govinda.log_patterns)
    assert all(counts[name]["ok"] for name in fa3_prefill), counts
    # The stock logs also name FLASH_ATTN (for vit attention): that must not pass for the FA3 side.
    for log in ("serve64_triton_bf16.log", "serve64_govinda.log"):
        assert ab_side.count_log_patterns(logs / log, fa3.log_patterns)["attention_backend"]["count"] == 0
    # vLLM's line when it picks the backend itself, as the overlay's log shows it for CUSTOM.
    chosen = [line.replace("CUSTOM", "FLASH_ATTN") for line in (logs / "serve64_govinda.log").read_text().splitlines()
              if "Using CUSTOM attention backend" in line]
    assert chosen
    (tmp_path / "fa3.log").write_text("\n".join(chosen))
    assert ab_side.count_log_patterns(tmp_path / "fa3.log", fa3.log_patterns)["attention_backend"]["ok"]


# ----------------------------------------------------------------------------- start scripts


ARGV_DUMP = "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))"


def _run_script(tmp_path, script, *args, **env_overrides):
    dump = tmp_path / "dump.py"
    dump.write_text(ARGV_DUMP)
    # The case owns HOME, so the scripts' cache root comes from it (not from a caller's XDG_CACHE_HOME).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOVINDA_", "PYTORCH_", "TRITON_", "VLLM_")) and k != "XDG_CACHE_HOME"}
    env.update(HOME=str(tmp_path / "home"), GOVINDA_VLLM_CMD=f"{PYTHON} {dump}")
    env.update(env_overrides)
    out = subprocess.run([str(REPO_ROOT / "scripts" / script), *args], env=env, capture_output=True, text=True, timeout=30)
    return out.returncode, (json.loads(out.stdout) if out.returncode == 0 else out.stderr)


def test_bench_script_runs_the_locked_command(tmp_path):
    code, dump = _run_script(tmp_path, "start_vllm_bench.sh", "/models/m", "8123",
                             TRITON_CACHE_DIR="/keep/me", PYTORCH_HIP_ALLOC_CONF="", PYTHONPATH="/tmp/site")
    assert code == 0
    assert dump["argv"] == ["serve", "/models/m", "--port", "8123", "--max-model-len", "32768"]
    env = dump["env"]
    assert env["PYTHONPATH"] == f"{REPO_ROOT}:/tmp/site"
    assert env["TRITON_CACHE_DIR"] == "/keep/me"  # a caller's value wins
    assert env["PYTORCH_HIP_ALLOC_CONF"] == ""  # even an empty one
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "home"))
    assert Path(env["VLLM_CACHE_ROOT"]).is_dir()
    # The overlay's cache beside vLLM's, under the one persistent root.
    assert env["GOVINDA_CACHE_DIR"] == str(Path(env["VLLM_CACHE_ROOT"]).parent / "govinda")
    assert Path(env["GOVINDA_CACHE_DIR"]).is_dir()

    mine = str(tmp_path / "my-govinda-cache")
    code, dump = _run_script(tmp_path, "start_vllm_bench.sh", MODEL="/models/x", PORT="9001", GOVINDA_CACHE_DIR=mine)
    assert code == 0 and dump["argv"][:4] == ["serve", "/models/x", "--port", "9001"]
    assert dump["env"]["PYTORCH_HIP_ALLOC_CONF"] == "expandable_segments:True"
    assert dump["env"]["GOVINDA_CACHE_DIR"] == mine  # a caller's value wins

    code, stderr = _run_script(tmp_path, "start_vllm_bench.sh", "/models/m", "8123", "--enforce-eager")
    assert code == 2 and "locked" in stderr


def test_dev_script_appends_dev_args(tmp_path):
    code, dump = _run_script(
        tmp_path, "start_vllm_dev.sh", "/models/m", "8011", "--attention-backend", "TRITON_ATTN",
        GOVINDA_DEV_ARGS="--load-format dummy --additional-config '{\"gdn_prefill_backend\": \"triton\"}'",
    )
    assert code == 0
    assert dump["argv"] == [
        "serve", "/models/m", "--port", "8011", "--max-model-len", "32768",
        "--attention-backend", "TRITON_ATTN", "--load-format", "dummy",
        "--additional-config", '{"gdn_prefill_backend": "triton"}',
    ]
    assert dump["env"]["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
    assert dump["env"]["GOVINDA_CACHE_DIR"] == str(Path(dump["env"]["VLLM_CACHE_ROOT"]).parent / "govinda")
