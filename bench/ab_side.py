"""One side of an A/B run, start to stop: its caches and environment, its server, its workload,
and the evidence read afterwards (log pattern counts, the overlay's dispatch counters)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from bench import greedy_agreement, kv_log, serve_tiers, server
from bench.ab_config import REPO_ROOT, AbConfig, LogPattern, Side, expected_env

CACHE_SUBDIRS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
# The overlay's own cache (kernel self-test verdicts, dispatch counters): also per side, so the
# overlay side starts as cold as on a fresh machine, unless the sides file sets it explicitly.
OVERLAY_CACHE = ("GOVINDA_CACHE_DIR", "govinda")
LOG_MATCHES_KEPT = 5
LOG_TAIL_LINES = 60


def log(message: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def count_log_patterns(log_path: Path, patterns: List[LogPattern]) -> Dict[str, Any]:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    out = {}
    for pattern in patterns:
        regex = re.compile(pattern.regex)
        matches = [line for line in lines if regex.search(line)]
        out[pattern.name] = {
            "regex": pattern.regex,
            "count": len(matches),
            "min": pattern.min,
            "max": pattern.max,
            "ok": pattern.allows(len(matches)),
            "first_matches": [m[:300] for m in matches[:LOG_MATCHES_KEPT]],
        }
    return out


def read_overlay_counters(directory: Path) -> Dict[str, Any]:
    """The overlay's per-process dispatch counters (evidence that our kernels ran), summed."""
    per_process = []
    for path in sorted(directory.glob("*.json")):
        try:
            per_process.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            per_process.append({"file": path.name, "error": str(exc)})
    total: Dict[str, int] = {}
    for payload in per_process:
        for key, value in (payload.get("counters") or {}).items():
            total[key] = total.get(key, 0) + int(value)
    return {"total": total, "processes": per_process}


def _log_tail(log_path: Path) -> List[str]:
    try:
        return log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return []


def side_cache_dirs(config: AbConfig, side: Side) -> Dict[str, str]:
    root = config.resolved_work_dir() / side.name / "cache"
    dirs = {key: str(root / sub) for key, sub in CACHE_SUBDIRS.items()}
    key, sub = OVERLAY_CACHE
    if key not in config.env and not any(key in s.env for s in config.sides):
        dirs[key] = str(root / sub)
    return dirs


