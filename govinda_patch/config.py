"""Load and validate ``patches.yaml``: the single declarative table of patches and groups.

The schema is the set of frozen dataclasses below plus ``FIELD_RULES``; errors name the file
and the offending key, e.g. ``patches.yaml: patches[2] (int8_kv_cache_spec).env: must match ...``.
Validation is plain Python on purpose: it runs inside ``import vllm`` in every process, and
pydantic's first import alone costs ~0.4 s there (the start-up budget is 5 % of ``import vllm``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet

IMPLEMENTATION_PACKAGE = "govinda_patch.patches"
NAME_PATTERN = r"[a-z][a-z0-9_]*"
ENV_PATTERN = r"GOVINDA_[A-Z0-9_]+"
MODULE_PATTERN = r"vllm(\.[A-Za-z_][A-Za-z0-9_]*)*"
ATTRIBUTE_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPLEMENTATION_PATTERN = re.escape(IMPLEMENTATION_PACKAGE) + r"\.[a-z_][a-z0-9_]*"
PLATFORMS = ("rocm", "cuda")


class PatchConfigError(ValueError):
    """A patch table that cannot be used; the message names the file and the key."""


class _Invalid(Exception):
    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class TargetSpec:
    module: str
    attribute: str
    platform: Optional[str] = None
    # Versions in which this target is the one to patch (a patch may need different targets in
    # different vLLM releases); None means all of the patch's verified versions.
    vllm_versions: Optional[tuple] = None

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
    # Run the INT8 kernel self-test before the group may take effect in a process.
    kernel_selftest: bool = False


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
            raise _Invalid(where, f"{value!r} must match {hint}")
        return value

    return check


def _boolean(where, value):
    if not isinstance(value, bool):
        raise _Invalid(where, f"{value!r} must be true or false")
    return value


def _specifiers(where, value):
    if not isinstance(value, list) or not value:
        raise _Invalid(where, "must be a non-empty list of PEP 440 specifier sets")
    for spec in value:
        try:
            SpecifierSet(spec)
        except (InvalidSpecifier, TypeError) as exc:
            raise _Invalid(where, f"{spec!r} is not a PEP 440 specifier set ({exc})") from None
    return tuple(value)


def _platform(where, value):
    if value not in PLATFORMS:
        raise _Invalid(where, f"{value!r} must be one of {PLATFORMS}")
    return value


def _platforms(where, value):
    if not isinstance(value, list) or not value:
        raise _Invalid(where, f"must be a non-empty list of {PLATFORMS}")
    return tuple(_platform(f"{where}[{i}]", v) for i, v in enumerate(value))


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _record(where, value, cls, rules: dict, optional: tuple = ()):
    if not isinstance(value, dict):
        raise _Invalid(where or "top level", f"must be a mapping with keys {sorted(rules)}")
    unknown = sorted(set(value) - set(rules))
    if unknown:
        raise _Invalid(_join(where, unknown[0]), f"unknown key; allowed: {sorted(rules)}")
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
    return f"{where}[{index}]" + (f" ({name})" if isinstance(name, str) else "")


TARGET_RULES = {
    "module": _matching(MODULE_PATTERN, "a vllm module path"),
    "attribute": _matching(ATTRIBUTE_PATTERN, "a dotted attribute name"),
    "platform": _platform,
    "vllm_versions": _specifiers,
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
    "targets": _list_of(lambda w, v: _record(w, v, TargetSpec, TARGET_RULES, optional=("platform", "vllm_versions"))),
    "docs": lambda w, v: _record(w, v, PatchDocs, DOCS_RULES),
}
GROUP_RULES = {
    "name": _matching(NAME_PATTERN, NAME_PATTERN),
    "summary": _text,
    "env": _matching(ENV_PATTERN, ENV_PATTERN),
    "kernel_selftest": _boolean,
}


def _schema_version(where, value):
    if value != 1:
        raise _Invalid(where, f"{value!r} is not a supported schema version (1)")
    return value


TABLE_RULES = {
    "schema_version": _schema_version,
    "groups": _list_of(lambda w, v: _record(w, v, GroupSpec, GROUP_RULES, optional=("kernel_selftest",))),
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
    groups = {g.name for g in table.groups}
    for index, patch in enumerate(table.patches):
        if patch.group not in groups:
            raise _Invalid(f"patches[{index}] ({patch.name}).group", f"unknown group {patch.group!r}; declared: {sorted(groups)}")


def parse_table(text: str, source: str) -> PatchTable:
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PatchConfigError(f"{source}: not valid YAML: {exc}") from None
    try:
        table = _record("", raw, PatchTable, TABLE_RULES)
        _cross_checks(table)
    except _Invalid as exc:
        raise PatchConfigError(f"{source}: {exc}") from None
    return table


def load_table(path: Path) -> PatchTable:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchConfigError(f"{path}: cannot read patch table: {exc.strerror}") from None
    return parse_table(text, str(path))
