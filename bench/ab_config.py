"""The A/B run's configuration: the sides file merged with the command line's overrides."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from bench import greedy_agreement, serve_tiers
from bench.sides_file import LogPatterns, SidesFile, env_strings, load_sides_file

REPO_ROOT = Path(__file__).resolve().parent.parent
# Parallel runs give side i GPU i through this variable unless the side's env sets it.
PARALLEL_GPU_VAR = "CUDA_VISIBLE_DEVICES"
# bench.workload: what runs against each side's server once it is up.
WORKLOADS = ("tiers", "greedy")
# Set by the runner for each side, not by the sides file.
RUNNER_BENCH_KEYS = {"base_url", "progress", "label", "work_dir"}
NAME_PATTERN = r"[A-Za-z0-9._-]+"
KV_MEMORY_FLAG = "--kv-cache-memory-bytes"  # vLLM 0.18.1, 0.26 and 0.33 alike


@dataclass
class LogPattern:
    """Server log lines matching ``regex`` are counted; min/max bound the count (None: no bound)."""

    name: str
    regex: str
    min: Optional[int] = None
    max: Optional[int] = None

    def allows(self, count: int) -> bool:
        return (self.min is None or count >= self.min) and (self.max is None or count <= self.max)


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
    # Every side's KV memory, pinned (--kv-cache-memory-bytes); None: each server profiles its own.
    kv_cache_memory_bytes: Optional[int] = None
    # The capacity sweep's targets (sides_file.CapacitySpec as a dict); None: no capacity report.
    capacity: Optional[Dict[str, Any]] = None

    def baseline_name(self) -> str:
        return self.baseline or self.sides[0].name

    def workload(self) -> str:
        return self.bench.get("workload", "tiers")

    def resolved_work_dir(self) -> Path:
        if self.work_dir:
            return Path(self.work_dir)
        return Path(os.environ.get("TMPDIR", "/tmp")) / "govinda-ab" / self.name


@dataclass
class Overrides:
    """What the command line sets over the sides file (None: not given)."""

    sides_file: Optional[str] = None
    sides: Optional[List[Side]] = None  # replace the file's sides
    side_args: List[List[str]] = field(default_factory=list)  # [side name, shell-quoted args]
    name: Optional[str] = None
    model: Optional[str] = None
    port: Optional[int] = None
    host: Optional[str] = None
    server_command: Optional[str] = None
    baseline: Optional[str] = None
    health_timeout_s: Optional[float] = None
    stop_grace_s: Optional[float] = None
    workload: Optional[str] = None
    bench: Dict[str, Any] = field(default_factory=dict)  # tier flags given on the command line
    log_patterns: List[str] = field(default_factory=list)  # NAME=REGEX
    work_dir: Optional[str] = None
    log_dir: Optional[str] = None
    report_dir: Optional[str] = None
    keep_caches: bool = False
    env_check_scope: Optional[str] = None
    parallel: bool = False
    kv_cache_memory_bytes: Optional[int] = None


def args_list(raw: Union[None, str, List[Any]]) -> List[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return shlex.split(raw)
    return [str(x) for x in raw]


def log_patterns(raw: Optional[LogPatterns]) -> List[LogPattern]:
    patterns = []
    for name, spec in (raw or {}).items():
        if isinstance(spec, str):
            patterns.append(LogPattern(str(name), spec))
        else:
            patterns.append(LogPattern(str(name), spec.regex, spec.min, spec.max))
    return patterns


def merge_patterns(common: List[LogPattern], own: List[LogPattern]) -> List[LogPattern]:
    merged = {p.name: p for p in common}
    merged.update({p.name: p for p in own})
    return list(merged.values())


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


def _bench_settings(file_bench: Optional[Dict[str, Any]], overrides: Overrides) -> Dict[str, Any]:
    bench = dict(file_bench or {})
    if overrides.workload:
        bench["workload"] = overrides.workload
    workload = bench.get("workload", "tiers")
    if workload not in WORKLOADS:
        raise ValueError(f"bench: unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
    settings_class = serve_tiers.BenchConfig if workload == "tiers" else greedy_agreement.GreedyConfig
    known = {f.name for f in dataclasses.fields(settings_class)} - RUNNER_BENCH_KEYS
    unknown = set(bench) - known - {"workload"}
    if unknown:
        raise ValueError(f"bench: unknown keys {sorted(unknown)} for workload {workload} (known: {sorted(known)})")
    for key, value in overrides.bench.items():
        if workload != "tiers":
            raise ValueError(f"--{key.replace('_', '-')} applies to the tiers workload only")
        bench[key] = value
    return bench


def build_config(overrides: Overrides) -> AbConfig:
    data = load_sides_file(overrides.sides_file) if overrides.sides_file else SidesFile()
    sides = [
        Side(name=spec.name, port=spec.port, env=env_strings(spec.env), server_args=args_list(spec.server_args),
             log_patterns=log_patterns(spec.log_patterns))
        for spec in data.sides
    ]
    if overrides.sides:
        sides = list(overrides.sides)
    by_name = {s.name: s for s in sides}
    for name, extra in overrides.side_args:
        if name not in by_name:
            raise ValueError(f"--side-args: no side named {name}")
        by_name[name].server_args += shlex.split(extra)
    if len(sides) < 2:
        raise ValueError("need at least two sides (from --sides FILE or --side flags)")
    if len(by_name) != len(sides):
        raise ValueError("side names must be unique")

    common_patterns = log_patterns(data.log_patterns)
    for item in overrides.log_patterns:
        name, _, regex = item.partition("=")
        re.compile(regex)
        common_patterns = merge_patterns(common_patterns, [LogPattern(name, regex)])
    for side in sides:
        side.log_patterns = merge_patterns(common_patterns, side.log_patterns)

    def pick(cli_value, file_value, default):
        for value in (cli_value, file_value):
            if value is not None:
                return value
        return default

    config = AbConfig(
        name=pick(overrides.name, data.name, None) or "ab",
        model=pick(overrides.model, data.model, None) or os.environ.get("MODEL") or "",
        sides=sides,
        port=int(pick(overrides.port, data.port, 8000)),
        host=pick(overrides.host, data.host, "127.0.0.1"),
        env=env_strings(data.env),
        server_args=args_list(data.server_args),
        bench=_bench_settings(data.bench, overrides),
        log_patterns=common_patterns,
        baseline=pick(overrides.baseline, data.baseline, None),
        health_timeout_s=float(pick(overrides.health_timeout_s, data.health_timeout_s, 900.0)),
        stop_grace_s=float(pick(overrides.stop_grace_s, data.stop_grace_s, 30.0)),
        sla_factor=float(pick(None, data.sla_factor, 1.5)),
        min_completion=float(pick(None, data.min_completion, 0.99)),
        work_dir=pick(overrides.work_dir, data.work_dir, None),
        log_dir=pick(overrides.log_dir, data.log_dir, None),
        report_dir=pick(overrides.report_dir, data.report_dir, str(REPO_ROOT / "reports")),
        keep_caches=bool(overrides.keep_caches or data.keep_caches),
        env_check_scope=pick(overrides.env_check_scope, data.env_check_scope, "tree"),
        parallel=bool(overrides.parallel or data.parallel),
        kv_cache_memory_bytes=pick(overrides.kv_cache_memory_bytes, data.kv_cache_memory_bytes, None),
        capacity=data.capacity.model_dump() if data.capacity is not None else None,
    )
    server_command = pick(overrides.server_command, data.server_command, None)
    if server_command is not None:
        config.server_command = args_list(server_command)
    if config.kv_cache_memory_bytes is not None:
        config.server_args = config.server_args + [KV_MEMORY_FLAG, str(int(config.kv_cache_memory_bytes))]
    _check(config)
    return config


def _check(config: AbConfig) -> None:
    if not config.model:
        raise ValueError("no model: give --model, model: in the sides file, or MODEL in the env")
    names = {side.name for side in config.sides}
    if config.baseline_name() not in names:
        raise ValueError(f"baseline {config.baseline_name()} is not a side")
    if config.parallel:
        for index, side in enumerate(config.sides):
            side.port = side.port or config.port + index
            side.env.setdefault(PARALLEL_GPU_VAR, str(index))
        if len({side.port for side in config.sides}) != len(config.sides):
            raise ValueError("parallel sides need distinct ports")
    if config.env_check_scope not in ("tree", "leader"):
        raise ValueError("env_check_scope must be 'tree' or 'leader'")
    if not re.fullmatch(NAME_PATTERN, config.name) or not all(re.fullmatch(NAME_PATTERN, n) for n in names):
        raise ValueError("run and side names may only use letters, digits, '.', '_' and '-'")
    if config.kv_cache_memory_bytes is not None:
        if config.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be > 0")
        if any(KV_MEMORY_FLAG in side.server_args for side in config.sides):
            raise ValueError(f"kv_cache_memory_bytes is set for every side: no side may also pass {KV_MEMORY_FLAG}")
    if config.capacity is not None:
        named = [config.capacity["candidate"], *config.capacity["bf16_sides"]]
        unknown = sorted(set(named) - names)
        if unknown or not config.capacity["bf16_sides"]:
            raise ValueError(f"capacity: needs a candidate and bf16 sides that are sides of the run (unknown: {unknown})")
        if config.workload() != "tiers":
            raise ValueError("capacity: applies to the tiers workload only")


def expected_env(config: AbConfig, side: Side) -> Dict[str, Optional[str]]:
    """What the side's server must see: its values, and "unset" for keys only other sides set."""
    expected: Dict[str, Optional[str]] = {}
    for other in config.sides:
        for key in other.env:
            expected[key] = None
    expected.update(config.env)
    expected.update(side.env)
    return expected
