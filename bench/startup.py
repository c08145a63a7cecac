r"""Start-up benchmark (issue #29): each side's server started twice, from empty caches (cold) and
again on the caches the first start left (warm), and what each start took, phase by phase.

For each side, one after the other:
  1. one cache root, ``<work-dir>/<side>/cache``, holding VLLM_CACHE_ROOT (vLLM's torch.compile
     graphs and AOT artefacts; vLLM also points Triton's and Inductor's caches there while it
     compiles), TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and GOVINDA_CACHE_DIR (the overlay's
     self-test verdict and tuned launch configs); emptied before the cold start, kept for the warm one;
  2. start ``SERVER_CMD MODEL PORT [server_args...]`` through bench/server.py, as the A/B runner
     does (own process group, output to ``<side>.<start>.server.log``, the environment of every
     server process checked while it starts); time from launch to /health answering;
  3. send one ~1K-token and one ~4K-token completion of random words (max_tokens 8, one at a time),
     so that prefill and decode run and a kernel still compiled on first use shows in the log;
  4. stop the server and read its log (bench/startup_phases.py): model loading, torch.compile,
     CUDA-graph capture, vLLM's "init engine" total, the overlay's self-test and tuning, and every
     line of vLLM's JIT monitor ("... JIT compilation during inference: KERNEL"); and which of our
     kernels the start compiled, before the engine started or in it (bench/startup_compiles.py).
A side whose cold start never answered /health gets no warm start.

Writes ``<report-dir>/<name>.json`` (meta: command line, date, host, repo, device; per side and
start: launch-to-health seconds, phases, overlay lines, JIT lines, probe requests, the caches'
files and bytes before and after) and ``<name>.md`` (bench/startup_report.py), both rewritten after
every start, and prints the comparison: every side minus the baseline, cold and warm, and the
JIT lines, against the targets (cold <= +20 s, warm <= +3 s, no JIT line naming a kernel of kernels/).
Sides with the same environment and flags (e.g. ``fa3_bf16`` and ``fa3_bf16_again``, or one side
joined from two calls) are starts of one server: the report adds their means against the baseline's
and the spread of the baseline's own starts (the A/A), which a difference must exceed to be read.

    python -m bench.startup --sides scripts/h200/ab_dense128_bench_serve.yaml
    python -m bench.startup --sides FILE --only govinda         # one side per call; the others kept from the JSON
    python -m bench.startup --report-only A/NAME.json B/NAME.json --report-dir DIR   # join such calls
                                                    # (a side in two files: kept twice, <name>_2)

The sides file is the A/B runner's (bench/ab.py, schema in bench/sides_file.py): model, port,
server_command, server_args, env, sides with name/env/server_args; its ``bench`` settings are not
used, its log_patterns are counted per start. It may not set the cache variables: they are this
benchmark's. The name defaults to the file's name plus ``-startup``, so an A/B report of the same
file is not overwritten.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

from bench import ab_report, openai_http, provenance, server, startup_compiles, startup_phases, startup_report
from bench.ab_config import REPO_ROOT, AbConfig, Overrides, Side, build_config, expected_env, parse_side_flag
from bench.ab_side import count_log_patterns, side_port, side_process_env

SCHEMA = "govinda.startup/1"
STARTS = startup_report.STARTS
CACHE_VARS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor",
              "GOVINDA_CACHE_DIR": "govinda"}
PROMPT_TOKENS = (1024, 4096)
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 300.0
LOG_TAIL_LINES = 40
# Common words, most of them one token in real vocabularies; random picks make prompts that share
# no prefix, so no request is a prefix-cache hit of another.
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government number "
    "night point home water room mother area money story fact month lot right study book eye job word "
    "business issue side kind head house service friend father power hour game line end member law car "
    "city community name president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason research girl guy "
    "moment air teacher force education"
).split()


def log(message: str) -> None:
    print(f"[startup {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Probe:
    """The requests sent once a start answers /health."""

    prompt_tokens: List[int] = dataclasses.field(default_factory=lambda: list(PROMPT_TOKENS))
    max_tokens: int = MAX_TOKENS
    timeout_s: float = REQUEST_TIMEOUT_S


def prompt_text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def send_probes(base_url: str, probe: Probe) -> List[Dict[str, Any]]:
    """One completion per target length, one at a time. The first answer's prompt_tokens per word
    sizes the later prompts, so their token counts come near the targets under any tokenizer."""
    model = openai_http.discover_model(base_url)
    tokens_per_word: Optional[float] = None
    records = []
    for index, target in enumerate(probe.prompt_tokens):
        words = max(1, round(target / tokens_per_word)) if tokens_per_word else target
        payload = {"model": model, "prompt": prompt_text(words, seed=index), "max_tokens": probe.max_tokens,
                   "temperature": 0, "ignore_eos": True}
        record: Dict[str, Any] = {"target_tokens": target, "words": words, "max_tokens": probe.max_tokens}
        started = time.monotonic()
        try:
            answer = openai_http.http_json(base_url + "/v1/completions", payload, probe.timeout_s)
            usage = answer.get("usage") or {}
            record.update(prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"))
            if tokens_per_word is None and isinstance(record["prompt_tokens"], int) and record["prompt_tokens"] > 0:
                tokens_per_word = record["prompt_tokens"] / words
        except (RuntimeError, OSError, ValueError) as exc:  # HTTP error, refused, timed out, not JSON
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        record["seconds"] = round(time.monotonic() - started, 3)
        records.append(record)
    return records


def cache_root(config: AbConfig, side: Side) -> Path:
    return config.resolved_work_dir() / side.name / "cache"


def cache_dirs(config: AbConfig, side: Side) -> Dict[str, str]:
    root = cache_root(config, side)
    return {key: str(root / sub) for key, sub in CACHE_VARS.items()}


def cache_contents(dirs: Dict[str, str]) -> Dict[str, Dict[str, int]]:
    """Files and bytes under each cache dir: the evidence that a start was cold or warm."""
    out = {}
    for key, path in dirs.items():
        files = size = 0
        for root, _dirs, names in os.walk(path):
            for name in names:
                try:
                    size += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    continue
                files += 1
        out[key] = {"files": files, "bytes": size}
    return out


def start_log_path(config: AbConfig, side: Side, kind: str) -> Path:
    if config.log_dir:
        return Path(config.log_dir) / f"{side.name}.{kind}.server.log"
    return config.resolved_work_dir() / side.name / f"{kind}.server.log"


def _log_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _log_tail(path: Path) -> List[str]:
    return _log_text(path).splitlines()[-LOG_TAIL_LINES:]


def run_start(config: AbConfig, side: Side, kind: str, dirs: Dict[str, str], probe: Probe) -> Dict[str, Any]:
    """One start of a side's server: launch, /health, the probe requests, stop, its log read."""
    log_path = start_log_path(config, side, kind)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    port = side_port(config, side)
    command = config.server_command + [config.model, str(port)] + config.server_args + side.server_args
    record: Dict[str, Any] = {
        "start": kind, "status": "pending", "command": command, "cache_dirs": dirs, "log_path": str(log_path),
        "cache_before": cache_contents(dirs), "launch_to_health_s": None, "problems": [],
    }
    if server.port_in_use(config.host, port):
        record.update(status="error", error=f"port {port} is already in use: refusing to start")
        return record
    log(f"side {side.name}, {kind} start: {' '.join(command)} (log {log_path})")
    proc = None
    with open(log_path, "wb") as log_file:
        try:
            launched, launched_wall = time.monotonic(), time.time()
            proc = server.start(command, side_process_env(config, side, dirs), log_file, REPO_ROOT)
            ready = server.wait_until_ready(proc, config.host, port, expected_env(config, side), dirs,
                                            config.env_check_scope, config.health_timeout_s)
            record["launch_to_health_s"] = round(time.monotonic() - launched, 2)
            record["env_check"] = ready["env_check"]
            log(f"side {side.name}, {kind} start: /health after {record['launch_to_health_s']:.1f} s; probe requests")
            record["requests"] = send_probes(f"http://{config.host}:{port}", probe)
            failed = [r["error"] for r in record["requests"] if r.get("error")]
            record["status"] = "error" if failed else "ok"
            if failed:
                record["error"] = f"probe request failed: {failed[0]}"
        except server.Refused as exc:
            record.update(status="refused", error=str(exc), env_check=exc.env_check)
        except Exception as exc:  # record it, stop the server, go on
            record.update(status="error", error=f"{type(exc).__name__}: {exc}")
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop this server, then the run
            record.update(status="error", error="interrupted", interrupted=True)
        finally:
            if proc is not None:
                record["stop"] = server.stop(proc, config.stop_grace_s)
                if not server.wait_port_free(config.host, port, config.stop_grace_s):
                    record["problems"].append(f"port {port} still in use after stopping the server")
    if record.get("error"):
        log(f"side {side.name}, {kind} start: {record['status'].upper()}: {record['error']}")
    record["cache_after"] = cache_contents(dirs)
    record.update(startup_phases.read_log(log_path))
    if proc is not None:
        record["our_compiles"] = startup_compiles.summary(
            dirs.values(), startup_phases.our_kernel_names(), launched_wall, _log_text(log_path))
    record["log_counts"] = count_log_patterns(log_path, side.log_patterns)
    for name, count in record["log_counts"].items():
        if not count["ok"]:
            record["problems"].append(f"log pattern {name} ({count['regex']!r}) matched {count['count']} lines, "
                                      f"expected min {count['min']} max {count['max']}")
    if record["status"] != "ok":
        record["log_tail"] = _log_tail(log_path)
    return record