def side_process_env(config: AbConfig, side: Side, cache_dirs: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    # Drop every key any side declares, so a value exported in our own shell cannot leak into
    # a side that did not ask for it.
    for key in expected_env(config, side):
        env.pop(key, None)
    for source in (config.env, side.env):
        env.update({k: v for k, v in source.items() if v is not None})
    env.update(cache_dirs)
    env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file while the server runs
    return env


def side_port(config: AbConfig, side: Side) -> int:
    return side.port or config.port


def run_side(config: AbConfig, side: Side, live: Optional[Dict[str, subprocess.Popen]] = None) -> Dict[str, Any]:
    """One side, start to stop; ``live`` (parallel runs) holds its server while it runs."""
    side_dir = config.resolved_work_dir() / side.name
    cache_dirs = side_cache_dirs(config, side)
    cache_root = Path(cache_dirs["VLLM_CACHE_ROOT"]).parent
    if cache_root.exists() and not config.keep_caches:
        shutil.rmtree(cache_root)
    for path in cache_dirs.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    if "GOVINDA_CACHE_DIR" in cache_dirs:  # counters are evidence for this run only, even with --keep-caches
        shutil.rmtree(Path(cache_dirs["GOVINDA_CACHE_DIR"]) / "counters", ignore_errors=True)
    log_path = Path(config.log_dir) / f"{side.name}.server.log" if config.log_dir else side_dir / "server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = side_port(config, side)
    command = config.server_command + [config.model, str(port)] + config.server_args + side.server_args
    expected = expected_env(config, side)
    record: Dict[str, Any] = {
        "name": side.name,
        "status": "pending",
        "env": side.env,
        "expected_env": expected,
        "server_args": config.server_args + side.server_args,
        "command": command,
        "cache_dirs": cache_dirs,
        "log_path": str(log_path),
        "problems": [],
    }
    if server.port_in_use(config.host, port):
        record.update(status="error", error=f"port {port} is already in use: refusing to start")
        return record

    log(f"side {side.name}: starting {shlex.join(command)} (log {log_path})")
    proc = None
    session = None
    with open(log_path, "wb") as log_file:
        try:
            # A persistent client imports vLLM while the server starts (``client: session``).
            session = _early_session(config, side)
            proc = server.start(command, side_process_env(config, side, cache_dirs), log_file, REPO_ROOT)
            record["pid"] = proc.pid
            if live is not None:
                live[side.name] = proc
            record.update(server.wait_until_ready(proc, config.host, port, expected, cache_dirs,
                                                  config.env_check_scope, config.health_timeout_s,
                                                  abort=session.start_failure if session is not None else None))
            log(f"side {side.name}: ready after {record['startup_s']:.0f} s, environment verified; "
                f"running the {config.workload()} workload")
            record["bench"] = run_workload(config, side, port, session)
            record["status"] = "ok"
        except server.Refused as exc:
            record.update(status="refused", error=str(exc), env_check=exc.env_check)
            log(f"side {side.name}: REFUSED: {exc}")
        except Exception as exc:  # keep going: record the error, stop the server, next side
            record.update(status="error", error=f"{type(exc).__name__}: {exc}")
            log(f"side {side.name}: ERROR: {record['error']}")
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop this server, then the run
            record.update(status="error", error="interrupted", interrupted=True)
            log(f"side {side.name}: interrupted")
        finally:
            if session is not None:
                session.close()
            if proc is not None:
                log(f"side {side.name}: stopping server")
                record["stop"] = server.stop(proc, config.stop_grace_s)
                if not server.wait_port_free(config.host, port, config.stop_grace_s):
                    record["problems"].append(f"port {port} still in use after stopping the server")
                if live is not None:
                    live.pop(side.name, None)
    record["log_counts"] = count_log_patterns(log_path, side.log_patterns)
    record["kv_cache"] = kv_log.read_kv_cache_facts(log_path)
    if "GOVINDA_CACHE_DIR" in cache_dirs:
        record["govinda_counters"] = read_overlay_counters(Path(cache_dirs["GOVINDA_CACHE_DIR"]) / "counters")
    for name, count in record["log_counts"].items():
        if not count["ok"]:
            record["problems"].append(
                f"log pattern {name} ({count['regex']!r}) matched {count['count']} lines, "
                f"expected min {count['min']} max {count['max']}"
            )
    if record["status"] != "ok":
        record["log_tail"] = _log_tail(log_path)
    return record


def _tiers_config(config: AbConfig, side: Side, port: int) -> serve_tiers.BenchConfig:
    settings = {k: v for k, v in config.bench.items() if k != "workload"}
    # The random dataset builds its prompts with the served model's tokenizer; relative paths
    # are the server's, whose working directory is the repo root.
    settings["tokenizer"] = str(REPO_ROOT / settings.get("tokenizer", config.model))
    bench_config = serve_tiers.BenchConfig(
        base_url=f"http://{config.host}:{port}", label=side.name,
        work_dir=str(config.resolved_work_dir() / side.name / "bench_serve"), **settings
    )
    if 99.0 not in bench_config.percentiles:
        bench_config.percentiles.append(99.0)  # the SLA is on P99
    return bench_config


def _early_session(config: AbConfig, side: Side):
    if config.workload() != "tiers" or config.bench.get("client") != "session":
        return None
    bench_config = _tiers_config(config, side, side_port(config, side))
    log_path = Path(bench_config.work_dir) / "session.log"
    return serve_tiers.new_session(bench_config, log_path).start()


def run_workload(config: AbConfig, side: Side, port: int, session=None) -> Dict[str, Any]:
    if config.workload() == "greedy":
        settings = {k: v for k, v in config.bench.items() if k != "workload"}
        base_url = f"http://{config.host}:{port}"
        return greedy_agreement.run(greedy_agreement.GreedyConfig(base_url=base_url, label=side.name, **settings))
    return serve_tiers.run(_tiers_config(config, side, port), session)


