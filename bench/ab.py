r"""A/B runner: start the server once per side, verify its environment, benchmark, compare.

For each side in turn:
  1. give it its own compile caches (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR
     under ``<work-dir>/<side>/cache``, wiped first unless --keep-caches), so no side can load
     artefacts compiled by another;
  2. start ``SERVER_CMD MODEL PORT [server_args...]`` in a new process group, output to
     ``<work-dir>/<side>/server.log``;
  3. while waiting for ``/health``, and once more when it answers, read the real environment of
     every process of the server (bench/server_env.py, psutil: the launched process, its
     descendants and its process group) and REFUSE the side if any declared variable differs:
     a side's own variables must have its values, variables that only other sides set must be
     absent, and the cache variables must point into this side's cache dir;
  4. run the workload: the tiers (default) through ``vllm bench serve`` of the installed vLLM, one
     run of the tool per tier (bench/serve_tiers.py; its saved JSON is the tier's record), or
     bench/greedy_agreement.py (``bench: {workload: greedy}``, our own client);
  5. stop the server (SIGTERM to the group, SIGKILL after --stop-grace seconds);
  6. count log lines matching the configured regexes (e.g. the overlay's status line) and read
     the overlay's dispatch counters from the side's GOVINDA_CACHE_DIR/counters/*.json.
Sides can run one per invocation (``--only NAME``): the other sides' records are kept from the
earlier JSON, so a run fits a time-limited machine session. Or all at once (``--parallel``,
``parallel: true``): side i on port PORT+i with ``CUDA_VISIBLE_DEVICES=i`` (unless its env sets
it), one GPU each; the sides then share the host's CPUs but no GPU.

Then writes ``<report-dir>/<name>.json`` (everything, rewritten after every side),
``<name>.md`` (per tier: output tok/s, TTFT P99, TPOT P99, completion, ratios to the baseline
side, and the SLA verdict: P99s within 1.5x of the baseline's and completion >= 99 %) and
``<name>.png`` (when matplotlib is importable). ``--report-only NAME.json [MORE.json ...]`` rebuilds
md/png (from several: one report of the sides of all, e.g. one side measured per device call).

Capacity sweep (issue #27; scripts/h200/ab_*_capacity.yaml): ``kv_cache_memory_bytes: N`` pins
every side's KV memory (``--kv-cache-memory-bytes N`` on each server), ``bench: {max_concurrency:
[1, 2, ...], client: session, sample_metrics: true, tier_seeds: point}`` sweeps concurrency in one
persistent ``vllm bench serve`` client while sampling the server's /metrics, and ``capacity:
{candidate: SIDE, bf16_sides: [...]}`` replaces the tier tables by the capacity report
(bench/ab_capacity.py, ab_capacity_report.py): KV capacity per side from its log, every point's
numbers and server state, where the bf16 sides run out of KV cache, the targets, one PNG. A side's
sweep can be split over calls (``--input-lens``, ``--max-concurrency``) and joined with
``--merge-tiers``.

Greedy workload (``bench: {workload: greedy, prompts: [...], max_tokens: 64, repeats: 2}``, keys
of greedy_agreement.GreedyConfig; prompts omitted = its built-in set): every side answers the
same prompts with temperature 0, and the report gives, per side against the baseline, how many
continuations are identical, the mean common token prefix, and each differing prompt's first
divergence (position, both sides' top-2 margins there, both continuations). No plot.

Sides file (YAML or JSON, schema in bench/sides_file.py; CLI flags override it; relative paths are relative to the repo root,
which is the server's working directory). The H200 validation, for example::

    name: h200-int8
    model: models/qwen3_5-27b-shape
    port: 8011
    server_command: scripts/start_vllm_dev.sh     # shell words or a list
    health_timeout_s: 900
    env: {GOVINDA_VLLM_CMD: "python3 -m vllm.entrypoints.cli.main"}    # every side
    server_args: [--served-model-name, m, --load-format, dummy, --language-model-only,
                  --additional-config, '{"gdn_prefill_backend": "triton"}']   # every side
    bench: {input_lens: [6144, 12288, 24576], output_len: 256, num_prompts: 10}   # + tokenizer: (default: model)
    log_patterns:          # counted in every side's log; name: regex, or {regex:, min:, max:}
      govinda_errors: {regex: 'govinda:? ERROR', max: 0}
      govinda_status: {regex: 'govinda \w+ \[pid \d+\] status:', max: 0}
    sides:
      - name: triton_bf16                        # the ROCm default path
        env: {GOVINDA_DISABLE: "1"}
        server_args: [--attention-backend, TRITON_ATTN]
      - name: upstream_int8
        env: {GOVINDA_DISABLE: "1"}
        server_args: [--attention-backend, TRITON_ATTN, --kv-cache-dtype, int8_per_token_head]
      - name: govinda                            # no backend flag: the overlay selects ours
        env: {GOVINDA_DISABLE: "0"}
        log_patterns:
          govinda_status: {regex: 'govinda \w+ \[pid \d+\] status:', min: 1}
          govinda_dispatch: {regex: 'dispatch counters:', min: 1}

Modules: ab_config (the run's configuration: sides file + CLI overrides), sides_file (the file's
schema), ab_side (one side, start to stop), server (a server's lifecycle), server_env (the
environment check), kv_log (KV facts from a server log), ab_sla (the tiers' verdicts), ab_capacity
(the capacity sweep's), ab_report / ab_greedy_report / ab_capacity_report / ab_tables / ab_plot
(the reports); this module runs the sides and holds the CLI.

An env value of null means "must be unset". The first side is the baseline unless --baseline.
Server command contract: it is called as ``CMD MODEL PORT [ARGS...]``; start_vllm_bench.sh takes
no ARGS (the DCU bench path is env-only), start_vllm_dev.sh appends them to ``vllm serve``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

from bench import ab_report, provenance, serve_tiers, server
from bench.ab_config import WORKLOADS, AbConfig, Overrides, build_config, parse_side_flag
from bench.ab_side import log, run_side, side_port

SCHEMA = "govinda.ab/1"


def run_ab(config: AbConfig, only: Optional[List[str]] = None, merge_with: Optional[str] = None,
           merge_tiers: bool = False) -> Dict[str, Any]:
    """Run every side (or only the named ones, keeping the other sides' records from an earlier
    result: one side per invocation fits a time-limited machine session; with ``merge_tiers`` a
    side's earlier record also keeps the tiers this run does not measure)."""
    report_dir = Path(config.report_dir)
    previous: Dict[str, Any] = {}
    source = Path(merge_with) if merge_with else (report_dir / f"{config.name}.json" if only else None)
    if source is not None and source.exists():
        previous = json.loads(source.read_text(encoding="utf-8"))
        log(f"keeping the other sides' results from {source}")
    elif merge_with:
        raise FileNotFoundError(f"--merge-with {merge_with}: no such file")
    this_run = {
        "date": datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        "host": {"node": platform.node(), "python": platform.python_version()},
        "repo": provenance.repo_state(),
        "device": provenance.device_info(),
        "inherited_govinda_env": {k: v for k, v in os.environ.items() if k.startswith("GOVINDA_")},
    }
    result: Dict[str, Any] = {
        "schema": SCHEMA,
        "name": config.name,
        "baseline": config.baseline_name(),
        "config": dataclasses.asdict(config),
        **this_run,
        "runs": previous.get("runs", []) + [dict(this_run, sides=[s.name for s in config.sides if not only or s.name in only])],
        "sides": [],
    }
    prior = {record["name"]: record for record in previous.get("sides", [])}
    records: List[Optional[Dict[str, Any]]] = [prior.get(side.name) for side in config.sides]
    # Sides of the earlier result that this config no longer has are kept, not silently dropped.
    extra = [r for name, r in prior.items() if name not in {s.name for s in config.sides}]

    def publish(with_png: bool):
        result["sides"] = [r for r in records if r is not None] + extra
        return ab_report.write_reports(result, report_dir, with_png=with_png)

    config.resolved_work_dir().mkdir(parents=True, exist_ok=True)
    to_run = [i for i, side in enumerate(config.sides) if not only or side.name in only]
    lock = threading.Lock()
    live: Dict[str, subprocess.Popen] = {}

    def one_side(count: int, i: int) -> Dict[str, Any]:
        side = config.sides[i]
        log(f"=== side {count}/{len(to_run)}: {side.name}" + (f" (port {side_port(config, side)})" if config.parallel else ""))
        (config.resolved_work_dir() / side.name).mkdir(parents=True, exist_ok=True)
        record = run_side(config, side, live if config.parallel else None)
        record["measured"] = {k: this_run[k] for k in ("date", "host", "repo")}
        if merge_tiers and prior.get(side.name):
            record = ab_report.merge_side_tiers(prior[side.name], record)
        with lock:
            records[i] = record
            publish(with_png=False)  # partial results survive a crash
        return record

    if config.parallel:
        _run_parallel([lambda count=count, i=i: one_side(count, i) for count, i in enumerate(to_run, start=1)],
                      live, config.stop_grace_s)
    else:
        for count, i in enumerate(to_run, start=1):
            if one_side(count, i).get("interrupted"):
                break
    paths = publish(with_png=True)
    log(f"wrote {paths['json']}, {paths['md']}" + (f", {paths['png']}" if paths["png"].exists() else ""))
    return result


def _run_parallel(jobs, live: Dict[str, subprocess.Popen], grace_s: float) -> None:
    """Run the side jobs in threads. Ctrl-C / SIGTERM reach the main thread only: it stops every
    live server, which makes each side's wait or workload fail and its thread finish."""
    threads = [threading.Thread(target=job, daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
    except KeyboardInterrupt:
        log("interrupted: stopping every side's server")
        for proc in list(live.values()):
            server.stop(proc, grace_s)
        for thread in threads:
            thread.join(timeout=grace_s + 30)


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="A/B serving benchmark (see the module docstring)")
    p.add_argument("--sides", help="YAML or JSON file defining the run and its sides")
    p.add_argument("--side", nargs="+", action="append", metavar="NAME [KEY=VALUE|-KEY ...]",
                   help="define a side on the command line (repeat; replaces the file's sides)")
    p.add_argument("--side-args", nargs=2, action="append", metavar=("NAME", "ARGS"),
                   help="extra server args for a side, one shell-quoted string (dev server only)")
    p.add_argument("--name", help="report name: reports/<name>.{json,md,png}")
    p.add_argument("--model")
    p.add_argument("--port", type=int)
    p.add_argument("--host")
    p.add_argument("--server-cmd", help="server command (shell words); called as CMD MODEL PORT [ARGS]")
    p.add_argument("--baseline", help="side the others are compared with (default: the first)")
    p.add_argument("--health-timeout", type=float, help="seconds to wait for /health (default 900)")
    p.add_argument("--stop-grace", type=float, help="seconds between SIGTERM and SIGKILL (default 30)")
    p.add_argument("--workload", choices=WORKLOADS, help="what runs against each side (default: tiers)")
    serve_tiers.add_tier_arguments(p, defaults=None)
    p.add_argument("--tokenizer", help="the tokenizer `vllm bench serve` builds prompts with (default: the model)")
    p.add_argument("--log-pattern", action="append", metavar="NAME=REGEX", help="count matching server log lines")
    p.add_argument("--work-dir", help="server logs and per-side caches (default $TMPDIR/govinda-ab/<name>)")
    p.add_argument("--log-dir", help="server logs as <side>.server.log (default: in the work dir, beside the caches)")
    p.add_argument("--report-dir", help="where <name>.json/.md/.png go (default <repo>/reports)")
    p.add_argument("--keep-caches", action="store_true", help="reuse each side's caches from an earlier run")
    p.add_argument("--env-check-scope", choices=("tree", "leader"))
    p.add_argument("--parallel", action="store_true",
                   help="run all sides at once, side i on port PORT+i and GPU i (CUDA_VISIBLE_DEVICES=i unless set)")
    p.add_argument("--only", action="append", metavar="SIDE",
                   help="run only this side (repeatable); the other sides' records are kept from "
                        "<report-dir>/<name>.json or --merge-with")
    p.add_argument("--merge-with", metavar="JSON", help="earlier result whose other sides' records to keep")
    p.add_argument("--merge-tiers", action="store_true",
                   help="a side of the earlier result (--merge-with, or a later --report-only file) keeps the tiers "
                        "this run does not measure: one side's sweep split over calls (--input-lens)")
    p.add_argument("--kv-cache-memory-bytes", type=int, metavar="N",
                   help="pin every side's KV memory (vLLM's --kv-cache-memory-bytes; overrides the sides file)")
    p.add_argument("--report-only", nargs="+", metavar="JSON",
                   help="rebuild md/png from result JSON(s); the sides of later files are added to the first's "
                        "(replacing sides of the same name): parts measured in separate device calls")
    return p


def overrides_from_args(args: argparse.Namespace) -> Overrides:
    bench = {key: getattr(args, key) for key in serve_tiers.TIER_FLAGS + ("tokenizer",) if getattr(args, key) is not None}
    concurrency = bench.get("max_concurrency")
    if concurrency is not None and len(concurrency) == 1:  # one value stays a plain int, as in a sides file
        bench["max_concurrency"] = concurrency[0]
    return Overrides(
        sides_file=args.sides,
        sides=[parse_side_flag(words) for words in args.side] if args.side else None,
        side_args=args.side_args or [],
        name=args.name, model=args.model, port=args.port, host=args.host, server_command=args.server_cmd,
        baseline=args.baseline, health_timeout_s=args.health_timeout, stop_grace_s=args.stop_grace,
        workload=args.workload, bench=bench, log_patterns=args.log_pattern or [],
        work_dir=args.work_dir, log_dir=args.log_dir, report_dir=args.report_dir, keep_caches=args.keep_caches,
        env_check_scope=args.env_check_scope, parallel=args.parallel,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )


def parse_config(argv: List[str]) -> AbConfig:
    """The run's configuration from command-line words (the sides file they name included)."""
    return build_config(overrides_from_args(build_arg_parser().parse_args(argv)))


def _exit_code(result: Dict[str, Any]) -> int:
    bad = [s for s in result["sides"] if s["status"] != "ok" or s.get("problems")]
    return 0 if not bad else 2


def main(argv: Optional[List[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.report_only:
        sources = [Path(path) for path in args.report_only]
        result = ab_report.merge_results([json.loads(path.read_text(encoding="utf-8")) for path in sources],
                                         merge_tiers=args.merge_tiers)
        if args.baseline:  # e.g. the saved baseline side is missing from the files joined here
            if args.baseline not in {side["name"] for side in result["sides"]}:
                raise SystemExit(f"--baseline: no side named {args.baseline!r} in these results")
            result["baseline"] = args.baseline
        paths = ab_report.write_reports(result, Path(args.report_dir) if args.report_dir else sources[0].parent)
        log(f"rebuilt {paths['md']}" + (f" and {paths['png']}" if paths["png"].exists() else ""))
        return _exit_code(result)
    config = build_config(overrides_from_args(args))
    unknown = set(args.only or []) - {side.name for side in config.sides}
    if unknown:
        raise SystemExit(f"--only: no side named {sorted(unknown)}")

    def on_sigterm(_signum, _frame):
        raise KeyboardInterrupt  # unwinds through run_side's finally: the server is stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    result = run_ab(config, only=args.only, merge_with=args.merge_with, merge_tiers=args.merge_tiers)
    return _exit_code(result)


if __name__ == "__main__":
    sys.exit(main())