def run_side(config: AbConfig, side: Side, probe: Probe, publish) -> Dict[str, Any]:
    """Both starts of a side; ``publish(record)`` after each, so partial results survive a crash."""
    dirs = cache_dirs(config, side)
    root = cache_root(config, side)
    if root.exists():
        shutil.rmtree(root)
    for path in dirs.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    record: Dict[str, Any] = {"name": side.name, "env": side.env, "server_args": config.server_args + side.server_args,
                              "cache_root": str(root), "starts": []}
    for kind in STARTS:
        previous = record["starts"][-1] if record["starts"] else None
        if previous is not None and (previous.get("launch_to_health_s") is None or previous.get("interrupted")):
            record["starts"].append({"start": kind, "status": "skipped", "launch_to_health_s": None, "problems": [],
                                     "error": f"the {previous['start']} start did not answer /health"})
            continue
        record["starts"].append(run_start(config, side, kind, dirs, probe))
        publish(record)
    record["status"] = "ok" if all(s["status"] == "ok" and not s["problems"] for s in record["starts"]) else "error"
    publish(record)
    return record


def check_config(config: AbConfig) -> None:
    declared = set(config.env) | {key for side in config.sides for key in side.env}
    owned = sorted(declared & set(CACHE_VARS))
    if owned:
        raise SystemExit(f"the sides file sets {', '.join(owned)}: the start-up benchmark sets the caches itself")
    if config.parallel:
        raise SystemExit("parallel: the start-up benchmark runs its sides one after the other")


