"""Issue #12: no input, environment or file-system state may crash vLLM or leave a group half-applied.

One test per class of the issue, each against the real installed vLLM in a fresh interpreter with
the overlay on PYTHONPATH (simulated DCU): vLLM still imports and selects its stock backend, the
overlay logs exactly one clear line, and GOVINDA_STRICT=1 raises instead.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from overlay_testing import REPO, run_module

STOCK_PROBE = """
from vllm.platforms import current_platform  # resolve the platform first, as vLLM does
import vllm.platforms.rocm as rocm
from vllm.v1.attention.backends.registry import AttentionBackendEnum
import vllm.config.vllm as config_module
from govinda_patch.patching import is_govinda_wrapper
report({
    "priorities": [b.name for b in rocm._get_backend_priorities(False, False)],
    "custom_registered": AttentionBackendEnum.CUSTOM.is_overridden(),
    "compute_hash_wrapped": is_govinda_wrapper(config_module.VllmConfig.__dict__["compute_hash"]),
})
"""
STOCK = {"custom_registered": False, "compute_hash_wrapped": False}
# A bounded line: the excerpt caps are 200-400 characters; the status line is the longest one.
MAX_LINE = 2000


def _problems(result) -> list[str]:
    return [line for line in result.govinda_lines() if " ERROR " in line or " WARNING " in line]


def _assert_stock(result) -> None:
    assert result.returncode == 0, result
    assert "CUSTOM" not in result.result["priorities"], result
    assert {k: result.result[k] for k in STOCK} == STOCK, result


def _assert_one_line(result, *words) -> str:
    problems = _problems(result)
    assert len(problems) == 1, result.govinda_lines()
    assert all(word in problems[0] for word in words), problems[0]
    assert len(problems[0]) < MAX_LINE
    assert "Traceback" not in result.stderr, result
    return problems[0]


def _assert_strict_raises(child, env, *words) -> None:
    strict = child(STOCK_PROBE, dict(env, GOVINDA_STRICT="1"))
    assert strict.returncode != 0, strict
    assert "GovindaStrictError" in strict.stderr and all(w in strict.stderr for w in words), strict


def _table(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "patches.yaml"
    path.write_text(text)
    return path


def _cli(args, env, timeout=120, warm_executable=False) -> subprocess.CompletedProcess:
    """``python -m govinda_patch ARGS`` (forked from the warm interpreter: the doctor imports vLLM)."""
    return run_module("govinda_patch", args, env, timeout=timeout, cwd=REPO / "tests", warm_executable=warm_executable)


# ----------------------------------------------------------------------------- 1. cache directory
def test_unwritable_cache_dir_degrades_to_an_uncached_selftest(child, dcu_env, tmp_path):
    blocker = tmp_path / "a-regular-file"
    blocker.write_text("not a directory\n")
    # GOVINDA_SELFTEST=auto and no GPU: the (uncached) self-test runs and fails, so the group
    # must go back to stock with one line that also names the unusable cache directory.
    env = dict(dcu_env, GOVINDA_SELFTEST="auto", GOVINDA_CACHE_DIR=str(blocker / "cache"))
    env.pop("TRITON_INTERPRET", None)
    # Each of the three runs below starts the self-test child (``sys.executable -m govinda_patch``):
    # forked from the warm interpreter too, it skips importing torch again.
    child = functools.partial(child, warm_executable=True)
    result = child(STOCK_PROBE, env)
    _assert_stock(result)
    _assert_one_line(result, " ERROR ", "kernel self-test failed", "no GPU", "not cached", "NotADirectoryError")
    _assert_strict_raises(child, env, "NotADirectoryError")

    doctor = _cli(["doctor"], env, timeout=300, warm_executable=True)
    assert "Traceback" not in doctor.stderr + doctor.stdout, doctor.stderr
    assert "self-test for group int8_kv: FAILED" in doctor.stdout and "NotADirectoryError" in doctor.stdout
    assert doctor.returncode == 1
    counters = _cli(["counters"], env)
    assert counters.returncode == 1 and "no dispatch counters" in counters.stdout, counters.stderr
    assert "Traceback" not in counters.stderr


# ----------------------------------------------------------------------------- 2. half-applied group
def test_a_target_module_missing_from_vllm_disables_the_whole_group_up_front(child, dcu_env, tmp_path):
    gone = "vllm.v1.attention.backends.registry_removed_upstream"
    text = (REPO / "patches.yaml").read_text().replace("module: vllm.v1.attention.backends.registry\n", f"module: {gone}\n")
    assert gone in text
    env = dict(dcu_env, GOVINDA_PATCHES_FILE=str(_table(tmp_path, text)))
    result = child(STOCK_PROBE, env)
    _assert_stock(result)
    _assert_one_line(result, " ERROR ", "group int8_kv off", gone, "not in the installed vLLM")
    status = [line for line in result.govinda_lines() if "status:" in line]
    assert len(status) == 1 and "int8_backend_priority=disabled(group int8_kv incomplete" in status[0], status
    _assert_strict_raises(child, env, gone)

    plan = _cli(["status"], env)
    assert plan.returncode == 1 and f"error: group int8_kv off, vLLM runs stock: int8_backend_registration: target module {gone}" in plan.stdout


# ----------------------------------------------------------------------------- 3. two copies on the path
def test_two_copies_on_the_path_chain_once_to_the_foreign_sitecustomize(child, base_env, tmp_path):
    link = tmp_path / "checkout-link"
    link.symlink_to(REPO, target_is_directory=True)
    second = tmp_path / "second-checkout"
    second.mkdir()
    shutil.copy(REPO / "sitecustomize.py", second / "sitecustomize.py")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "sitecustomize.py").write_text("import builtins\nbuiltins.FOREIGN_RUNS = getattr(builtins, 'FOREIGN_RUNS', 0) + 1\n")
    code = """
    import builtins, sys
    triggers = sum(1 for f in sys.meta_path if getattr(f, "govinda_trigger", False))
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    report({"foreign_runs": getattr(builtins, "FOREIGN_RUNS", 0), "triggers": triggers,
            "custom": AttentionBackendEnum.CUSTOM.get_path() if AttentionBackendEnum.CUSTOM.is_overridden() else None})
    """
    symlink_only = dict(base_env, PYTHONPATH=os.pathsep.join([str(REPO), str(link), str(foreign)]))
    result = child(code, symlink_only)
    assert result.returncode == 0, result
    assert result.result == {"foreign_runs": 1, "triggers": 1, "custom": "govinda_patch.int8.backend.GovindaInt8AttentionBackend"}
    assert _problems(result) == [] and "RecursionError" not in result.stderr, result  # the same files: nothing to say

    env = dict(base_env, PYTHONPATH=os.pathsep.join([str(REPO), str(link), str(second), str(foreign)]))
    result = child(code, env)
    assert result.returncode == 0, result
    assert result.result["foreign_runs"] == 1 and result.result["triggers"] == 1 and result.result["custom"], result
    _assert_one_line(result, " WARNING ", "other copies of the overlay", str(second / "sitecustomize.py"))
    strict = child(code, dict(env, GOVINDA_STRICT="1"))
    assert strict.returncode != 0 and "GovindaStrictError" in strict.stderr and "other copies" in strict.stderr, strict


# ----------------------------------------------------------------------------- 4. bounded error text
def _alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    base = (REPO / "patches.yaml").read_text()
    # The anchors come first (YAML needs them before use); the bomb sits where validation quotes it.
    return "\n".join(["bomb:"] + ["  " + line for line in lines]) + "\n" + base.replace(
        "  - name: int8_backend_registration\n", f"  - name: *a{levels - 1}\n", 1)


def test_a_yaml_alias_bomb_is_refused_fast_with_one_bounded_line(child, dcu_env, tmp_path):
    table = _table(tmp_path, _alias_bomb())
    assert table.stat().st_size - len((REPO / "patches.yaml").read_bytes()) < 2_000  # the bomb itself is small
    env = dict(dcu_env, GOVINDA_PATCHES_FILE=str(table))
    result = child(STOCK_PROBE, env)
    _assert_stock(result)
    line = _assert_one_line(result, " ERROR ", "overlay off", str(table), "aliases")
    assert len(line) < 500
    _assert_strict_raises(child, env, "aliases")


# ----------------------------------------------------------------------------- 5. silently accepted mistakes
def test_a_duplicate_key_in_a_patch_entry_is_an_error(child, dcu_env, tmp_path):
    text = (REPO / "patches.yaml").read_text().replace("    default: true\n", "    default: true\n    default: false\n", 1)
    env = dict(dcu_env, GOVINDA_PATCHES_FILE=str(_table(tmp_path, text)))
    result = child(STOCK_PROBE, env)
    _assert_stock(result)
    _assert_one_line(result, " ERROR ", "duplicate key 'default'", "line")
    _assert_strict_raises(child, env, "duplicate key")


@pytest.mark.parametrize(
    "variables, words",
    [
        ({"GOVINDA_DISABLED": "1", "GOVINDA_INT8KV": "0"},
         ["GOVINDA_DISABLED (did you mean GOVINDA_DISABLE?)", "GOVINDA_INT8KV (did you mean GOVINDA_INT8_KV?)"]),
        ({"GOVINDA_PATCH_INT8_KV_CACHE_SPEC": "maybe"}, ["GOVINDA_PATCH_INT8_KV_CACHE_SPEC='maybe'", "int8_kv_cache_spec stays on"]),
    ],
    ids=["misspelt-switches", "malformed-value"],
)
def test_misspelt_or_malformed_switches_warn_once_and_say_what_applies(child, dcu_env, variables, words):
    env = dict(dcu_env, **variables)
    result = child(STOCK_PROBE, env)
    assert result.returncode == 0, result
    # None of these switches is valid, so the overlay stays on: the warning says so.
    assert result.result["priorities"][0] == "CUSTOM" and result.result["compute_hash_wrapped"] is True, result
    _assert_one_line(result, " WARNING ", *words)
    strict = child(STOCK_PROBE, dict(env, GOVINDA_STRICT="1"))
    assert strict.returncode != 0 and "GovindaStrictError" in strict.stderr and words[0] in strict.stderr, strict


# ----------------------------------------------------------------------------- 6. status and doctor
@pytest.mark.parametrize("command", ["status", "doctor"])
def test_status_and_doctor_print_one_line_for_a_bad_table(base_env, tmp_path, command):
    for text, words in ((_alias_bomb(), "aliases"), ("schema_version: 1\ngroups: [\n", "not valid YAML")):
        table = _table(tmp_path, text)
        done = _cli([command], dict(base_env, GOVINDA_PATCHES_FILE=str(table)), timeout=60)  # the bomb once took > 60 s
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("govinda: error: ") and words in lines[0], done.stderr
        assert str(table) in lines[0] and len(lines[0]) < 1000


# ----------------------------------------------------------------------------- in-process details
class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@pytest.fixture
def overlay_log():
    handler = _Lines()
    logger = logging.getLogger("govinda")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


@pytest.fixture
def vllm_not_imported():
    """This process as it is before ``import vllm``, for the cases that plan an overlay in-process.

    A case that imported vLLM here earlier (test_scope's in-process scopes) leaves the group's target
    modules imported but not patched by a fresh Overlay, which then rightly keeps the group inactive
    and never reaches the guard these cases test. Restored afterwards, dropping any copy imported meanwhile.
    """
    def ours(name):
        return name == "vllm" or name.startswith("vllm.")

    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in saved:
        del sys.modules[name]
    yield
    for name in [name for name in sys.modules if ours(name)]:
        del sys.modules[name]
    sys.modules.update(saved)


def _overlay(**environ):
    from govinda_patch.manager import Overlay

    return Overlay.from_environment({"GOVINDA_PLATFORM": "rocm", **environ})


def test_a_passing_selftest_with_an_unusable_cache_warns_once(monkeypatch, tmp_path, overlay_log, vllm_not_imported):
    from govinda_patch.int8 import selftest
    from govinda_patch.manager import GovindaStrictError

    # The child is the expensive part (a real kernel run); what is tested here is the cache around it.
    monkeypatch.setattr(selftest.child, "run_subcommand", lambda: {"ok": True, "device": "test-device", "summary": {}})
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {"GOVINDA_SELFTEST": "auto", "GOVINDA_CACHE_DIR": str(blocker)}
    overlay = _overlay(**env)
    assert overlay.group_active("int8_kv") is True
    assert [l for l in overlay_log if l.startswith(("WARNING", "ERROR"))] == [overlay_log[-1]]
    assert "kernel self-test passed on test-device" in overlay_log[-1] and "NotADirectoryError" in overlay_log[-1]
    with pytest.raises(GovindaStrictError, match="not cached"):
        _overlay(GOVINDA_STRICT="1", **env).group_active("int8_kv")
    # A usable cache directory: the verdict is stored, the next process reads it without a child.
    usable = tmp_path / "cache"
    first = selftest.cached_verdict(_overlay(GOVINDA_CACHE_DIR=str(usable)).settings)
    monkeypatch.setattr(selftest.child, "run_subcommand", lambda: pytest.fail("the cached verdict was not used"))
    assert selftest.cached_verdict(_overlay(GOVINDA_CACHE_DIR=str(usable)).settings) == first == {"ok": True, "device": "test-device", "summary": {}}


def test_a_member_whose_module_is_imported_but_not_patched_keeps_the_group_inactive(monkeypatch, vllm_not_imported):
    overlay = _overlay(GOVINDA_SELFTEST="skip")
    entry = overlay.entries["int8_backend_registration"]
    target = entry.active_targets[0]
    # The registry module is being imported (in sys.modules, its post-import hook not yet run).
    monkeypatch.setitem(sys.modules, target.module, types.ModuleType(target.module))
    assert overlay.group_active("int8_kv") is False
    entry.applied_targets.add(target.label)
    entry.state = "applied"
    assert overlay.group_active("int8_kv") is True


def test_group_active_never_raises_outside_strict_mode(monkeypatch, overlay_log, vllm_not_imported):
    from govinda_patch.int8 import selftest

    def broken(settings):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(selftest, "cached_verdict", broken)
    overlay = _overlay(GOVINDA_SELFTEST="auto")
    assert overlay.group_active("int8_kv") is False
    errors = [l for l in overlay_log if l.startswith("ERROR")]
    assert len(errors) == 1 and "self-test could not run: PermissionError" in errors[0], overlay_log


def test_an_unknown_or_broken_guard_leaves_vllm_stock_with_one_line(monkeypatch, tmp_path, overlay_log, vllm_not_imported):
    from govinda_patch import bootstrap, guards
    from govinda_patch.manager import GovindaStrictError

    declared = "    guard: kernel_selftest\n"
    base = (REPO / "patches.yaml").read_text()
    assert declared in base
    for name in ("kernel_self_test", "x" * 5000):
        table = _table(tmp_path, base.replace(declared, f"    guard: {name}\n"))
        env = {"GOVINDA_PLATFORM": "rocm", "GOVINDA_PATCHES_FILE": str(table)}
        overlay_log.clear()
        assert bootstrap.plan_and_report(env) is None  # no overlay: nothing is hooked, vLLM stays stock
        errors = [line for line in overlay_log if line.startswith(("WARNING", "ERROR"))]
        assert len(errors) == 1 and len(errors[0]) < MAX_LINE, overlay_log
        assert "overlay off" in errors[0] and "groups[0] (int8_kv).guard" in errors[0] and "kernel_selftest" in errors[0]
        with pytest.raises(GovindaStrictError, match="guard"):
            bootstrap.plan_and_report(dict(env, GOVINDA_STRICT="1"))
    # A registered guard whose check cannot be imported fails its group, never the caller.
    monkeypatch.setitem(guards.GUARDS, "kernel_selftest", "govinda_patch.int8.no_such_module:check")
    overlay_log.clear()
    overlay = _overlay(GOVINDA_SELFTEST="auto")
    assert overlay.group_active("int8_kv") is False
    errors = [line for line in overlay_log if line.startswith("ERROR")]
    assert len(errors) == 1 and "guard kernel_selftest could not run: ModuleNotFoundError" in errors[0], overlay_log
