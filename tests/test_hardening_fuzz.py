"""Property-based fuzz of the overlay's loader and planner (issue #12), in this process.

Generated malformed patch tables (structural mutations of the real patches.yaml and text-level
damage: truncation, duplicate keys, aliases, deep nesting, junk) and generated environments
(valid names with junk values, misspelt names) go through ``bootstrap.plan_and_report``, the
same function every vLLM process runs. Properties: it never raises outside strict mode (strict
raises only GovindaStrictError), its log stays within a size bound, each example stays within the
deadline, and no group is ever planned or left partially applied. Hooks are not registered, so
vLLM is never imported here; the installed vLLM is still what target modules are looked up in.

Issue #25 adds generated cache files (JSON of any type and depth, verdict-shaped records with
fuzzed types, special files in place of the verdict, its lock or a counters snapshot), which the
readers must neither block on nor trust unchecked, and generated platform mismatches (the plan's
platform, the one vLLM resolves, the vendor plugin installed or not, members switched off), for
which the group must take effect whole or not at all.
"""

from __future__ import annotations

import io
import logging
import string
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

import hypothesis  # pinned in requirements/vllm-*.lock: a missing install fails here, not skips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlay_testing import REPO

from govinda_patch import bootstrap
from govinda_patch.config import PatchConfigError, parse_table
from govinda_patch.manager import APPLIED, PENDING, SKIPPED_PLATFORM, GovindaStrictError
from govinda_patch.settings import GLOBAL_SWITCHES

BASE_TEXT = (REPO / "patches.yaml").read_text()
BASE = yaml.safe_load(BASE_TEXT)
MAX_LOG_BYTES = 32 * 1024  # per example: a handful of bounded lines
FUZZ = settings(
    max_examples=120,
    deadline=timedelta(seconds=5),
    derandomize=True,  # the same examples in every CI run
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# ----------------------------------------------------------------------------- strategies
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True),
    st.text(max_size=40), st.sampled_from(["rocm", "cuda", "vllm.nope", "vllm.config.vllm", "==0.18.1", ">=0.26", "int8_kv"]),
)
keys = st.one_of(st.text(max_size=8), st.integers(-3, 3), st.none(), st.booleans(), st.sampled_from(["name", "group", "env", "targets"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4), max_leaves=12)
module_names = st.sampled_from([
    "vllm.config.vllm", "vllm.platforms.rocm", "vllm.platforms.cuda", "vllm.no_such_module",
    "vllm.v1.attention.backends.registry", "vllm.v1.attention.backends.registry_gone", "vllm.platforms.rocm.not_a_package",
])
implementations = st.sampled_from([
    "govinda_patch.patches.backend_priority", "govinda_patch.patches.no_such_patch", "govinda_patch.patches.compile_cache_key",
])


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


BASE_PATHS = [p for p in _paths(BASE) if p]


def _at(node, path):
    for key in path:
        node = node[key]
    return node


RECORD_PATHS = [p for p in _paths(BASE) if isinstance(_at(BASE, p), dict)]


@st.composite
def mutated_tables(draw) -> str:
    """The real table with a few random structural changes, dumped back to YAML."""
    import copy

    table = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):  # a mapping (the table, a group, a patch, a target, docs) gets odd keys
            try:
                record = _at(table, draw(st.sampled_from(RECORD_PATHS)))
            except (KeyError, IndexError, TypeError):
                continue
            if isinstance(record, dict):
                record.update(draw(st.dictionaries(keys, values, min_size=1, max_size=3)))
            continue
        path = draw(st.sampled_from(BASE_PATHS))
        try:
            parent = _at(table, path[:-1])
            leaf = path[-1]
            parent[leaf]  # noqa: B018 - the path may be gone after an earlier mutation
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.sampled_from(["delete", "replace", "module", "implementation", "duplicate"]))
        if action == "delete":
            del parent[leaf]
        elif action == "replace":
            parent[leaf] = draw(values)
        elif action == "module":
            parent[leaf] = draw(module_names)
        elif action == "implementation":
            parent[leaf] = draw(implementations)
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[leaf]))
    return yaml.safe_dump(table, sort_keys=False)