def run_meta(argv: List[str]) -> Dict[str, Any]:
    return {
        "command": [sys.executable, "-m", "bench.startup", *argv],
        "date": datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        "host": {"node": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "repo": provenance.repo_state(),
        "device": provenance.device_info(),
        "inherited_govinda_env": {k: v for k, v in os.environ.items() if k.startswith("GOVINDA_")},
    }


def run_startup(config: AbConfig, probe: Probe, argv: List[str], only: Optional[List[str]] = None,
                merge_with: Optional[str] = None) -> Dict[str, Any]:
    report_dir = Path(config.report_dir)
    source = Path(merge_with) if merge_with else (report_dir / f"{config.name}.json" if only else None)
    previous: Dict[str, Any] = {}
    if source is not None and source.exists():
        previous = startup_report.load_result(source)
        log(f"keeping the other sides' results from {source}")
    elif merge_with:
        raise SystemExit(f"--merge-with {merge_with}: no such file")
    meta = run_meta(argv)
    to_run = [side for side in config.sides if not only or side.name in only]
    result: Dict[str, Any] = {
        "schema": SCHEMA,
        "name": config.name,
        "baseline": config.baseline_name(),
        "targets": startup_report.TARGETS,
        "probe": dataclasses.asdict(probe),
        "health_poll_s": server.POLL_S,  # the resolution of launch_to_health_s
        "config": dataclasses.asdict(config),
        "meta": meta,
        "runs": previous.get("runs", []) + [dict(meta, sides=[s.name for s in to_run])],
        "sides": [],
    }
    prior = {record["name"]: record for record in previous.get("sides", [])}
    records: Dict[str, Dict[str, Any]] = {}
    order = [s.name for s in config.sides] + [name for name in prior if name not in {s.name for s in config.sides}]

    def publish(record: Dict[str, Any]) -> None:
        records[record["name"]] = dict(record, measured={k: meta[k] for k in ("date", "host", "repo")})
        result["sides"] = [records.get(name) or prior[name] for name in order if name in records or name in prior]
        startup_report.write_reports(result, report_dir)

    config.resolved_work_dir().mkdir(parents=True, exist_ok=True)
    for count, side in enumerate(to_run, start=1):
        log(f"=== side {count}/{len(to_run)}: {side.name}")
        record = run_side(config, side, probe, publish)
        if any(s.get("interrupted") for s in record["starts"]):
            break
    if not records:  # nothing ran (e.g. every side skipped): still write the joined result
        result["sides"] = [prior[name] for name in order if name in prior]
    paths = startup_report.write_reports(result, report_dir)
    log(f"wrote {paths['json']} and {paths['md']}")
    return result


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="start-up benchmark: cold and warm start per side (see the module docstring)")
    p.add_argument("--sides", help="the A/B runner's sides file (YAML or JSON)")
    p.add_argument("--side", nargs="+", action="append", metavar="NAME [KEY=VALUE|-KEY ...]",
                   help="define a side on the command line (repeat; replaces the file's sides)")
    p.add_argument("--name", help="report name: <report-dir>/<name>.{json,md} (default: the file's name + '-startup')")
    p.add_argument("--model")
    p.add_argument("--port", type=int)
    p.add_argument("--host")
    p.add_argument("--server-cmd", help="server command (shell words); called as CMD MODEL PORT [ARGS]")
    p.add_argument("--baseline", help="the side the others are compared with (default: the sides file's, else the first)")
    p.add_argument("--health-timeout", type=float, help="seconds to wait for /health per start (default 900)")
    p.add_argument("--stop-grace", type=float, help="seconds between SIGTERM and SIGKILL (default 30)")
    p.add_argument("--work-dir", help="per-side caches and logs (default $TMPDIR/govinda-startup/<name>)")
    p.add_argument("--log-dir", help="server logs as <side>.<cold|warm>.server.log (default: the side's work dir)")
    p.add_argument("--report-dir", help="where <name>.json/.md go (default <repo>/reports)")
    p.add_argument("--env-check-scope", choices=("tree", "leader"))
    p.add_argument("--prompt-tokens", type=int, nargs="+", metavar="N",
                   help=f"the probe prompts' lengths in tokens, about (default {' '.join(map(str, PROMPT_TOKENS))})")
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"tokens per probe answer (default {MAX_TOKENS})")
    p.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, help="seconds per probe request")
    p.add_argument("--only", action="append", metavar="SIDE",
                   help="run only this side (repeatable); the other sides' records are kept from "
                        "<report-dir>/<name>.json or --merge-with")
    p.add_argument("--merge-with", metavar="JSON", help="earlier result whose other sides' records to keep")
    p.add_argument("--report-only", nargs="+", metavar="JSON",
                   help="rebuild the Markdown from result JSON(s); the sides of later files are added to the first's "
                        "(a side already there is another start of it, kept as <name>_2, ...)")
    return p


