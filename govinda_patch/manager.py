"""Plans, applies and reverts the patches of ``patches.yaml`` in one process.

Life cycle: ``Overlay.plan()`` decides each patch's state from the switches, the installed vLLM
version and the platform (no vLLM import); ``hook_targets()`` registers a wrapt post-import hook per
target module, so a patch lands when its module is imported (at once if it already is).
Groups are all-or-nothing: a member that is switched off or skipped disables the group, and a member
that fails reverts every member already applied; a member that can never apply (its target module
or implementation is not installed) disables its group at plan time, before any effect reaches vLLM.
Wrappers consult ``group_active()`` on every call: it is False until every member whose module is
imported has landed, it turns the group off (one WARNING) when the platform vLLM resolved is not one
its platform-specific targets patch, it runs the group's declared guard once (``guard:`` in
patches.yaml, e.g. a kernel self-test; a failed guard reverts the whole group), and it never raises
outside strict mode (it runs inside vLLM's backend selection).
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from . import vllm_platform
from .config import GroupSpec, PatchSpec, PatchTable, TargetSpec, load_table
from .excerpt import PATH_CHARS, clip, excerpt, quote
from .guards import run_guard
from .module_lookup import module_findable
from .patching import PatchRecord, resolve_owner
from .settings import REPO_ROOT, Settings, parse_switch, settings_for
from .switch_names import unknown_switch_warning
from .versions import detect_platform, release_of, stack_versions

logger = logging.getLogger("govinda")

PENDING = "pending"
APPLIED = "applied"
DISABLED = "disabled"
SKIPPED_VERSION = "skipped-version"
SKIPPED_PLATFORM = "skipped-platform"
FAILED = "failed"


class GovindaStrictError(RuntimeError):
    """Raised instead of logging when GOVINDA_STRICT=1."""


MAX_LOG_LINE = 4000  # a backstop: messages quote bounded excerpts already


class _OneLineFormatter(logging.Formatter):
    """Every record is one bounded line, whatever text an exception carried."""

    def format(self, record: logging.LogRecord) -> str:
        return clip(super().format(record), MAX_LOG_LINE)


def configure_logging(level: str) -> None:
    if not any(getattr(h, "_govinda", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_OneLineFormatter("govinda %(levelname)s [pid %(process)d] %(message)s"))
        handler._govinda = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)


def skipped_copy_warnings() -> list[str]:
    """Other copies of the overlay on sys.path, which sitecustomize skipped (see its docstring)."""
    guard = sys.modules.get("_govinda_sitecustomize_guard")
    copies = list(getattr(guard, "skipped_copies", None) or ())
    if not copies:
        return []
    shown = ", ".join(quote(copy, PATH_CHARS) for copy in copies[:3]) + (f" and {len(copies) - 3} more" if len(copies) > 3 else "")
    return [f"other copies of the overlay on the path are skipped: {shown}; the one in use is {quote(REPO_ROOT, PATH_CHARS)}"]


def version_matches(version: str | None, specifiers: list[str]) -> bool:
    if version is None:
        return False
    release = Version(release_of(version))
    return any(release in SpecifierSet(spec, prereleases=True) for spec in specifiers)


@dataclass
class PatchEntry:
    spec: PatchSpec
    state: str = PENDING
    reason: str = ""
    active_targets: list[TargetSpec] = field(default_factory=list)
    applied_targets: set[str] = field(default_factory=set)
    record: PatchRecord = field(default_factory=PatchRecord)

    def describe(self) -> str:
        if self.state == PENDING and self.applied_targets:
            waiting = [t.module for t in self.active_targets if t.label not in self.applied_targets]
            return f"{self.spec.name}=partial(waiting for {', '.join(waiting)})"
        if self.state == PENDING:
            return f"{self.spec.name}=pending(import of {', '.join(sorted({t.module for t in self.active_targets}))})"
        return f"{self.spec.name}={self.state}" + (f"({clip(self.reason, 300)})" if self.reason else "")


@dataclass
class PatchContext:
    """What a patch implementation gets for one target."""

    overlay: "Overlay"
    entry: PatchEntry
    target: TargetSpec
    module: object
    owner: object
    attribute: str

    @property
    def record(self) -> PatchRecord:
        return self.entry.record

    def group_active(self) -> bool:
        return self.overlay.group_active(self.entry.spec.group)


class Overlay:
    def __init__(self, settings: Settings, table: PatchTable, versions: dict[str, str | None], platform: str | None):
        self.settings = settings
        self.table = table
        self.versions = versions
        self.platform = platform
        self.entries = {p.name: PatchEntry(p) for p in table.patches}
        self.failed_groups: dict[str, str] = {}
        self.verified_groups: set[str] = set()
        self.landed_groups: set[str] = set()
        self.platform_checked: set[str] = set()
        self.status_logged = False
        self.warnings: list[str] = list(settings.warnings)
        # One line per group that can never apply here, logged at ERROR (strict: raised).
        self.errors: list[str] = []

    # ------------------------------------------------------------------ planning
    @classmethod
    def from_environment(cls, environ=None, settings: Settings | None = None) -> "Overlay":
        if settings is None:
            settings = settings_for(environ)
        table = load_table(settings.patches_file)
        overlay = cls(settings, table, stack_versions(), detect_platform(settings.platform_override))
        overlay.warnings += skipped_copy_warnings()
        overlay.plan()
        return overlay

    def plan(self, environ=None) -> None:
        """Decide every patch's state; the table's switches are read from ``environ`` (default:
        the ``GOVINDA_*`` variables the settings were parsed from)."""
        environ = self.settings.switches if environ is None else environ
        valid_names = sorted(self.entries) + sorted(g.name for g in self.table.groups)
        explicit = None
        if self.settings.explicit_set is not None:
            unknown = [n for n in self.settings.explicit_set if n not in valid_names]
            if len(unknown) == len(self.settings.explicit_set):
                named = f" (unknown: {excerpt(unknown)})" if unknown else ""
                self.warnings.append(
                    f"GOVINDA_PATCHES={excerpt(environ.get('GOVINDA_PATCHES', ''), 80)} selects no patch or group{named}, "
                    f"so every patch is off; valid: {valid_names}; unset it for each patch's default"
                )
            elif unknown:
                self.warnings.append(f"GOVINDA_PATCHES names unknown patches/groups {excerpt(unknown)}; valid: {valid_names}")
            explicit = set(self.settings.explicit_set)
        unknown_switches = unknown_switch_warning(environ, self.table)
        if unknown_switches:
            self.warnings.append(unknown_switches)
        ignored = "ignored: GOVINDA_PATCHES decides" if explicit is not None else None
        group_switches = {
            g.name: parse_switch(environ, g.env, self.warnings, ignored or "ignored: each member's own switch or default applies")
            for g in self.table.groups
        }

        vllm_version = self.versions.get("vllm")
        for entry in self.entries.values():
            spec = entry.spec
            if explicit is not None:
                parse_switch(environ, spec.env, self.warnings, ignored)
                enabled = spec.name in explicit or spec.group in explicit
                why_off = "not in GOVINDA_PATCHES"
            else:
                enabled, why_off = spec.default, "off by default"
                if group_switches[spec.group] is not None:
                    enabled = group_switches[spec.group]
                    why_off = f"{self.table.group(spec.group).env}=0"
                patch_switch = parse_switch(environ, spec.env, self.warnings, f"ignored: {spec.name} stays {'on' if enabled else 'off'}")
                if patch_switch is not None:
                    enabled = patch_switch
                    why_off = f"{spec.env}=0"
            if not enabled:
                entry.state, entry.reason = DISABLED, why_off
                continue
            if vllm_version is None:
                entry.state, entry.reason = SKIPPED_VERSION, "vLLM is not installed"
                continue
            if not version_matches(vllm_version, spec.vllm_versions):
                if self.settings.force:
                    self.warnings.append(f"{spec.name}: vLLM {vllm_version} is outside {spec.vllm_versions}; GOVINDA_FORCE=1 applies it anyway")
                else:
                    entry.state = SKIPPED_VERSION
                    entry.reason = f"vLLM {vllm_version} not in verified {spec.vllm_versions}; GOVINDA_FORCE=1 to try"
                    continue
            if self.platform is not None and self.platform not in spec.platforms:
                entry.state, entry.reason = SKIPPED_PLATFORM, f"platform {self.platform} not in {spec.platforms}"
                continue
            targets = [t for t in spec.targets if self._target_applies(t, vllm_version)]
            absent = [t for t in targets if t.optional and not module_findable(t.module)]
            entry.active_targets = [t for t in targets if t not in absent]
            if not entry.active_targets:
                if absent:  # e.g. a vendor platform plugin that is not installed: nothing to patch here
                    entry.state, entry.reason = SKIPPED_PLATFORM, f"{absent[0].module} is not installed"
                else:
                    entry.state, entry.reason = SKIPPED_VERSION, f"no target declared for vLLM {vllm_version}"
        self._fail_unresolvable(vllm_version)
        self._enforce_groups()

    def _fail_unresolvable(self, vllm_version: str | None) -> None:
        """A member whose target module or implementation is not installed can never apply: its
        group is off from the start, in every process alike (no import of vLLM's modules)."""
        problems: dict[str, list[str]] = {}
        for entry in self.entries.values():
            if entry.state != PENDING:
                continue
            missing = [t.module for t in entry.active_targets if not module_findable(t.module)]
            if missing:
                entry.reason = f"target module {missing[0]} is not in the installed vLLM {vllm_version}"
            elif not module_findable(entry.spec.implementation):
                entry.reason = f"implementation {entry.spec.implementation} does not exist"
            else:
                continue
            entry.state = FAILED
            problems.setdefault(entry.spec.group, []).append(f"{entry.spec.name}: {entry.reason}")
        for group, lines in problems.items():
            self.failed_groups[group] = "; ".join(lines)
            self.errors.append(f"group {group} off, vLLM runs stock: {'; '.join(lines)}")

    def _target_applies(self, target: TargetSpec, vllm_version: str) -> bool:
        if target.platform is not None and self.platform is not None and target.platform != self.platform:
            return False
        # Version-specific targets choose between vLLM lines; GOVINDA_FORCE does not widen them.
        if target.vllm_versions is not None:
            return version_matches(vllm_version, target.vllm_versions)
        return True

    def _enforce_groups(self) -> None:
        for group in self.table.groups:
            members = [self.entries[p.name] for p in self.table.members(group.name)]
            relevant = [m for m in members if m.state != SKIPPED_PLATFORM]
            blockers = [m for m in relevant if m.state != PENDING]
            if blockers and len(blockers) < len(relevant):
                cause = ", ".join(f"{m.spec.name} {m.state}" for m in blockers)
                for member in relevant:
                    if member.state == PENDING:
                        member.state, member.reason = DISABLED, f"group {group.name} incomplete: {cause}"

    # ------------------------------------------------------------------ application
    def hook_targets(self) -> None:
        import wrapt

        for entry in self.entries.values():
            if entry.state != PENDING:
                continue
            for target in entry.active_targets:
                wrapt.register_post_import_hook(self._make_hook(entry.spec.name, target), target.module)

    def _make_hook(self, patch_name: str, target: TargetSpec):
        def hook(module):
            self.apply_target(self.entries[patch_name], target, module)

        return hook

    def apply_target(self, entry: PatchEntry, target: TargetSpec, module) -> None:
        if entry.state != PENDING or target.label in entry.applied_targets:
            return  # idempotent: already applied, or disabled/failed meanwhile
        group = entry.spec.group
        try:
            owner, attribute = resolve_owner(module, target.attribute)
            implementation = importlib.import_module(entry.spec.implementation)
            implementation.apply(PatchContext(self, entry, target, module, owner, attribute))
        except Exception as exc:  # any failure leaves stock vLLM for the whole group
            self.fail_group(group, f"{entry.spec.name} on {target.label}: {type(exc).__name__}: {clip(exc)}", failed=entry)
            return
        entry.applied_targets.add(target.label)
        if all(t.label in entry.applied_targets for t in entry.active_targets):
            entry.state = APPLIED
        logger.debug("applied %s to %s", entry.spec.name, target.label)
        self.log_status_once()

    def fail_group(self, group: str, reason: str, failed: PatchEntry | None = None, level: int = logging.ERROR) -> None:
        if group in self.failed_groups:
            return
        self.failed_groups[group] = reason
        for entry in self.entries.values():
            if entry.spec.group != group:
                continue
            try:
                entry.record.revert()
            except Exception as exc:  # keep reverting the others; the line below says what is left
                reason += f"; revert of {entry.spec.name} failed: {type(exc).__name__}: {clip(exc, 80)}"
            if entry is failed:
                entry.state, entry.reason = FAILED, reason
            elif entry.state in (PENDING, APPLIED):
                entry.state, entry.reason = FAILED, f"group {group} reverted"
        message = f"group {group} reverted to stock vLLM: {reason}"
        if self.settings.strict:
            raise GovindaStrictError(message)
        logger.log(level, message)
        self.log_status_once()  # no-op when the status line is already out: one per process

    def group_active(self, group_name: str) -> bool:
        """Called by wrappers on each call: False means 'behave like stock vLLM'. Never raises
        outside strict mode: an unexpected error turns the group off with one line."""
        try:
            return self._group_active(group_name)
        except GovindaStrictError:
            raise
        except Exception as exc:
            if group_name not in self.failed_groups:
                self.fail_group(group_name, f"could not decide whether the group is active: {type(exc).__name__}: {clip(exc)}")
            return False

    def _group_active(self, group_name: str) -> bool:
        if group_name in self.failed_groups:
            return False
        if group_name not in self.landed_groups:
            if not self._members_landed(group_name):
                return False
        if group_name not in self.platform_checked:
            problem = self.platform_problem(group_name)
            if problem:
                self.fail_group(group_name, problem, level=logging.WARNING)
                return False
            if problem == "":
                self.platform_checked.add(group_name)
        if group_name in self.verified_groups:
            return True
        group: GroupSpec = self.table.group(group_name)
        if group.guard is not None:
            verdict = run_guard(group.guard, self.settings)
            if not verdict.ok:
                self.fail_group(group_name, verdict.message)
                return False
            if verdict.warning:
                if self.settings.strict:
                    raise GovindaStrictError(verdict.warning)
                logger.warning(verdict.warning)
            elif verdict.message:
                logger.info(verdict.message)
        self.verified_groups.add(group_name)
        return True

    def platform_problem(self, group_name: str) -> str | None:
        """Why the group cannot take effect on the platform vLLM resolved: its platform-specific
        targets (the backend priorities) were planned from torch's build, and vLLM may run another
        platform (GOVINDA_PLATFORM set wrongly, or a platform plugin replacing vLLM's own).
        "" when they match or the group has none; None while vLLM has not resolved its platform."""
        modules = sorted({
            target.module
            for entry in self.entries.values()
            if entry.spec.group == group_name and entry.state in (PENDING, APPLIED)
            for target in entry.active_targets
            if target.platform is not None
        })
        if not modules:
            return ""
        platform_cls = vllm_platform.resolved_class()
        if platform_cls is None:
            return None
        if platform_cls.__module__ in modules:
            return ""
        override = self.settings.platform_override
        planned = f"GOVINDA_PLATFORM={override}" if override else f"platform {self.platform or 'unknown'}, from torch's build"
        return (
            f"vLLM runs {vllm_platform.describe(platform_cls)}, a platform this plan does not patch "
            f"({planned}; its platform targets: {', '.join(modules)})"
        )

    def _members_landed(self, group_name: str) -> bool:
        """False while a member's module is imported but its patch has not landed yet (it is still
        being imported): no member may take effect before the others that vLLM can already see."""
        done = True
        for entry in self.entries.values():
            if entry.spec.group != group_name or entry.state != PENDING:
                continue
            done = False
            for target in entry.active_targets:
                if target.label not in entry.applied_targets and target.module in sys.modules:
                    return False
        if done:
            self.landed_groups.add(group_name)
        return True

    def revert_all(self) -> None:
        for entry in self.entries.values():
            entry.record.revert()
            if entry.state == APPLIED or entry.applied_targets:
                entry.state, entry.reason = DISABLED, "reverted"
                entry.applied_targets.clear()

    def planned_signature(self) -> str:
        """The patches this process runs with (applied or waiting for their module)."""
        return ",".join(sorted(name for name, e in self.entries.items() if e.state in (APPLIED, PENDING)))

    # ------------------------------------------------------------------ reporting
    def status_line(self) -> str:
        versions = " ".join(f"{k}={v or 'missing'}" for k, v in self.versions.items())
        patches = " ".join(entry.describe() for entry in self.entries.values())
        return f"status: {versions} platform={self.platform or 'unknown'} | {patches}"

    def log_status_once(self) -> None:
        if self.status_logged:
            return
        self.status_logged = True
        logger.info(self.status_line())

    def check_strict(self) -> None:
        """In strict mode, any warning, version skip or failure is an error."""
        if not self.settings.strict:
            return
        problems = list(self.warnings) + list(self.errors)
        problems += [e.describe() for e in self.entries.values() if e.state in (SKIPPED_VERSION, FAILED)]
        if problems:
            raise GovindaStrictError("; ".join(problems))
