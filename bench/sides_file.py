"""The A/B runner's sides file (YAML or JSON): its schema, and loading it with a bounded error.

Pydantic gives the checks (unknown keys, types, regexes that compile, the env-check scope) in one
place; the overlay itself never imports this module (bench only).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

# A value in an env mapping as YAML may write it; the process sees strings (see env_strings).
EnvValue = Union[None, bool, int, float, str]
# shell words in one string, or a list of words
Words = Union[str, List[Union[str, int, float]]]
ERRORS_SHOWN = 5
ERROR_CHARS = 200


class SidesFileError(ValueError):
    pass


class LogPatternSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    regex: str
    min: Optional[int] = None
    max: Optional[int] = None

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        return _compiled(value)


LogPatterns = Dict[str, Union[str, LogPatternSpec]]


class CapacitySpec(BaseModel):
    """The capacity sweep's targets (bench/ab_capacity.py): the candidate side against the best
    of the bf16 sides, at and above the first point where a bf16 side is KV-limited, and below."""

    model_config = ConfigDict(extra="forbid")
    candidate: str
    bf16_sides: List[str]
    min_tok_s_ratio: float = 1.6
    max_ttft_p99_ratio: float = 0.7
    min_tok_s_ratio_below: float = 0.98


class SideSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    env: Optional[Dict[str, EnvValue]] = None
    server_args: Optional[Words] = None
    log_patterns: Optional[LogPatterns] = None
    port: Optional[int] = None

    @field_validator("log_patterns")
    @classmethod
    def _plain_regexes_compile(cls, value: Optional[LogPatterns]) -> Optional[LogPatterns]:
        return _check_plain_regexes(value)


class SidesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Optional[str] = None
    model: Optional[str] = None
    port: Optional[int] = None
    host: Optional[str] = None
    server_command: Optional[Words] = None
    env: Optional[Dict[str, EnvValue]] = None
    server_args: Optional[Words] = None
    # Checked against the workload's settings class by ab_config (it depends on the workload).
    bench: Optional[Dict[str, Any]] = None
    log_patterns: Optional[LogPatterns] = None
    baseline: Optional[str] = None
    health_timeout_s: Optional[float] = None
    stop_grace_s: Optional[float] = None
    sla_factor: Optional[float] = None
    min_completion: Optional[float] = None
    work_dir: Optional[str] = None
    report_dir: Optional[str] = None
    log_dir: Optional[str] = None
    keep_caches: Optional[bool] = None
    env_check_scope: Optional[Literal["tree", "leader"]] = None
    parallel: Optional[bool] = None
    # The same KV memory for every side: --kv-cache-memory-bytes N on every server.
    kv_cache_memory_bytes: Optional[int] = None
    capacity: Optional[CapacitySpec] = None
    sides: List[SideSpec] = []

    @field_validator("log_patterns")
    @classmethod
    def _plain_regexes_compile(cls, value: Optional[LogPatterns]) -> Optional[LogPatterns]:
        return _check_plain_regexes(value)


def _check_plain_regexes(value: Optional[LogPatterns]) -> Optional[LogPatterns]:
    for spec in (value or {}).values():
        if isinstance(spec, str):
            _compiled(spec)
    return value


def _compiled(regex: str) -> str:
    try:
        re.compile(regex)
    except re.error as exc:  # not a ValueError: pydantic reports only those at the field
        raise ValueError(f"regex {regex!r} does not compile: {exc}") from None
    return regex


def env_strings(raw: Optional[Dict[str, EnvValue]]) -> Dict[str, Optional[str]]:
    """YAML turns 1 into an int and true into a bool; the process sees strings (None: unset)."""
    out: Dict[str, Optional[str]] = {}
    for key, value in (raw or {}).items():
        if value is None:
            out[str(key)] = None
        elif isinstance(value, bool):
            out[str(key)] = "1" if value else "0"
        else:
            out[str(key)] = str(value)
    return out


def describe(error: ValidationError, source: str) -> str:
    """The first few problems, each as location: message, cut to a bounded length."""
    lines = []
    for item in error.errors()[:ERRORS_SHOWN]:
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"{where}: {item['msg']}"[:ERROR_CHARS])
    more = error.error_count() - len(lines)
    return f"{source}: invalid sides file: " + "; ".join(lines) + (f" (and {more} more)" if more > 0 else "")


def parse_sides(data: Any, source: str) -> SidesFile:
    if not isinstance(data, dict):
        raise SidesFileError(f"{source}: expected a mapping at the top level")
    try:
        return SidesFile.model_validate(data)
    except ValidationError as exc:
        raise SidesFileError(describe(exc, source)) from None


def load_sides_file(path: str) -> SidesFile:
    """Read and validate a sides file (JSON is valid YAML too)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SidesFileError(f"{path}: cannot read: {str(exc)[:ERROR_CHARS]}") from None
    return parse_sides(data, path)