def config_from_args(args: argparse.Namespace) -> AbConfig:
    config = build_config(Overrides(
        sides_file=args.sides,
        sides=[parse_side_flag(words) for words in args.side] if args.side else None,
        name=args.name, model=args.model, port=args.port, host=args.host, server_command=args.server_cmd,
        baseline=args.baseline, health_timeout_s=args.health_timeout, stop_grace_s=args.stop_grace,
        work_dir=args.work_dir, log_dir=args.log_dir, report_dir=args.report_dir, env_check_scope=args.env_check_scope,
    ))
    if not args.name:
        config.name = f"{config.name}-startup"
    if not config.work_dir:
        config.work_dir = str(Path(os.environ.get("TMPDIR", "/tmp")) / "govinda-startup" / config.name)
    check_config(config)
    return config


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_arg_parser().parse_args(argv)
    if args.report_only:
        sources = [Path(path) for path in args.report_only]
        result = ab_report.merge_results([startup_report.load_result(path) for path in sources], keep_repeats=True)
        for side in result["sides"]:
            if side.get("repeat_of"):
                log(f"side {side['repeat_of']!r} found again: kept as {side['name']} (another start of it)")
        if args.baseline:
            if args.baseline not in {side["name"] for side in result["sides"]}:
                raise SystemExit(f"--baseline: no side named {args.baseline!r} in these results")
            result["baseline"] = args.baseline
        paths = startup_report.write_reports(result, Path(args.report_dir) if args.report_dir else sources[0].parent)
        print("\n".join(startup_report.comparison_lines(result) + startup_report.means_lines(result)))
        log(f"rebuilt {paths['json']} and {paths['md']}")
        return 0
    config = config_from_args(args)
    unknown = set(args.only or []) - {side.name for side in config.sides}
    if unknown:
        raise SystemExit(f"--only: no side named {sorted(unknown)}")
    if args.max_tokens < 1 or any(n < 1 for n in args.prompt_tokens or [1]):
        raise SystemExit("--max-tokens and --prompt-tokens must be >= 1")
    probe = Probe(prompt_tokens=list(args.prompt_tokens or PROMPT_TOKENS), max_tokens=args.max_tokens,
                  timeout_s=args.request_timeout)

    def on_sigterm(_signum, _frame):
        raise KeyboardInterrupt  # unwinds through run_start's finally: the server is stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    result = run_startup(config, probe, argv, only=args.only, merge_with=args.merge_with)
    print("\n".join(startup_report.comparison_lines(result)))
    measured = [s for s in result["sides"] if not args.only or s["name"] in args.only]
    return 0 if all(s.get("status") == "ok" for s in measured) else 2


if __name__ == "__main__":
    sys.exit(main())