@st.composite
def damaged_texts(draw) -> str:
    """Text-level damage that a structural mutation cannot express."""
    kind = draw(st.sampled_from(["truncate", "duplicate_key", "alias_bomb", "nesting", "junk", "splice"]))
    if kind == "truncate":
        return BASE_TEXT[: draw(st.integers(0, len(BASE_TEXT)))]
    if kind == "duplicate_key":
        lines = BASE_TEXT.splitlines(keepends=True)
        index = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[: index + 1] + [lines[index]] + lines[index + 1:])
    if kind == "alias_bomb":
        width, depth = draw(st.integers(2, 12)), draw(st.integers(2, 12))
        anchors = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
        anchors += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
        return "\n".join(anchors) + "\n" + BASE_TEXT.replace("summary:", f"summary: *a{depth - 1}\n    x_summary:", 1)
    if kind == "nesting":
        depth = draw(st.integers(1, 3000))
        opener = draw(st.sampled_from(["[", "{", "- ", "? "]))
        return "schema_version: 1\ngroups: " + opener * depth
    if kind == "junk":
        return draw(st.text(alphabet=string.printable + "\u00e9\u2028\ufeff", max_size=400))
    start = draw(st.integers(0, len(BASE_TEXT)))
    return BASE_TEXT[:start] + draw(st.text(string.printable, max_size=40)) + BASE_TEXT[start:]


tables = st.one_of(mutated_tables(), damaged_texts(), st.just(BASE_TEXT))

KNOWN_NAMES = [s.name for s in GLOBAL_SWITCHES] + [g["env"] for g in BASE["groups"]] + [p["env"] for p in BASE["patches"]]
# Switches that would turn the run into something else than planning: never generated.
LEFT_ALONE = {"GOVINDA_PATCHES_FILE", "GOVINDA_DISABLE", "GOVINDA_STRICT", "GOVINDA_CACHE_DIR", "GOVINDA_SELFTEST_CHILD"}
switch_values = st.one_of(
    st.sampled_from(["0", "1", "true", "off", "yes", " ON ", "", "maybe", "2", "DEBUG", "chatty", "rocm", "cuda", "skip",
                     "int8_kv", "int8_kv,no_such_patch", ",,,", "cuda_sm90"]),
    st.text(max_size=30).filter(lambda s: "\x00" not in s),
    st.text(string.printable, min_size=1000, max_size=5000),
)


@st.composite
def misspelt_names(draw) -> str:
    name = draw(st.sampled_from(KNOWN_NAMES))
    index = draw(st.integers(8, len(name)))
    edit = draw(st.sampled_from(["insert", "delete", "swap"]))
    if edit == "insert":
        return name[:index] + draw(st.sampled_from("DSX_1")) + name[index:]
    if edit == "delete" and index < len(name):
        return name[:index] + name[index + 1:]
    return name[:index] + name[index:][::-1]


names = st.one_of(st.sampled_from([n for n in KNOWN_NAMES if n not in LEFT_ALONE]), misspelt_names(),
                  st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=300).map(lambda s: "GOVINDA_" + s))
environments = st.dictionaries(names.filter(lambda n: n not in LEFT_ALONE), switch_values, max_size=6)


# ----------------------------------------------------------------------------- the properties
@pytest.fixture(scope="module")
def table_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "patches.yaml"


