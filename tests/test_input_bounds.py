"""Issue #25, the small ones: every user-supplied value is bounded and escaped, and the kill switch is
the cheapest start.

Bounds of GOVINDA_TUNE_BUDGET_S, head...tail excerpts of long paths (the cause of an error stays in
its line), control characters escaped wherever a path, a variable name or a value is quoted, a
warning for an empty GOVINDA_PATCHES selection, ``~`` in GOVINDA_PATCHES_FILE, a missing owner
class named as such, and GOVINDA_DISABLE=1 read without importing anything.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import types

import pytest

from govinda_patch import excerpt, settings
from govinda_patch.manager import GovindaStrictError, Overlay
from overlay_testing import REPO

RAW_CONTROLS = ("\x1b", "\x07", "\x01", "\x7f", "\x9b")


# ----------------------------------------------------------------------------- the excerpt function
@pytest.mark.parametrize("text", ["/tmp/x\x1b[31m\x07\x01\x7fy\nz", "\u202eevil", "a\tb\rc", "\x00"])
def test_quote_escapes_every_control_character(text):
    shown = excerpt.quote(text)
    assert not any(c in shown for c in RAW_CONTROLS + ("\n", "\r", "\t", "\x00", "\u202e"))
    assert shown == excerpt.escape(text)
    assert "\\" in shown


def test_quote_keeps_both_ends_of_a_long_path():
    path = "/srv/cache/" + "a" * 10_000 + "/selftest"
    shown = excerpt.quote(path, 160)
    assert len(shown) == 160 and shown.startswith("/srv/cache/") and shown.endswith("/selftest") and "..." in shown
    assert excerpt.quote("short") == "short"


def test_clip_and_excerpt_escape_too():
    assert excerpt.clip("a\x1b[2Jb\n\nc") == "a\\x1b[2Jb c"
    assert "\x1b" not in excerpt.excerpt(["\x1b"]) and "\\x1b" in excerpt.excerpt(["\x1b"])


def test_an_oserror_names_its_cause_before_its_file():
    exc = NotADirectoryError(20, "Not a directory", "/x/" + "b" * 5000)
    text = excerpt.error_text(exc)
    assert text.startswith("NotADirectoryError: Not a directory (/x/") and len(text) < 300


# ----------------------------------------------------------------------------- switches
@pytest.mark.parametrize("raw, expected, warned", [
    ("1e99", settings.MAX_TUNE_BUDGET_S, "more than"), ("inf", settings.MAX_TUNE_BUDGET_S, "more than"),
    ("3600", 3600.0, None), ("2.5e6", settings.MAX_TUNE_BUDGET_S, "more than"),
    ("nan", settings.DEFAULT_TUNE_BUDGET_S, "not a positive"), ("-1", settings.DEFAULT_TUNE_BUDGET_S, "not a positive"),
    ("90", 90.0, None),
])
def test_the_tuning_budget_is_bounded(raw, expected, warned):
    parsed = settings.Settings.from_env({"GOVINDA_TUNE_BUDGET_S": raw})
    assert parsed.tune_budget_s == expected
    assert [w for w in parsed.warnings if "GOVINDA_TUNE_BUDGET_S" in w] == ([] if warned is None else [parsed.warnings[0]])
    if warned:
        assert warned in parsed.warnings[0]
    # subprocess's poll timeout is in milliseconds, a C int: the tuning child's timeout must fit.
    from govinda_patch.int8.tuner import TUNE_TIMEOUT_MARGIN_S

    assert (parsed.tune_budget_s + TUNE_TIMEOUT_MARGIN_S) * 1000 < 2**31 - 1


def test_home_is_expanded_in_the_patches_file_like_in_the_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    parsed = settings.Settings.from_env({"GOVINDA_PATCHES_FILE": "~/table.yaml", "GOVINDA_CACHE_DIR": "~/cache"})
    assert parsed.patches_file == tmp_path / "table.yaml" and parsed.cache_dir == tmp_path / "cache"


@pytest.mark.parametrize("value", [",", " , ,", "no_such_patch", "no_such, ,other"])
def test_an_empty_patches_selection_warns(value):
    overlay = Overlay.from_environment({"GOVINDA_PATCHES": value, "GOVINDA_PLATFORM": "rocm"})
    empty = [w for w in overlay.warnings if "selects no patch or group" in w]
    assert len(empty) == 1 and "every patch is off" in empty[0] and len(overlay.warnings) == 1, overlay.warnings
    assert {e.state for e in overlay.entries.values()} <= {"disabled", "skipped-platform"}
    with pytest.raises(GovindaStrictError, match="selects no patch"):
        Overlay.from_environment({"GOVINDA_PATCHES": value, "GOVINDA_PLATFORM": "rocm", "GOVINDA_STRICT": "1"}).check_strict()


def test_a_missing_owner_class_is_named():
    from govinda_patch.patching import resolve_owner

    module = types.ModuleType("vllm.config.vllm")
    module.__spec__ = types.SimpleNamespace(_initializing=True)  # as during its import
    with pytest.raises(AttributeError) as missing:
        resolve_owner(module, "VllmConfig.compute_hash")
    assert str(missing.value) == "vllm.config.vllm has no attribute 'VllmConfig', the owner of 'compute_hash' in 'VllmConfig.compute_hash'"


def test_a_missing_owner_class_in_the_real_vllm_is_one_clear_line(child, dcu_env, tmp_path):
    text = (REPO / "patches.yaml").read_text().replace("attribute: VllmConfig.compute_hash", "attribute: VllmConfigRenamed.compute_hash")
    table = tmp_path / "patches.yaml"
    table.write_text(text)
    result = child("import vllm.config\nfrom vllm.v1.attention.backends.registry import AttentionBackendEnum\n"
                   "report(AttentionBackendEnum.CUSTOM.is_overridden())", dict(dcu_env, GOVINDA_PATCHES_FILE=str(table)))
    assert result.returncode == 0 and result.result is False, result
    problems = [line for line in result.govinda_lines() if " ERROR " in line or " WARNING " in line]
    assert len(problems) == 1 and "has no attribute 'VllmConfigRenamed', the owner of 'compute_hash'" in problems[0], problems
    assert "circular import" not in problems[0]


# ----------------------------------------------------------------------------- control characters on stderr
def _plan_in_child(env: dict) -> str:
    code = "from govinda_patch import bootstrap\nbootstrap.plan_and_report()"
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO / "tests", capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr.decode("utf-8", "surrogateescape")


def test_no_raw_control_character_reaches_the_terminal(base_env, tmp_path):
    hostile = "x\x1b[31m\x07\x01\x7f\nname"
    env = dict(base_env, GOVINDA_PATCHES_FILE=str(tmp_path / f"{hostile}.yaml"), GOVINDA_PLATFORM="rocm")
    err = _plan_in_child(env)
    lines = [line for line in err.splitlines() if line.startswith("govinda ")]
    assert len(lines) == 1 and "x\\x1b[31m\\x07\\x01\\x7f\\nname.yaml" in lines[0], err
    assert not any(c in err for c in RAW_CONTROLS) and err.count("\n") == 1

    env = dict(base_env, GOVINDA_PLATFORM="rocm", **{f"GOVINDA_X{hostile.replace(chr(10), '')}": "1"})
    err = _plan_in_child(env)
    assert "unknown GOVINDA_* variables" in err and "\\x1b[31m" in err, err
    assert not any(c in err for c in RAW_CONTROLS)


def test_a_hostile_cache_dir_is_escaped_and_cut_and_the_cause_stays(tmp_path, monkeypatch):
    from govinda_patch.int8 import child as child_runner, selftest
    from govinda_patch.int8.guard import kernel_selftest

    monkeypatch.setattr(child_runner, "run_subcommand", lambda *a, **k: {"ok": True, "device": "test-device", "summary": {}})
    blocker = tmp_path / "file"
    blocker.write_text("")
    for directory in (blocker / "\x1b[2J\x07new\nline", blocker.joinpath(*["d" * 200] * 50)):  # 10,000 characters
        verdict = kernel_selftest(settings.Settings.from_env({"GOVINDA_CACHE_DIR": str(directory), "GOVINDA_SELFTEST": "auto"}))
        # The cause after the (cut) path: the component under a file, or a path longer than PATH_MAX.
        assert verdict.ok is True and ("Not a directory" in verdict.warning or "File name too long" in verdict.warning)
        assert verdict.warning.endswith("so every process runs it again")
        assert len(verdict.warning) < 1000 and "\n" not in verdict.warning
        assert not any(c in verdict.warning for c in RAW_CONTROLS)
    assert "\\x1b[2J\\x07new\\nline" in kernel_selftest(
        settings.Settings.from_env({"GOVINDA_CACHE_DIR": str(blocker / "\x1b[2J\x07new\nline"), "GOVINDA_SELFTEST": "auto"})).warning
    assert selftest.PATH_CHARS <= 200


# ----------------------------------------------------------------------------- the kill switch
def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found")


def test_sitecustomize_reads_the_kill_switch_with_the_words_of_settings():
    tree = ast.parse((REPO / "sitecustomize.py").read_text())
    assert _literal(tree, "_TRUE_WORDS") == settings.TRUE_WORDS
    assert _literal(tree, "_FALSE_WORDS") == settings.FALSE_WORDS


@pytest.mark.parametrize("value, loaded, trigger", [("1", False, False), (" ON ", False, False), ("0", False, True),
                                                     ("maybe", True, True)])
def test_the_kill_switch_imports_nothing(child, base_env, value, loaded, trigger):
    code = ("import sys\nreport({'settings': 'govinda_patch.settings' in sys.modules, "
            "'trigger': any(getattr(f, 'govinda_trigger', False) for f in sys.meta_path)})")
    result = child(code, dict(base_env, GOVINDA_DISABLE=value))
    assert result.returncode == 0, result
    # A malformed value is the overlay's parse to judge (it keeps the overlay on and warns later).
    assert result.result == {"settings": loaded, "trigger": trigger}
