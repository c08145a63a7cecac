#!/usr/bin/env python3
r"""A/B runner: start the server once per side, verify its environment, benchmark, compare.

For each side in turn:
  1. give it its own compile caches (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR
     under ``<work-dir>/<side>/cache``, wiped first unless --keep-caches), so no side can load
     artefacts compiled by another;
  2. start ``SERVER_CMD MODEL PORT [server_args...]`` in a new process group, output to
     ``<work-dir>/<side>/server.log``;
  3. while waiting for ``/health``, and once more when it answers, read the real environment of
     every process of the server (``/proc/<pid>/environ`` of the launched process, its
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

Greedy workload (``bench: {workload: greedy, prompts: [...], max_tokens: 64, repeats: 2}``, keys
of greedy_agreement.GreedyConfig; prompts omitted = its built-in set): every side answers the
same prompts with temperature 0, and the report gives, per side against the baseline, how many
continuations are identical, the mean common token prefix, and each differing prompt's first
divergence (position, both sides' top-2 margins there, both continuations). No plot.

Sides file (YAML or JSON; CLI flags override it; relative paths are relative to the repo root,
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
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import greedy_agreement, openai_http, serve_tiers  # noqa: E402

SCHEMA = "govinda.ab/1"
CACHE_SUBDIRS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}
# The overlay's own cache (kernel self-test verdicts, dispatch counters): also per side, so the
# overlay side starts as cold as on a fresh machine, unless the sides file sets it explicitly.
OVERLAY_CACHE = ("GOVINDA_CACHE_DIR", "govinda")
LOG_MATCHES_KEPT = 5
LOG_TAIL_LINES = 60
# Parallel runs give side i GPU i through this variable unless the side's env sets it.
PARALLEL_GPU_VAR = "CUDA_VISIBLE_DEVICES"
# bench.workload: what runs against each side's server once it is up.
WORKLOADS = ("tiers", "greedy")
TIER_FLAGS = ("input_lens", "output_len", "num_prompts", "max_concurrency", "warmup_requests", "seed", "tokenizer")
# Set by the runner for each side, not by the sides file.
RUNNER_BENCH_KEYS = {"base_url", "progress", "label", "work_dir"}


def log(message: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- configuration


@dataclass
class LogPattern:
    name: str
    regex: str
    min: Optional[int] = None
    max: Optional[int] = None


@dataclass
class Side:
    name: str
    env: Dict[str, Optional[str]] = field(default_factory=dict)
    server_args: List[str] = field(default_factory=list)
    log_patterns: List[LogPattern] = field(default_factory=list)
    port: Optional[int] = None  # default: the run's port (parallel runs: port + the side's index)


@dataclass
class AbConfig:
    name: str
    model: str
    sides: List[Side]
    port: int = 8000
    host: str = "127.0.0.1"
    server_command: List[str] = field(default_factory=lambda: [str(REPO_ROOT / "scripts" / "start_vllm_bench.sh")])
    env: Dict[str, Optional[str]] = field(default_factory=dict)  # applied to every side
    server_args: List[str] = field(default_factory=list)  # appended for every side
    # workload (tiers | greedy) and the fields of serve_tiers.BenchConfig / greedy_agreement.GreedyConfig
    bench: Dict[str, Any] = field(default_factory=dict)
    log_patterns: List[LogPattern] = field(default_factory=list)
    baseline: Optional[str] = None
    health_timeout_s: float = 900.0
    stop_grace_s: float = 30.0
    sla_factor: float = 1.5
    min_completion: float = 0.99
    work_dir: Optional[str] = None
    log_dir: Optional[str] = None  # default: <work_dir>/<side>/server.log
    report_dir: str = str(REPO_ROOT / "reports")
    keep_caches: bool = False
    # "tree": every process of the server; "leader": only the launched process (after its exec).
    env_check_scope: str = "tree"
    # All sides at once, side i on port + i and GPU i (CUDA_VISIBLE_DEVICES, unless its env sets it;
    # the env check verifies it like any side variable): one call of a multi-GPU machine.
    parallel: bool = False

    def baseline_name(self) -> str:
        return self.baseline or self.sides[0].name

    def workload(self) -> str:
        return self.bench.get("workload", "tiers")

    def resolved_work_dir(self) -> Path:
        if self.work_dir:
            return Path(self.work_dir)
        return Path(os.environ.get("TMPDIR", "/tmp")) / "govinda-ab" / self.name


def _env_values(raw: Any, where: str) -> Dict[str, Optional[str]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: env must be a mapping")
    # YAML turns 1 into an int and true into a bool; the process sees strings.
    out: Dict[str, Optional[str]] = {}
    for key, value in raw.items():
        if value is None:
            out[str(key)] = None
        elif isinstance(value, bool):
            out[str(key)] = "1" if value else "0"
        else:
            out[str(key)] = str(value)
    return out


def _args_list(raw: Any) -> List[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return shlex.split(raw)
    return [str(x) for x in raw]


def _log_patterns(raw: Any, where: str) -> List[LogPattern]:
    if not raw:
        return []
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: log_patterns must map a name to a regex or {{regex, min, max}}")
    patterns = []
    for name, spec in raw.items():
        if isinstance(spec, str):
            patterns.append(LogPattern(str(name), spec))
        else:
            unknown = set(spec) - {"regex", "min", "max"}
            if unknown:
                raise ValueError(f"{where}: log pattern {name}: unknown keys {sorted(unknown)}")
            patterns.append(LogPattern(str(name), spec["regex"], spec.get("min"), spec.get("max")))
        re.compile(patterns[-1].regex)
    return patterns


def _merge_patterns(common: List[LogPattern], own: List[LogPattern]) -> List[LogPattern]:
    merged = {p.name: p for p in common}
    merged.update({p.name: p for p in own})
    return list(merged.values())


SIDE_KEYS = {"name", "env", "server_args", "log_patterns", "port"}
FILE_KEYS = {
    "name", "model", "port", "host", "server_command", "env", "server_args", "bench", "log_patterns",
    "baseline", "health_timeout_s", "stop_grace_s", "sla_factor", "min_completion", "work_dir",
    "report_dir", "log_dir", "keep_caches", "env_check_scope", "parallel", "sides",
}


def load_sides_file(path: str) -> Dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    try:
        import yaml  # vLLM depends on PyYAML; JSON is valid YAML too

        data = yaml.safe_load(text)
    except ImportError:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    return data


def parse_side_flag(words: List[str]) -> Side:
    """``--side NAME KEY=VALUE ...`` (``KEY=`` sets an empty value, ``-KEY`` requires it unset)."""
    name, *assignments = words
    env: Dict[str, Optional[str]] = {}
    for item in assignments:
        if item.startswith("-") and "=" not in item:
            env[item[1:]] = None
        elif "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
        else:
            raise ValueError(f"--side {name}: expected KEY=VALUE or -KEY, got {item!r}")
    return Side(name=name, env=env)


def build_config(args: argparse.Namespace) -> AbConfig:
    data: Dict[str, Any] = load_sides_file(args.sides) if args.sides else {}
    sides: List[Side] = []
    for i, raw in enumerate(data.get("sides") or []):
        unknown = set(raw) - SIDE_KEYS
        if unknown:
            raise ValueError(f"side {i}: unknown keys {sorted(unknown)}")
        where = f"side {raw.get('name', i)}"
        sides.append(
            Side(
                name=str(raw["name"]),
                port=int(raw["port"]) if raw.get("port") is not None else None,
                env=_env_values(raw.get("env"), where),
                server_args=_args_list(raw.get("server_args")),
                log_patterns=_log_patterns(raw.get("log_patterns"), where),
            )
        )
    if args.side:
        sides = [parse_side_flag(words) for words in args.side]  # CLI sides replace the file's
    by_name = {s.name: s for s in sides}
    for name, extra in args.side_args or []:
        if name not in by_name:
            raise ValueError(f"--side-args: no side named {name}")
        by_name[name].server_args += shlex.split(extra)
    if len(sides) < 2:
        raise ValueError("need at least two sides (from --sides FILE or --side flags)")
    if len(by_name) != len(sides):
        raise ValueError("side names must be unique")

    bench = dict(data.get("bench") or {})
    if args.workload:
        bench["workload"] = args.workload
    workload = bench.get("workload", "tiers")
    if workload not in WORKLOADS:
        raise ValueError(f"bench: unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
    settings_class = serve_tiers.BenchConfig if workload == "tiers" else greedy_agreement.GreedyConfig
    known_bench = {f.name for f in dataclasses.fields(settings_class)} - RUNNER_BENCH_KEYS
    unknown = set(bench) - known_bench - {"workload"}
    if unknown:
        raise ValueError(f"bench: unknown keys {sorted(unknown)} for workload {workload} (known: {sorted(known_bench)})")
    for key in TIER_FLAGS:
        value = getattr(args, key)
        if key == "max_concurrency" and value is not None and len(value) == 1:
            value = value[0]
        if value is not None:
            if workload != "tiers":
                raise ValueError(f"--{key.replace('_', '-')} applies to the tiers workload only")
            bench[key] = value

    common_patterns = _log_patterns(data.get("log_patterns"), "log_patterns")
    for item in args.log_pattern or []:
        name, _, regex = item.partition("=")
        common_patterns = _merge_patterns(common_patterns, [LogPattern(name, regex)])
    for side in sides:
        side.log_patterns = _merge_patterns(common_patterns, side.log_patterns)

    def pick(cli_value, key, default):
        if cli_value is not None:
            return cli_value
        return data.get(key, default)

    server_command = pick(args.server_cmd, "server_command", None)
    config = AbConfig(
        name=pick(args.name, "name", None) or "ab",
        model=pick(args.model, "model", None) or os.environ.get("MODEL") or "",
        sides=sides,
        port=int(pick(args.port, "port", 8000)),
        host=pick(args.host, "host", "127.0.0.1"),
        env=_env_values(data.get("env"), "env"),
        server_args=_args_list(data.get("server_args")),
        bench=bench,
        log_patterns=common_patterns,
        baseline=pick(args.baseline, "baseline", None),
        health_timeout_s=float(pick(args.health_timeout, "health_timeout_s", 900.0)),
        stop_grace_s=float(pick(args.stop_grace, "stop_grace_s", 30.0)),
        sla_factor=float(data.get("sla_factor", 1.5)),
        min_completion=float(data.get("min_completion", 0.99)),
        work_dir=pick(args.work_dir, "work_dir", None),
        log_dir=pick(args.log_dir, "log_dir", None),
        report_dir=pick(args.report_dir, "report_dir", str(REPO_ROOT / "reports")),
        keep_caches=bool(args.keep_caches or data.get("keep_caches", False)),
        env_check_scope=pick(args.env_check_scope, "env_check_scope", "tree"),
        parallel=bool(args.parallel or data.get("parallel", False)),
    )
    if server_command is not None:
        config.server_command = _args_list(server_command)
    if not config.model:
        raise ValueError("no model: give --model, model: in the sides file, or MODEL in the env")
    if config.baseline_name() not in by_name:
        raise ValueError(f"baseline {config.baseline_name()} is not a side")
    if config.parallel:
        for index, side in enumerate(sides):
            side.port = side.port or config.port + index
            side.env.setdefault(PARALLEL_GPU_VAR, str(index))
        if len({side.port for side in sides}) != len(sides):
            raise ValueError("parallel sides need distinct ports")
    if config.env_check_scope not in ("tree", "leader"):
        raise ValueError("env_check_scope must be 'tree' or 'leader'")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", config.name) or not all(
        re.fullmatch(r"[A-Za-z0-9._-]+", s.name) for s in sides
    ):
        raise ValueError("run and side names may only use letters, digits, '.', '_' and '-'")
    return config


# ----------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> Optional[Dict[str, Any]]:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ..." -- comm may contain spaces and parentheses.
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return {"pid": pid, "comm": comm, "state": fields[0], "ppid": int(fields[1]), "pgrp": int(fields[2])}


def _all_processes() -> List[Dict[str, Any]]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None:
                out.append(stat)
    return out


def server_processes(root_pid: int, scope: str = "tree") -> List[Dict[str, Any]]:
    """The launched process, its live descendants and the live members of its process group."""
    procs = [p for p in _all_processes() if p["state"] != "Z"]
    if scope == "leader":
        return [p for p in procs if p["pid"] == root_pid]
    children: Dict[int, List[int]] = {}
    for p in procs:
        children.setdefault(p["ppid"], []).append(p["pid"])
    wanted = {root_pid}
    stack = [root_pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in wanted:
                wanted.add(child)
                stack.append(child)
    # The group catches processes orphaned by an exiting launcher (start_new_session: pgid == pid).
    return [p for p in procs if p["pid"] in wanted or p["pgrp"] == root_pid]


def read_environ(pid: int) -> Optional[Dict[str, str]]:
    """A process's environment as it was exec'd with (None if gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, value = item.split(b"=", 1)
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return ""


def expected_env(config: AbConfig, side: Side) -> Dict[str, Optional[str]]:
    """What the side's server must see: its values, and "unset" for keys only other sides set."""
    expected: Dict[str, Optional[str]] = {}
    for other in config.sides:
        for key in other.env:
            expected[key] = None
    expected.update(config.env)
    expected.update(side.env)
    return expected


def _inside(path: str, root: Path) -> bool:
    try:
        Path(path).resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def env_problems(environ: Dict[str, str], expected: Dict[str, Optional[str]], cache_dirs: Dict[str, str]) -> List[str]:
    problems = []
    for key, want in sorted(expected.items()):
        have = environ.get(key)
        if want is None and have is not None:
            problems.append(f"{key}={have!r} but this side requires it unset")
        elif want is not None and have != want:
            problems.append(f"{key}={have!r} but this side requires {want!r}")
    cache_root = Path(cache_dirs["VLLM_CACHE_ROOT"]).parent
    have_root = environ.get("VLLM_CACHE_ROOT")
    if have_root is None or Path(have_root).resolve() != Path(cache_dirs["VLLM_CACHE_ROOT"]).resolve():
        problems.append(f"VLLM_CACHE_ROOT={have_root!r} but this side's is {cache_dirs['VLLM_CACHE_ROOT']!r}")
    # vLLM itself repoints Triton's and Inductor's caches into VLLM_CACHE_ROOT when it compiles,
    # so "inside the side's cache dir" is the requirement, not equality.
    for key in sorted(set(cache_dirs) - {"VLLM_CACHE_ROOT"}):
        have = environ.get(key)
        if have is None or not _inside(have, cache_root):
            problems.append(f"{key}={have!r} is not inside this side's cache dir {str(cache_root)!r}")
    return problems


# govinda_patch/selftest.py runs the kernel self-test in a child process tree with
# GOVINDA_DISABLE=1 and this marker set.
OVERLAY_SELFTEST_MARKER = "GOVINDA_SELFTEST_CHILD"


def environ_overwritten(environ: Dict[str, str], cmdline: str) -> bool:
    """True when /proc/<pid>/environ no longer shows the process's environment.

    vLLM names its worker processes ("VLLM::EngineCore") with setproctitle, which writes the
    title over the argv/environ memory that /proc/<pid>/cmdline and /environ read; what is left
    of the environ is a remnant (seen on the H200: PATH but none of the variables set before it).
    """
    return "PATH" not in environ or cmdline.startswith("VLLM::")


def check_server_env(
    root_pid: int, expected, cache_dirs, scope: str, verified: Optional[Dict[int, Dict[str, Any]]] = None
) -> Dict[str, Any]:
    """Check every server process's environment; ``verified`` (kept across polls) remembers
    each process that passed while its environ was still readable."""
    shown_keys = sorted(set(expected) | set(cache_dirs) | {"PYTHONPATH"})
    checked = []
    unverifiable = []
    for proc in server_processes(root_pid, scope):
        environ = read_environ(proc["pid"])
        if not environ:  # exited meanwhile, or a kernel thread / zombie without an environment
            continue
        if environ.get(OVERLAY_SELFTEST_MARKER) == "1":
            continue  # the overlay's kernel self-test (and its compiler children) run with it off on purpose
        cmdline = _cmdline(proc["pid"])
        if environ_overwritten(environ, cmdline):
            earlier = (verified or {}).get(proc["pid"])
            if earlier is not None:
                checked.append(dict(earlier, note="checked before setproctitle overwrote its environ"))
            else:  # it inherited its parent's environment; the parent is checked
                unverifiable.append({"pid": proc["pid"], "comm": proc["comm"], "cmdline": cmdline})
            continue
        entry = {
            "pid": proc["pid"],
            "comm": proc["comm"],
            "cmdline": cmdline,
            "observed": {key: environ.get(key) for key in shown_keys},
            "problems": env_problems(environ, expected, cache_dirs),
        }
        if verified is not None and not entry["problems"]:
            verified[proc["pid"]] = entry
        checked.append(entry)
    ok = bool(checked) and not any(p["problems"] for p in checked)
    return {"ok": ok, "processes": checked, "checked": len(checked), "environ_overwritten": unverifiable}


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def _group_alive(pgid: int) -> bool:
    return any(p["pgrp"] == pgid and p["state"] != "Z" for p in _all_processes())


def stop_server(proc: subprocess.Popen, grace_s: float) -> Dict[str, Any]:
    """SIGTERM the whole process group, SIGKILL whatever is left after the grace period."""
    pgid = proc.pid
    started = time.monotonic()
    killed = False
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while time.monotonic() - started < grace_s:
        proc.poll()
        if not _group_alive(pgid):
            break
        time.sleep(0.2)
    else:
        killed = True
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return {"exit_code": proc.returncode, "sigkill": killed, "stop_s": round(time.monotonic() - started, 2)}


def count_log_patterns(log_path: Path, patterns: List[LogPattern]) -> Dict[str, Any]:
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    out = {}
    for pattern in patterns:
        regex = re.compile(pattern.regex)
        matches = [line for line in lines if regex.search(line)]
        ok = (pattern.min is None or len(matches) >= pattern.min) and (
            pattern.max is None or len(matches) <= pattern.max
        )
        out[pattern.name] = {
            "regex": pattern.regex,
            "count": len(matches),
            "min": pattern.min,
            "max": pattern.max,
            "ok": ok,
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


# ----------------------------------------------------------------------------- one side


class Refused(Exception):
    pass


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
    if port_in_use(config.host, port):
        record.update(status="error", error=f"port {port} is already in use: refusing to start")
        return record

    log(f"side {side.name}: starting {shlex.join(command)} (log {log_path})")
    started = time.monotonic()
    proc = None
    with open(log_path, "wb") as log_file:
        try:
            proc = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=side_process_env(config, side, cache_dirs),
                cwd=str(REPO_ROOT),
                start_new_session=True,
            )
            record["pid"] = proc.pid
            if live is not None:
                live[side.name] = proc
            _wait_until_ready(config, port, proc, expected, cache_dirs, record, started)
            log(f"side {side.name}: ready after {record['startup_s']:.0f} s, environment verified; "
                f"running the {config.workload()} workload")
            record["bench"] = run_workload(config, side, port)
            record["status"] = "ok"
        except Refused as exc:
            record.update(status="refused", error=str(exc))
            log(f"side {side.name}: REFUSED: {exc}")
        except Exception as exc:  # keep going: record the error, stop the server, next side
            record.update(status="error", error=f"{type(exc).__name__}: {exc}")
            log(f"side {side.name}: ERROR: {record['error']}")
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: stop this server, then the run
            record.update(status="error", error="interrupted", interrupted=True)
            log(f"side {side.name}: interrupted")
        finally:
            if proc is not None:
                log(f"side {side.name}: stopping server")
                record["stop"] = stop_server(proc, config.stop_grace_s)
                deadline = time.monotonic() + config.stop_grace_s
                while port_in_use(config.host, port) and time.monotonic() < deadline:
                    time.sleep(0.5)
                if port_in_use(config.host, port):
                    record["problems"].append(f"port {port} still in use after stopping the server")
                if live is not None:
                    live.pop(side.name, None)
    record["log_counts"] = count_log_patterns(log_path, side.log_patterns)
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


def run_workload(config: AbConfig, side: Side, port: int) -> Dict[str, Any]:
    base_url = f"http://{config.host}:{port}"
    settings = {k: v for k, v in config.bench.items() if k != "workload"}
    if config.workload() == "greedy":
        return greedy_agreement.run(greedy_agreement.GreedyConfig(base_url=base_url, label=side.name, **settings))
    # The random dataset builds its prompts with the served model's tokenizer; relative paths
    # are the server's, whose working directory is the repo root.
    settings["tokenizer"] = str(REPO_ROOT / settings.get("tokenizer", config.model))
    bench_config = serve_tiers.BenchConfig(
        base_url=base_url, label=side.name, work_dir=str(config.resolved_work_dir() / side.name / "bench_serve"), **settings
    )
    if 99.0 not in bench_config.percentiles:
        bench_config.percentiles.append(99.0)  # the SLA is on P99
    return serve_tiers.run(bench_config)


def _wait_until_ready(config, port, proc, expected, cache_dirs, record, started) -> None:
    """Poll /health; check the environment on every poll so a wrong side is refused early."""
    verified: Dict[int, Dict[str, Any]] = {}
    while True:
        check = check_server_env(proc.pid, expected, cache_dirs, config.env_check_scope, verified)
        if check["processes"] and not check["ok"]:
            record["env_check"] = check
            raise Refused(_describe_env_failure(check))
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health answered")
        if openai_http.health_ok(config.host, port):
            break
        if time.monotonic() - started > config.health_timeout_s:
            raise RuntimeError(f"/health did not answer within {config.health_timeout_s:.0f} s")
        time.sleep(0.5)
    record["startup_s"] = round(time.monotonic() - started, 1)
    check = check_server_env(proc.pid, expected, cache_dirs, config.env_check_scope, verified)
    record["env_check"] = check
    if not check["ok"]:
        raise Refused(_describe_env_failure(check) if check["processes"] else "no server process environment could be read")


def _describe_env_failure(check: Dict[str, Any]) -> str:
    bad = [p for p in check["processes"] if p["problems"]]
    first = bad[0]
    return f"environment mismatch in pid {first['pid']} ({first['comm']}): " + "; ".join(first["problems"])


# ----------------------------------------------------------------------------- analysis


def tier_key(tier: Dict[str, Any]) -> str:
    """'6144' at concurrency 1 (and in results from before concurrency lists), '8192@c4' otherwise."""
    concurrency = tier.get("requested_max_concurrency") or 1
    n = tier["requested_input_len"]
    return str(n) if concurrency == 1 else f"{n}@c{concurrency}"


def tier_title(key: str) -> str:
    n, _, concurrency = key.partition("@c")
    return f"Input {n} tokens" + (f", concurrency {concurrency}" if concurrency else "")


def tier_rows(result: Dict[str, Any]) -> Dict[str, Any]:
    """Per tier and side: the scored metrics, ratios to the baseline and the SLA verdict."""
    config = result["config"]
    factor = config["sla_factor"]
    min_completion = config["min_completion"]
    baseline = result["baseline"]
    sides = result["sides"]
    per_side: Dict[str, Dict[int, Dict[str, Any]]] = {}
    input_lens: List[str] = []
    for side in sides:
        tiers = {}
        for tier in (side.get("bench") or {}).get("tiers", []):
            n = tier_key(tier)
            tiers[n] = tier
            if n not in input_lens:
                input_lens.append(n)
        per_side[side["name"]] = tiers
    rows: Dict[str, Any] = {}
    for n in input_lens:
        base = per_side.get(baseline, {}).get(n)
        if base is not None and base.get("error"):
            base = None
        rows[str(n)] = []
        for side in sides:
            tier = per_side[side["name"]].get(n)
            row: Dict[str, Any] = {"side": side["name"], "status": side["status"]}
            if tier is None or tier.get("error"):
                row.update(verdict=f"ERROR: {tier['error']}" if tier else "NO DATA", score=0.0)
                rows[str(n)].append(row)
                continue
            row.update(
                input_tokens_sent=serve_tiers.input_len_range(tier),
                output_throughput=tier["output_throughput"],
                p99_ttft_ms=tier.get("p99_ttft_ms"),
                p99_tpot_ms=tier.get("p99_tpot_ms"),
                completion_rate=tier["completion_rate"],
                completed=tier["completed"],
                num_prompts=tier["num_prompts"],
            )
            reasons = []
            if side["status"] != "ok" or side.get("problems"):
                reasons.append("side invalid")
            if tier["completion_rate"] < min_completion:
                reasons.append(f"completion {tier['completion_rate']:.1%} < {min_completion:.0%}")
            if base is not None:
                for key, label in (("p99_ttft_ms", "TTFT"), ("p99_tpot_ms", "TPOT")):
                    ratio = _ratio(tier.get(key), base.get(key))
                    row[f"{key}_ratio"] = ratio
                    if ratio is None or ratio > factor:
                        reasons.append(f"{label} P99 {_fmt_ratio(ratio)} of baseline > {factor}x")
                row["output_throughput_ratio"] = _ratio(tier["output_throughput"], base["output_throughput"])
                row["verdict"] = "PASS" if not reasons else "FAIL: " + "; ".join(reasons)
            else:
                row["verdict"] = "NO BASELINE"
            row["score"] = tier["output_throughput"] if row["verdict"] == "PASS" else 0.0
            rows[str(n)].append(row)
    return rows


def _ratio(value, base) -> Optional[float]:
    if value is None or base is None or base == 0:
        return None
    return value / base


def _fmt_ratio(ratio: Optional[float]) -> str:
    return "n/a" if ratio is None else f"{ratio:.3f}x"


def _fmt(value, digits=1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _run_lines(result: Dict[str, Any]) -> List[str]:
    config = result["config"]
    return [
        f"- date: {result['date']}; host: {result.get('host', {}).get('node', '?')}; "
        f"repo commit: {result.get('repo', {}).get('commit') or 'n/a'}"
        f"{' (uncommitted changes)' if result.get('repo', {}).get('dirty') else ''}"
        + (f"; sides measured in {len(result['runs'])} runs (see 'measured')" if len(result.get("runs", [])) > 1 else ""),
        f"- model: `{config['model']}`; server command: `{shlex.join(config['server_command'])} MODEL PORT [ARGS]`",
    ] + (["- the sides ran at the same time, each on its own GPU and port (see env): they shared the host's CPUs"]
         if config.get("parallel") else [])


def _sides_lines(result: Dict[str, Any]) -> List[str]:
    """The per-side table (status, env, env check, log counts, ...) and the overlay's counters."""
    lines = [
        "## Sides",
        "",
        "| side | status | env | server args | start-up s | env check | log counts | measured | problems |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for side in result["sides"]:
        env = ", ".join(f"{k}={'<unset>' if v is None else v}" for k, v in side.get("env", {}).items()) or "-"
        check = side.get("env_check") or {}
        check_text = (
            f"ok ({check.get('checked', 0)} processes)" if check.get("ok") else ("FAILED" if check else "not run")
        )
        counts = ", ".join(f"{k}: {v['count']}" for k, v in (side.get("log_counts") or {}).items()) or "-"
        problems = "; ".join(side.get("problems") or [])
        if side.get("error"):
            problems = (side["error"] + ("; " + problems if problems else "")).replace("|", "/")
        measured = side.get("measured") or {}
        commit = (measured.get("repo") or {}).get("commit") or "no commit"
        dirty = "+dirty" if (measured.get("repo") or {}).get("dirty") else ""
        when = f"{measured.get('date', '?')} on {(measured.get('host') or {}).get('node', '?')}, {commit[:10]}{dirty}"
        lines.append(
            f"| {side['name']} | {side['status']} | {env} | {' '.join(side.get('server_args') or []) or '-'} | "
            f"{_fmt(side.get('startup_s'), 0)} | {check_text} | {counts} | {when} | {problems or '-'} |"
        )
    counted = [s for s in result["sides"] if (s.get("govinda_counters") or {}).get("total")]
    if counted:
        lines += ["", "Overlay dispatch counters (summed over processes; decode graph replays are not counted):"]
        for side in counted:
            total = side["govinda_counters"]["total"]
            lines.append(f"- {side['name']}: " + ", ".join(f"{k}={v}" for k, v in sorted(total.items())))
    return lines


def render_markdown(result: Dict[str, Any], png_note: str) -> str:
    if result_workload(result) == "greedy":
        return render_greedy_markdown(result)
    config = result["config"]
    rows = result["sla"]
    bench = config.get("bench") or {}
    lines = [
        f"# A/B serving benchmark: {result['name']}",
        "",
        *_run_lines(result),
        f"- workload: {bench.get('num_prompts', serve_tiers.BenchConfig.num_prompts)} prompts per tier, "
        f"{bench.get('output_len', serve_tiers.BenchConfig.output_len)} output tokens, concurrency "
        f"{bench.get('max_concurrency', 1)}, ignore_eos; {_client_text(result)}",
        f"- baseline side: **{result['baseline']}**; SLA: TTFT P99 and TPOT P99 <= {config['sla_factor']}x the "
        f"baseline's, completion >= {config['min_completion']:.0%}; score = output tok/s if PASS else 0",
        "- P99 over few requests is close to the worst request: read it as a max, not a tail estimate.",
        "",
        *_sides_lines(result),
    ]
    for input_len, tier_rows_ in rows.items():
        lines += [
            "",
            f"## {tier_title(input_len)}",
            "",
            "| side | input tokens sent | output tok/s | vs base | TTFT P99 ms | vs base | TPOT P99 ms | vs base | "
            "completion | SLA | score |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in tier_rows_:
            if "output_throughput" not in row:
                lines.append(f"| {row['side']} | - | - | - | - | - | - | - | - | {row['verdict']} | 0 |")
                continue
            lines.append(
                f"| {row['side']} | {row.get('input_tokens_sent', 'n/a')} | {row['output_throughput']:.2f} | "
                f"{_fmt_ratio(row.get('output_throughput_ratio'))} | "
                f"{_fmt(row['p99_ttft_ms'])} | {_fmt_ratio(row.get('p99_ttft_ms_ratio'))} | "
                f"{_fmt(row['p99_tpot_ms'], 2)} | {_fmt_ratio(row.get('p99_tpot_ms_ratio'))} | "
                f"{row['completed']}/{row['num_prompts']} ({row['completion_rate']:.0%}) | {row['verdict']} | "
                f"{row['score']:.2f} |"
            )
    lines += ["", "## Score per side (sum over tiers of PASS tok/s)", "", "| side | score | tiers passed |", "|---|---|---|"]
    for side in result["sides"]:
        mine = [r for tier in rows.values() for r in tier if r["side"] == side["name"]]
        passed = sum(1 for r in mine if r["verdict"] == "PASS")
        lines.append(f"| {side['name']} | {sum(r['score'] for r in mine):.2f} | {passed}/{len(mine)} |")
    lines += ["", png_note, ""]
    return "\n".join(lines)


def _client_text(result: Dict[str, Any]) -> str:
    """Which client measured the sides (results before issue #18 came from our own client)."""
    benches = [s.get("bench") or {} for s in result["sides"] if s.get("bench")]
    if benches and all(b.get("tool") == "vllm bench serve" for b in benches):
        warmup = (result["config"].get("bench") or {}).get("warmup_requests", serve_tiers.BenchConfig.warmup_requests)
        return ("measured with `vllm bench serve` of the serving vLLM (random dataset: text prompts the server "
                f"tokenizes again), {warmup} warm-up request(s) in a separate run of the tool and a seed per tier, "
                "so no prompt reuses another's cached prefix")
    return "measured with the project's own client (bench/serve_tiers.py before `vllm bench serve`): random token-id prompts, no prefix reuse"


def result_workload(result: Dict[str, Any]) -> str:
    return (result["config"].get("bench") or {}).get("workload", "tiers")


def agreement_rows(result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Greedy workload: every other side's continuations compared with the baseline side's."""
    baseline = result["baseline"]
    by_name = {side["name"]: side for side in result["sides"]}
    base = by_name.get(baseline) or {}
    rows = []
    for side in result["sides"]:
        if side["name"] == baseline:
            continue
        row: Dict[str, Any] = {"side": side["name"], "baseline": baseline}
        missing = [s.get("name", baseline) for s in (base, side) if "completions" not in (s.get("bench") or {})]
        if missing:
            row["error"] = f"no continuations from {', '.join(missing)}"
        else:
            row.update(greedy_agreement.compare(base["bench"], side["bench"]), side=side["name"], baseline=baseline)
        # Agreement of a side whose run broke a rule (e.g. the overlay never dispatched) proves nothing.
        row["valid"] = all(s.get("status") == "ok" and not s.get("problems") for s in (base, side))
        rows.append(row)
    return rows


def render_greedy_markdown(result: Dict[str, Any]) -> str:
    bench = result["config"].get("bench") or {}
    base = next((s for s in result["sides"] if s["name"] == result["baseline"]), {})
    prompts = len(greedy_agreement.GreedyConfig(prompts=bench.get("prompts")).prompt_list())
    prompt_set = "custom" if bench.get("prompts") is not None else "built-in set of bench/greedy_agreement.py"
    lines = [
        f"# A/B greedy agreement: {result['name']}",
        "",
        *_run_lines(result),
        f"- workload: {prompts} prompts ({prompt_set}) as plain completions (no chat template), temperature 0, "
        f"max_tokens {bench.get('max_tokens', greedy_agreement.GreedyConfig.max_tokens)}, EOS honoured, one "
        f"request at a time, {bench.get('repeats', 1)} pass(es) per side",
        f"- baseline side: **{result['baseline']}**; identical = the same generated token ids (characters when "
        "the server returns no ids); a failed request counts as a difference; self-agreement = later passes "
        "identical to a side's first pass (the noise floor); near tie = the baseline's top two candidates within "
        f"{greedy_agreement.NEAR_TIE_NATS} nats where the continuations part",
        "",
        *_sides_lines(result),
        "",
        "## Agreement with the baseline",
        "",
        "| side | identical | fraction | mean common prefix | baseline mean length | failed | "
        "divergences at a near tie | self-agreement | valid |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base_bench = base.get("bench") or {}
    if "completions" in base_bench:
        lengths = [len(r["token_ids"]) for r in base_bench["completions"] if r.get("token_ids") is not None]
        mean_length = f"{sum(lengths) / len(lengths):.1f} tokens" if lengths else "n/a"
        failed = sum(1 for r in base_bench["completions"] if r["error"])
        lines.append(
            f"| {result['baseline']} (baseline) | - | - | - | {mean_length} | {failed} | - | "
            f"{greedy_agreement.self_agreement_text(base_bench.get('self_agreement'))} | - |"
        )
    for row in result["agreement"]:
        valid = "yes" if row["valid"] else "NO (see Sides)"
        if row.get("error"):
            lines.append(f"| {row['side']} | {row['error']} | - | - | - | - | - | - | {valid} |")
            continue
        unit = row["prefix_unit"]
        side_bench = next(s for s in result["sides"] if s["name"] == row["side"])["bench"]
        lines.append(
            f"| {row['side']} | {row['identical']}/{row['prompts']} | {row['fraction']:.1%} | "
            f"{_fmt(row['mean_common_prefix'])} {unit} | {_fmt(row['mean_baseline_length'])} {unit} | "
            f"{row['failed']} | {row.get('near_tie_divergences', 0)}/{row['prompts'] - row['identical'] - row['failed']} | "
            f"{greedy_agreement.self_agreement_text(side_bench.get('self_agreement'))} | {valid} |"
        )
    scored = [row for row in result["agreement"] if not row.get("error") and row.get("teacher_forced")]
    if scored:
        first = next((s["bench"]["teacher_forced"] for s in result["sides"] if (s.get("bench") or {}).get("teacher_forced")), [])
        lines += [
            "",
            "## Teacher-forced scoring of fixed texts",
            "",
            f"{len(first)} texts ({', '.join(sorted({t['source'] for t in first}))}; "
            f"{bench.get('teacher_forced_chars', greedy_agreement.GreedyConfig.teacher_forced_chars)} characters each, "
            "from CPython's standard library) scored with prompt_logprobs=2; per position the top-1 token of each side "
            "and the logprob of the true next token. Confident = the baseline's top candidate leads by >= "
            f"{greedy_agreement.CONFIDENT_PROBABILITY_GAP} probability. Flip margin = the baseline's top-2 logprob gap "
            "where the sides' top-1 differ.",
            "",
            "| side | positions | top-1 agreement | confident: agreement (positions) | perplexity ratio - 1 | "
            "mean abs delta logprob (true token) | flips | flip margin median / max (nats) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in scored:
            tf = row["teacher_forced"]
            if tf.get("error"):
                lines.append(f"| {row['side']} | {tf['error']} | - | - | - | - | - | - |")
                continue
            confident = tf["confident_top1_agreement"]
            lines.append(
                f"| {row['side']} | {tf['positions']} | {tf['top1_agreement']:.2%} | "
                f"{'n/a' if confident is None else f'{confident:.2%}'} ({tf['confident_positions']}) | "
                f"{tf['perplexity_ratio_minus_1']:+.3%} | {tf['mean_abs_true_logprob_delta']:.4f} | {tf['flips']} | "
                f"{_fmt(tf['flip_baseline_margin_median'], 3)} / {_fmt(tf['flip_baseline_margin_max'], 3)} |"
            )
    for row in result["agreement"]:
        if row.get("error"):
            continue
        lines += ["", f"### {row['side']}: differing prompts", ""]
        lines += greedy_agreement.divergence_markdown(row, row["baseline"], row["side"])
    return "\n".join(lines + [""])


def render_png(result: Dict[str, Any], path: Path) -> str:
    """Bars per tier and side for tok/s, TTFT P99, TPOT P99. Returns the note for the md."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "Plot skipped: matplotlib is not importable here (rerun with --report-only where it is)."
    try:
        return _draw_png(result, path, plt)
    except Exception as exc:  # a plotting bug must not lose the measured results
        return f"Plot failed: {type(exc).__name__}: {exc}"


def _draw_png(result: Dict[str, Any], path: Path, plt) -> str:
    rows = result["sla"]
    tiers = list(rows)
    sides = [s["name"] for s in result["sides"]]
    metrics = (("output_throughput", "output tok/s (higher is better)"),
               ("p99_ttft_ms", "TTFT P99 ms"), ("p99_tpot_ms", "TPOT P99 ms"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / max(1, len(sides))
    for ax, (key, title) in zip(axes, metrics):
        for i, side in enumerate(sides):
            values = []
            for tier in tiers:
                row = next((r for r in rows[tier] if r["side"] == side), {})
                values.append(row.get(key) or 0.0)
            positions = [t + (i - (len(sides) - 1) / 2) * width for t in range(len(tiers))]
            ax.bar(positions, values, width, label=side)
        if key != "output_throughput":  # the SLA limit: factor x the baseline's P99
            for t, tier in enumerate(tiers):
                base = next((r for r in rows[tier] if r["side"] == result["baseline"]), {}).get(key)
                if base:
                    limit = base * result["config"]["sla_factor"]
                    ax.hlines(limit, t - 0.45, t + 0.45, colors="red", linestyles="dashed",
                              label="SLA limit" if t == 0 else None)
        ax.set_xticks(range(len(tiers)))
        ax.set_xticklabels([f"{t} in" for t in tiers])
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[1].get_legend_handles_labels()  # sides plus the SLA limit marker
    fig.legend(handles, labels, loc="upper right", ncol=len(labels), fontsize="small")
    fig.suptitle(f"{result['name']} (baseline: {result['baseline']})", x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![A/B plot]({path.name})"


def write_reports(result: Dict[str, Any], report_dir: Path, with_png: bool = True) -> Dict[str, Path]:
    report_dir.mkdir(parents=True, exist_ok=True)
    name = result["name"]
    greedy = result_workload(result) == "greedy"
    if greedy:
        result["agreement"] = agreement_rows(result)
    else:
        result["sla"] = tier_rows(result)
    paths = {"json": report_dir / f"{name}.json", "md": report_dir / f"{name}.md", "png": report_dir / f"{name}.png"}
    # Greedy results hold per-token arrays (ids, logprobs) for every side: written compact, they
    # are half the size, which matters for reports carried to the device with the checkout.
    indent = None if greedy else 1
    paths["json"].write_text(json.dumps(result, indent=indent, default=str), encoding="utf-8")
    if greedy:
        note = ""  # no plot: the tables say it all
    else:
        note = render_png(result, paths["png"]) if with_png else "Plot not generated yet (run in progress)."
    paths["md"].write_text(render_markdown(result, note), encoding="utf-8")
    return paths


def _repo_state() -> Dict[str, Any]:
    def git(*words):
        try:
            return subprocess.run(
                ["git", *words], cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "--verify", "-q", "HEAD") or None, "dirty": bool(git("--no-optional-locks", "status", "--porcelain"))}


def _device_info() -> Dict[str, str]:
    info = {}
    for tool, words in (("nvidia-smi", ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
                        ("rocm-smi", ["--showproductname"]),
                        ("hy-smi", [])):
        if shutil.which(tool):
            try:
                info[tool] = subprocess.run([tool, *words], capture_output=True, text=True, timeout=20).stdout.strip()[:2000]
            except (OSError, subprocess.SubprocessError) as exc:
                info[tool] = f"error: {exc}"
    return info


def run_ab(config: AbConfig, only: Optional[List[str]] = None, merge_with: Optional[str] = None) -> Dict[str, Any]:
    """Run every side (or only the named ones, keeping the other sides' records from an earlier
    result: one side per invocation fits a time-limited machine session)."""
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
        "repo": _repo_state(),
        "device": _device_info(),
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
        return write_reports(result, report_dir, with_png=with_png)

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
            stop_server(proc, grace_s)
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
    p.add_argument("--input-lens", type=serve_tiers.parse_int_list)
    p.add_argument("--output-len", type=int)
    p.add_argument("--num-prompts", type=int)
    p.add_argument("--max-concurrency", type=int, nargs="+", help="one or more (each input length at each)")
    p.add_argument("--warmup-requests", type=int, help="requests of the warm-up run of the tool (default 1)")
    p.add_argument("--tokenizer", help="the tokenizer `vllm bench serve` builds prompts with (default: the model)")
    p.add_argument("--seed", type=int)
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
    p.add_argument("--report-only", nargs="+", metavar="JSON",
                   help="rebuild md/png from result JSON(s); the sides of later files are added to the first's "
                        "(replacing sides of the same name): parts measured in separate device calls")
    return p


def merge_results(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The first result with the sides and runs of the later ones (same name: the later record)."""
    merged = dict(results[0])
    sides = list(merged["sides"])
    runs = list(merged.get("runs", []))
    for other in results[1:]:
        for record in other["sides"]:
            names = [s["name"] for s in sides]
            if record["name"] in names:
                sides[names.index(record["name"])] = record
            else:
                sides.append(record)
        runs += other.get("runs", [])
    merged.update(sides=sides, runs=runs)
    return merged


def _exit_code(result: Dict[str, Any]) -> int:
    bad = [s for s in result["sides"] if s["status"] != "ok" or s.get("problems")]
    return 0 if not bad else 2


def main(argv: Optional[List[str]] = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.report_only:
        sources = [Path(path) for path in args.report_only]
        result = merge_results([json.loads(path.read_text(encoding="utf-8")) for path in sources])
        if args.baseline:  # e.g. the saved baseline side is missing from the files joined here
            if args.baseline not in {side["name"] for side in result["sides"]}:
                raise SystemExit(f"--baseline: no side named {args.baseline!r} in these results")
            result["baseline"] = args.baseline
        paths = write_reports(result, Path(args.report_dir) if args.report_dir else sources[0].parent)
        log(f"rebuilt {paths['md']}" + (f" and {paths['png']}" if paths["png"].exists() else ""))
        return _exit_code(result)
    config = build_config(args)
    unknown = set(args.only or []) - {side.name for side in config.sides}
    if unknown:
        raise SystemExit(f"--only: no side named {sorted(unknown)}")

    def on_sigterm(_signum, _frame):
        raise KeyboardInterrupt  # unwinds through run_side's finally: the server is stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    result = run_ab(config, only=args.only, merge_with=args.merge_with)
    return _exit_code(result)


if __name__ == "__main__":
    sys.exit(main())