@pytest.fixture(scope="module")
def log():
    """Collects the overlay's log lines for each example (the overlay's own handler goes to stderr)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("govinda")
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)


def _plan(table_file: Path, text: str, environ: dict, log: io.StringIO, strict: bool):
    table_file.write_text(text, encoding="utf-8", errors="surrogatepass")
    env = dict(environ, GOVINDA_PATCHES_FILE=str(table_file), GOVINDA_SELFTEST="skip")
    if strict:
        env["GOVINDA_STRICT"] = "1"
    log.seek(0)
    log.truncate()
    try:
        overlay = bootstrap.plan_and_report(env)
    except GovindaStrictError:
        assert strict, "GovindaStrictError outside strict mode"
        overlay = None
    text_logged = log.getvalue()
    assert len(text_logged.encode("utf-8", "surrogatepass")) <= MAX_LOG_BYTES, text_logged[:2000]
    if overlay is not None:
        _assert_no_partial_group(overlay)
    elif not strict:  # off in this process: exactly one line says why
        assert [line for line in text_logged.splitlines() if "overlay off" in line] == text_logged.splitlines()[-1:], text_logged[:2000]
    hypothesis.event("strict" if strict else "lenient", "overlay" if overlay is not None else "off")
    return overlay


def _assert_no_partial_group(overlay) -> None:
    for group in overlay.table.groups:
        members = [e for e in overlay.entries.values() if e.spec.group == group.name and e.state != SKIPPED_PLATFORM]
        pending = [e for e in members if e.state == PENDING]
        assert not pending or len(pending) == len(members), [e.describe() for e in members]
        assert not (pending and group.name in overlay.failed_groups), overlay.failed_groups


def _fail_one_member(overlay, choice: int) -> None:
    """A member whose target turns out to lack its attribute at import time: the group must end
    with no member applied or pending (every other member reverted)."""
    pending = [e for e in overlay.entries.values() if e.state == PENDING and e.active_targets]
    if not pending:
        return
    entry = pending[choice % len(pending)]
    overlay.apply_target(entry, entry.active_targets[0], object())
    states = {e.state for e in overlay.entries.values() if e.spec.group == entry.spec.group}
    assert not states & {PENDING, APPLIED}, states


@FUZZ
@given(text=tables, choice=st.integers(0, 10))
def test_generated_tables_never_crash_the_loader(table_file, log, text, choice):
    # The table's own errors are always the clear kind: one bounded line naming the source.
    try:
        parse_table(text, "fuzz.yaml")
    except PatchConfigError as exc:
        message = str(exc)
        assert message.startswith("fuzz.yaml: ") and "\n" not in message and len(message) <= 1000, message[:2000]
    overlay = _plan(table_file, text, {}, log, strict=False)
    if overlay is not None:
        _fail_one_member(overlay, choice)
    _plan(table_file, text, {}, log, strict=True)


@FUZZ
@given(environ=environments, text=st.one_of(st.just(BASE_TEXT), mutated_tables()))
def test_generated_environments_never_crash_the_loader(table_file, log, environ, text):
    _plan(table_file, text, environ, log, strict=False)
    _plan(table_file, text, environ, log, strict=True)


# ----------------------------------------------------------------------------- cache files (issue #25)
# What can sit where the self-test verdict, its lock or a counters snapshot should be: JSON of any
# type and depth, verdict-shaped records with fuzzed field types, pathological nesting, binary junk,
# and special files. Property: the reader never blocks or raises, trusts only a schema-valid regular
# file, and otherwise reruns the (recorded) child and leaves a regular, valid file behind.
CACHE_FUZZ = settings(FUZZ, max_examples=60)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True), st.text(max_size=20)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
verdict_records = st.fixed_dictionaries(
    {"ok": st.one_of(st.booleans(), st.sampled_from(["false", "true", 0, 1, None])), "device": st.one_of(st.text(max_size=20), json_values)},
    optional={"summary": json_values, "reason": json_values, "uncached": json_values, "cacheable": json_values},
)
cache_bytes = st.one_of(
    json_values.map(lambda v: __import__("json").dumps(v).encode()),
    verdict_records.map(lambda v: __import__("json").dumps(v).encode()),
    st.tuples(st.sampled_from(["[", "{\"a\":", "[{\"ok\": true, \"x\": "]), st.integers(1, 120_000)).map(lambda t: (t[0] * t[1]).encode()),
    st.binary(max_size=200),
)
SPECIAL_KINDS = ["fifo", "symlink_to_fifo", "dangling_symlink", "directory", "socket"]
cache_entries = st.one_of(cache_bytes.map(lambda data: ("regular", data)), st.sampled_from(SPECIAL_KINDS).map(lambda kind: (kind, b"")))


def _place(path: Path, entry) -> None:
    import os
    import socket

    kind, data = entry
    if kind == "regular":
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink_to_fifo":
        os.mkfifo(path.with_name(path.name + ".fifo"))
        path.symlink_to(path.with_name(path.name + ".fifo"))
    elif kind == "dangling_symlink":
        path.symlink_to(path.with_name("nowhere"))
    elif kind == "directory":
        path.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()


def _valid_verdict(entry):
    from pydantic import ValidationError

    from govinda_patch.int8.cache_schemas import SelftestVerdict

    kind, data = entry
    if kind != "regular":
        return None
    try:
        return SelftestVerdict.model_validate_json(data)
    except ValidationError:
        return None


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-cache")


def _fresh(root: Path) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(dir=root))


@CACHE_FUZZ
@given(verdict=cache_entries, lock=st.one_of(st.none(), cache_entries))
def test_generated_cache_files_never_hang_or_fool_the_selftest(cache_root, monkeypatch, verdict, lock):
    import json

    from govinda_patch.int8 import child as child_runner, selftest
    from govinda_patch.int8.device_cache import device_key
    from govinda_patch.int8.fingerprint import machine_key
    from govinda_patch.int8.guard import kernel_selftest
    from govinda_patch.settings import Settings

    calls = []
    answer = {"ok": False, "device": "fuzz-device", "reason": "the recorded child's answer"}
    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: calls.append(a) or dict(answer))
    root = _fresh(cache_root)
    directory = root / "selftest"
    directory.mkdir()
    path = directory / f"{machine_key(device_key(None))}.json"
    _place(path, verdict)
    if lock is not None:
        _place(directory / ".lock", lock)
    env = Settings.from_env({"GOVINDA_CACHE_DIR": str(root), "GOVINDA_SELFTEST": "auto"})
    result = selftest.cached_verdict(env)
    trusted = _valid_verdict(verdict)
    if trusted is not None:
        assert calls == [] and result["ok"] is trusted.ok  # a valid verdict is taken as it is, never coerced
    else:
        assert len(calls) == 1 and result["ok"] is False and path.name in result["cache_problem"]
        if verdict[0] != "directory":
            assert path.is_file() and not path.is_symlink() and json.loads(path.read_text()) == answer
    for note in ("cache_problem", "uncached", "lock_note"):
        assert "\n" not in result.get(note, "") and len(result.get(note, "")) < 2000
    line = kernel_selftest(env)  # the guard's one line, from whatever is cached now
    text = line.message + (line.warning or "")
    assert line.ok is (trusted is not None and trusted.ok) and "\x1b" not in text and len(text) < 3000
    hypothesis.event("trusted" if trusted is not None else f"replaced {verdict[0]}")


@CACHE_FUZZ
@given(entries=st.lists(cache_entries, min_size=1, max_size=4))
def test_generated_counters_snapshots_never_hang_or_crash_the_reader(cache_root, monkeypatch, entries):
    from pydantic import ValidationError

    from govinda_patch.int8 import counters
    from govinda_patch.int8.cache_schemas import CountersSnapshot

    root = _fresh(cache_root)
    (root / "counters").mkdir()
    monkeypatch.setenv("GOVINDA_CACHE_DIR", str(root))
    valid = 0
    for index, entry in enumerate(entries):
        _place(root / "counters" / f"{index}.json", entry)
        if entry[0] == "regular":
            try:
                CountersSnapshot.model_validate_json(entry[1])
                valid += 1
            except ValidationError:
                pass
    snapshots, ignored = counters.read_all()
    assert len(snapshots) == valid and len(snapshots) + len(ignored) == len(entries)
    assert all("\n" not in line and len(line) < 1000 for line in ignored)


# ----------------------------------------------------------------------------- platform mismatch (issue #25)
# The plan picks platform targets from GOVINDA_PLATFORM or torch's build; vLLM then runs whatever
# platform it resolves (its own ROCm or CUDA one, Hygon's plugin, a foreign plugin, or none yet).
# Property: the group takes effect only where vLLM's platform is one its targets patch; otherwise
# it is off as a whole, with one bounded WARNING naming the platform (strict: GovindaStrictError).
PLATFORM_FUZZ = settings(FUZZ, max_examples=60)
BASE_TABLE = parse_table(BASE_TEXT, "patches.yaml")
VLLM_PLATFORMS = {
    "vllm.platforms.rocm": "RocmPlatform", "vllm.platforms.cuda": "NvmlCudaPlatform", "vllm_hcu.platforms.hcu": "HCUPlatform",
    "foreign_dcu.platform": "ForeignDcuPlatform", "vllm.platforms.cpu": "CpuPlatform", "vllm.platforms.interface": "UnspecifiedPlatform",
}
platform_cases = st.fixed_dictionaries({
    "override": st.sampled_from([None, "rocm", "cuda"]),
    "vllm_platform": st.one_of(st.none(), st.sampled_from(sorted(VLLM_PLATFORMS))),
    "hcu_installed": st.booleans(),
    "switches": st.dictionaries(
        st.sampled_from(["GOVINDA_PATCH_INT8_BACKEND_PRIORITY", "GOVINDA_PATCH_INT8_BACKEND_PRIORITY_HCU", "GOVINDA_INT8_KV"]),
        st.sampled_from(["0", "1"]), max_size=2),
    "strict": st.booleans(),
})


@PLATFORM_FUZZ
@given(case=platform_cases)
def test_generated_platform_mismatches_leave_the_group_whole(log, case):
    import sys
    import types

    from govinda_patch.manager import Overlay
    from govinda_patch.settings import settings_for
    from govinda_patch.versions import detect_platform, stack_versions

    env = dict(case["switches"], GOVINDA_SELFTEST="skip", GOVINDA_PLATFORM=case["override"] or "rocm")
    if case["override"] is None:
        env.pop("GOVINDA_PLATFORM")  # detected from torch's build (this host: cuda)
    if case["strict"]:
        env["GOVINDA_STRICT"] = "1"
    hcu_dir = str(REPO / "tests" / "platform_plugins" / "hcu")
    saved_path, saved_platforms = list(sys.path), sys.modules.get("vllm.platforms")
    try:
        if case["hcu_installed"]:
            sys.path.insert(0, hcu_dir)
        overlay = Overlay(settings_for(env), BASE_TABLE, stack_versions(), detect_platform(env.get("GOVINDA_PLATFORM")))
        overlay.plan()  # the table is the real one: what varies is the platform, the plan and the switches
        group = "int8_kv"
        for entry in overlay.entries.values():  # every member lands (no vLLM module is imported here)
            if entry.state == PENDING:
                entry.state, entry.applied_targets = APPLIED, {t.label for t in entry.active_targets}
        planned_modules = {t.module for e in overlay.entries.values() if e.state == APPLIED for t in e.active_targets if t.platform}
        fake = types.ModuleType("vllm.platforms")
        if case["vllm_platform"] is not None:
            cls = type(VLLM_PLATFORMS[case["vllm_platform"]], (), {"__module__": case["vllm_platform"]})
            fake._current_platform = cls()
        else:
            fake._current_platform = None
        sys.modules["vllm.platforms"] = fake
        log.seek(0)
        log.truncate()
        try:
            active = overlay.group_active(group)
        except GovindaStrictError as exc:
            assert case["strict"], "GovindaStrictError outside strict mode"
            assert case["vllm_platform"] in str(exc) and len(str(exc)) < 2000
            return
    finally:
        sys.path[:] = saved_path
        if saved_platforms is None:
            sys.modules.pop("vllm.platforms", None)
        else:
            sys.modules["vllm.platforms"] = saved_platforms
    lines = [line for line in log.getvalue().splitlines() if not line.startswith("status:")]
    if not planned_modules:  # the group is off by plan (a switch): no wrapper exists to ask
        assert lines == [] and not {e.state for e in overlay.entries.values()} & {PENDING, APPLIED}
    elif case["vllm_platform"] is None or case["vllm_platform"] in planned_modules:
        assert active is True and lines == [], lines  # undecided yet, or the right platform
    else:
        assert active is False and len(lines) == 1, lines
        assert VLLM_PLATFORMS[case["vllm_platform"]] in lines[0] and len(lines[0]) < 2000, lines
        assert not {e.state for e in overlay.entries.values()} & {PENDING, APPLIED}
    _assert_no_partial_group(overlay)
    hypothesis.event("active" if active else "stock")
