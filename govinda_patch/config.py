"""Load and validate ``patches.yaml``: the single declarative table of patches and groups.

The schema (pydantic models below) is the contract; ``docs`` fields feed the generated docs.
Errors name the file and the offending key, e.g.
``patches.yaml: patches[2] (int8_kv_cache_spec) -> env: must start with GOVINDA_``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Literal, Optional

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

IMPLEMENTATION_PACKAGE = "govinda_patch.patches"
NAME_PATTERN = r"^[a-z][a-z0-9_]*$"
ENV_PATTERN = r"^GOVINDA_[A-Z0-9_]+$"


class PatchConfigError(ValueError):
    """A patch table that cannot be used; the message names the file and the key."""


def _check_specifiers(values: List[str]) -> List[str]:
    for value in values:
        try:
            SpecifierSet(value)
        except InvalidSpecifier as exc:
            raise ValueError(f"{value!r} is not a PEP 440 specifier set ({exc})") from None
    return values


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetSpec(_Strict):
    module: str = Field(pattern=r"^vllm(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    attribute: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    platform: Optional[Literal["rocm", "cuda"]] = None
    # Versions in which this target is the one to patch (a patch may need different targets in
    # different vLLM releases); unset means all of the patch's verified versions.
    vllm_versions: Optional[List[str]] = None

    @field_validator("vllm_versions")
    @classmethod
    def _valid_specifiers(cls, value: Optional[List[str]]) -> Optional[List[str]]:
        return value if value is None else _check_specifiers(value)

    @property
    def label(self) -> str:
        return f"{self.module}:{self.attribute}"


class PatchDocs(_Strict):
    why: str
    how: str
    upstream: str
    remove_when: str


class PatchSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    summary: str = Field(min_length=1)
    group: str = Field(pattern=NAME_PATTERN)
    implementation: str
    default: bool
    env: str = Field(pattern=ENV_PATTERN)
    vllm_versions: List[str] = Field(min_length=1)
    platforms: List[Literal["rocm", "cuda"]] = Field(min_length=1)
    targets: List[TargetSpec] = Field(min_length=1)
    docs: PatchDocs

    @field_validator("vllm_versions")
    @classmethod
    def _valid_specifiers(cls, value: List[str]) -> List[str]:
        return _check_specifiers(value)

    @field_validator("implementation")
    @classmethod
    def _inside_patches_package(cls, value: str) -> str:
        if not re.fullmatch(rf"{re.escape(IMPLEMENTATION_PACKAGE)}\.[a-z_][a-z0-9_]*", value):
            raise ValueError(f"must name a module directly inside {IMPLEMENTATION_PACKAGE} (got {value!r})")
        return value


class GroupSpec(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    summary: str = Field(min_length=1)
    env: str = Field(pattern=ENV_PATTERN)
    # Run the INT8 kernel self-test before the group may take effect in a process.
    kernel_selftest: bool = False


class PatchTable(_Strict):
    schema_version: Literal[1]
    groups: List[GroupSpec]
    patches: List[PatchSpec]

    @model_validator(mode="after")
    def _cross_checks(self) -> "PatchTable":
        names = [p.name for p in self.patches] + [g.name for g in self.groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"names must be unique across patches and groups: {duplicates}")
        envs = [p.env for p in self.patches] + [g.env for g in self.groups]
        duplicate_envs = sorted({e for e in envs if envs.count(e) > 1})
        if duplicate_envs:
            raise ValueError(f"env switches must be unique: {duplicate_envs}")
        groups = {g.name for g in self.groups}
        for patch in self.patches:
            if patch.group not in groups:
                raise ValueError(f"patch {patch.name!r} names unknown group {patch.group!r}; declared: {sorted(groups)}")
        return self

    def group(self, name: str) -> GroupSpec:
        return next(g for g in self.groups if g.name == name)

    def members(self, group_name: str) -> list[PatchSpec]:
        return [p for p in self.patches if p.group == group_name]


def _describe_location(raw: object, loc: tuple) -> str:
    parts: list[str] = []
    node = raw
    for key in loc:
        if isinstance(key, int):
            label = f"[{key}]"
            if isinstance(node, list) and key < len(node) and isinstance(node[key], dict) and "name" in node[key]:
                label += f" ({node[key]['name']})"
            parts.append(label)
        else:
            parts.append(("." if parts else "") + str(key))
        node = node[key] if isinstance(node, (list, dict)) and _has(node, key) else None
    return "".join(parts) or "<top level>"


def _has(node, key) -> bool:
    if isinstance(node, list):
        return isinstance(key, int) and key < len(node)
    return key in node


def parse_table(text: str, source: str) -> PatchTable:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PatchConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise PatchConfigError(f"{source}: top level must be a mapping with schema_version, groups, patches")
    try:
        return PatchTable.model_validate(raw)
    except ValidationError as exc:
        problems = [f"{_describe_location(raw, tuple(err['loc']))}: {err['msg']}" for err in exc.errors()]
        raise PatchConfigError(f"{source}: " + "; ".join(problems)) from None


def load_table(path: Path) -> PatchTable:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchConfigError(f"{path}: cannot read patch table: {exc.strerror}") from None
    return parse_table(text, str(path))
