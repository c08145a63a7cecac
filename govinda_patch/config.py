"""Load and validate ``patches.yaml``: the single declarative table of patches and groups.

The schema is the set of frozen dataclasses below plus ``FIELD_RULES``; errors name the file
and the offending key, e.g. ``patches.yaml: patches[2] (int8_kv_cache_spec).env: must match ...``.
Validation is plain Python on purpose: it runs inside ``import vllm`` in every process, and
pydantic's first import alone costs ~0.4 s there (the start-up budget is 5 % of ``import vllm``).
"""

from __future__ import annotations

import functools
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from . import yaml_loader
from .excerpt import clip, excerpt, quote
from .guards import GUARDS
from .settings import GLOBAL_SWITCHES, PLATFORMS

IMPLEMENTATION_PACKAGE = "govinda_patch.patches"
NAME_PATTERN = r"[a-z][a-z0-9_]*"
ENV_PATTERN = r"GOVINDA_[A-Z0-9_]+"
# vLLM's own modules, or those of a vLLM platform plugin package (vllm_hcu).
MODULE_PATTERN = r"vllm(_[a-z][a-z0-9]*)?(\.[A-Za-z_][A-Za-z0-9_]*)*"
ATTRIBUTE_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPLEMENTATION_PATTERN = re.escape(IMPLEMENTATION_PACKAGE) + r"\.[a-z_][a-z0-9_]*"


class PatchConfigError(ValueError):
    """A patch table that cannot be used; the message names the file and the key."""


class _Invalid(Exception):
    def __init__(self, where: str, message: str):
        super().__init__(f"{clip(where, 120)}: {message}")


@dataclass(frozen=True)
class TargetSpec:
    module: str
    attribute: str
    platform: Optional[str] = None
    # Versions in which this target is the one to patch (a patch may need different targets in
    # different vLLM releases); None means all of the patch's verified versions.
    vllm_versions: Optional[tuple] = None
    # A target in a package that may not be installed (a vendor's platform plugin): when its
    # module is missing the target is left out, and a patch left without targets is skipped.
    optional: bool = False

    @property
    def label(self) -> str:
        return f"{self.module}:{self.attribute}"


@dataclass(frozen=True)
class PatchDocs:
    why: str
    how: str
    upstream: str
    remove_when: str


@dataclass(frozen=True)
class PatchSpec:
    name: str
    summary: str
    group: str
    implementation: str
    default: bool
    env: str
    vllm_versions: tuple
    platforms: tuple
    targets: tuple
    docs: PatchDocs


@dataclass(frozen=True)
class GroupSpec:
    name: str
    summary: str
    env: str
    # A check that must pass once per process before the group may take effect (guards.GUARDS).
    guard: Optional[str] = None


@dataclass(frozen=True)
class PatchTable:
    schema_version: int
    groups: tuple
    patches: tuple

    def group(self, name: str) -> GroupSpec:
        return next(g for g in self.groups if g.name == name)

    def members(self, group_name: str) -> list:
        return [p for p in self.patches if p.group == group_name]


# ----------------------------------------------------------------------------- field rules
def _text(where, value):
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(where, "must be a non-empty string")
    return value


def _matching(pattern: str, hint: str) -> Callable:
    def check(where, value):
        if not isinstance(value, str) or not re.fullmatch(pattern, value):
            raise _Invalid(where, f"{excerpt(value)} must match {hint}")
        return value

    return check


def _boolean(where, value):
    if not isinstance(value, bool):
        raise _Invalid(where, f"{excerpt(value)} must be true or false")
    return value


def _specifiers(where, value):
    if not isinstance(value, list) or not value:
        raise _Invalid(where, "must be a non-empty list of PEP 440 specifier sets")
    for spec in value:
        try:
            if not isinstance(spec, str):
                raise TypeError("not a string")
            SpecifierSet(spec)
        except (InvalidSpecifier, TypeError) as exc:
            raise _Invalid(where, f"{excerpt(spec)} is not a PEP 440 specifier set ({clip(exc)})") from None
    return tuple(value)


def _one_of(choices) -> Callable:
    def check(where, value):
        if not isinstance(value, str) or value not in choices:
            raise _Invalid(where, f"{excerpt(value)} must be one of {tuple(choices)}")
        return value

    return check


_platform = _one_of(PLATFORMS)


def _platforms(where, value):
    if not isinstance(value, list) or not value:
        raise _Invalid(where, f"must be a non-empty list of {PLATFORMS}")
    return tuple(_platform(f"{where}[{i}]", v) for i, v in enumerate(value))


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _record(where, value, cls, rules: dict, optional: tuple = ()):
    if not isinstance(value, dict):
        raise _Invalid(where or "top level", f"must be a mapping with keys {sorted(rules)}")
    odd_keys = [k for k in value if not isinstance(k, str)]
    if odd_keys:
        raise _Invalid(where or "top level", f"key {excerpt(odd_keys[0])} is not a string; allowed: {sorted(rules)}")
    unknown = sorted(set(value) - set(rules))
    if unknown:
        raise _Invalid(_join(where, clip(unknown[0], 60)), f"unknown key; allowed: {sorted(rules)}")
    missing = [k for k in rules if k not in value and k not in optional]
    if missing:
        raise _Invalid(_join(where, missing[0]), "required key is missing")
    return cls(**{k: rules[k](_join(where, k), value[k]) for k in rules if k in value})


def _list_of(item_rule: Callable, allow_empty=False) -> Callable:
    def check(where, value):
        if not isinstance(value, list) or (not value and not allow_empty):
            raise _Invalid(where, "must be a non-empty list")
        return tuple(item_rule(_label(where, i, item), item) for i, item in enumerate(value))

    return check


def _label(where, index, item) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return f"{where}[{index}]" + (f" ({clip(name, 60)})" if isinstance(name, str) else "")


TARGET_RULES = {
    "module": _matching(MODULE_PATTERN, "a module path of vllm or of a vllm_* platform plugin"),
    "attribute": _matching(ATTRIBUTE_PATTERN, "a dotted attribute name"),
    "platform": _platform,
    "vllm_versions": _specifiers,
    "optional": _boolean,
}
DOCS_RULES = {"why": _text, "how": _text, "upstream": _text, "remove_when": _text}
PATCH_RULES = {
    "name": _matching(NAME_PATTERN, NAME_PATTERN),
    "summary": _text,
    "group": _matching(NAME_PATTERN, NAME_PATTERN),
    "implementation": _matching(IMPLEMENTATION_PATTERN, f"a module directly inside {IMPLEMENTATION_PACKAGE}"),
    "default": _boolean,
    "env": _matching(ENV_PATTERN, ENV_PATTERN),
    "vllm_versions": _specifiers,
    "platforms": _platforms,
    "targets": _list_of(lambda w, v: _record(w, v, TargetSpec, TARGET_RULES, optional=("platform", "vllm_versions", "optional"))),
    "docs": lambda w, v: _record(w, v, PatchDocs, DOCS_RULES),
}
GROUP_RULES = {
    "name": _matching(NAME_PATTERN, NAME_PATTERN),
    "summary": _text,
    "env": _matching(ENV_PATTERN, ENV_PATTERN),
    "guard": _one_of(sorted(GUARDS)),
}


def _schema_version(where, value):
    if type(value) is not int or value != 1:
        raise _Invalid(where, f"{excerpt(value)} is not a supported schema version (1)")
    return value


TABLE_RULES = {
    "schema_version": _schema_version,
    "groups": _list_of(lambda w, v: _record(w, v, GroupSpec, GROUP_RULES, optional=("guard",))),
    "patches": _list_of(lambda w, v: _record(w, v, PatchSpec, PATCH_RULES)),
}


def _cross_checks(table: PatchTable) -> None:
    names = [p.name for p in table.patches] + [g.name for g in table.groups]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _Invalid("patches", f"names must be unique across patches and groups: {duplicates}")
    envs = [p.env for p in table.patches] + [g.env for g in table.groups]
    duplicate_envs = sorted({e for e in envs if envs.count(e) > 1})
    if duplicate_envs:
        raise _Invalid("patches", f"env switches must be unique: {duplicate_envs}")
    taken = sorted(set(envs) & {s.name for s in GLOBAL_SWITCHES})
    if taken:
        raise _Invalid("patches", f"env switches must not reuse a global switch: {taken}")
    groups = {g.name for g in table.groups}
    for index, patch in enumerate(table.patches):
        if patch.group not in groups:
            raise _Invalid(f"patches[{index}] ({patch.name}).group", f"unknown group {patch.group!r}; declared: {sorted(groups)}")


class _TableProblem(Exception):
    """What is wrong with a table's text; parse_table puts the file's name in front."""


def parse_table(text: str, source: str) -> PatchTable:
    try:
        return _valid_table(text)
    except _TableProblem as exc:
        raise PatchConfigError(f"{source}: {exc}") from None


# The parse is pure-Python YAML (~70 ms for patches.yaml) and the table is immutable, so a process
# that builds its overlay again (each ``overlay_scope``, the CLI's checks) parses a text once.
# Only valid tables are kept (lru_cache keeps no exceptions).
@functools.lru_cache(maxsize=4)
def _valid_table(text: str) -> PatchTable:
    try:
        raw: Any = yaml_loader.load(text)
    except yaml.YAMLError as exc:
        raise _TableProblem(f"not valid YAML: {_yaml_problem(exc)}") from None
    except Exception as exc:  # e.g. an integer too long to convert: still just a bad document
        raise _TableProblem(f"not valid YAML: {type(exc).__name__}: {clip(exc)}") from None
    try:
        table = _record("", raw, PatchTable, TABLE_RULES)
        _cross_checks(table)
    except _Invalid as exc:
        raise _TableProblem(clip(exc, 400)) from None
    except Exception as exc:  # a rule that did not foresee a value: still a bad table, never a crash
        raise _TableProblem(f"unusable table: {type(exc).__name__}: {clip(exc)}") from None
    return table


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One bounded line: what is wrong and where (PyYAML's own text spans several lines)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None:
        return clip(exc)
    context = getattr(exc, "context", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return clip(f"{problem}{where}" + (f" ({context})" if context else ""))


def load_table(path: Path) -> PatchTable:
    """Read and validate a table; a file that is not a small regular UTF-8 file is refused unread."""
    shown = quote(path, 300)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (inside vLLM's import).
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as handle:
            regular = stat.S_ISREG(os.fstat(handle.fileno()).st_mode)
            data = handle.read(yaml_loader.MAX_DOCUMENT_BYTES + 1) if regular else b""
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise PatchConfigError(f"{shown}: cannot read patch table: {getattr(exc, 'strerror', None) or clip(exc)}") from None
    if not regular:
        raise PatchConfigError(f"{shown}: cannot read patch table: not a regular file")
    if len(data) > yaml_loader.MAX_DOCUMENT_BYTES:
        raise PatchConfigError(f"{shown}: cannot read patch table: larger than {yaml_loader.MAX_DOCUMENT_BYTES // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchConfigError(f"{shown}: cannot read patch table: not UTF-8 (byte {exc.start})") from None
    return parse_table(text, shown)
