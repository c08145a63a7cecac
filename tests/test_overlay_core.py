"""The overlay machinery against the real installed vLLM: start-up, switches, errors, revert."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from govinda_patch.manager import GovindaStrictError
from govinda_patch.scope import overlay_scope
from overlay_testing import REPO

PATCHED_PROBE = """
import sys
from vllm.v1.attention.backends.registry import AttentionBackendEnum
import vllm.config.vllm as config_module
from govinda_patch.patching import is_govinda_wrapper
custom_path = AttentionBackendEnum.CUSTOM.get_path() if AttentionBackendEnum.CUSTOM.is_overridden() else None
report({
    "custom_backend": custom_path,
    "compute_hash_wrapped": is_govinda_wrapper(config_module.VllmConfig.__dict__["compute_hash"]),
})
"""


def _patched(environ: dict):
    """PATCHED_PROBE in this process, under ``overlay_scope(environ)``: (its result, the scope)."""
    import vllm.config.vllm as config_module
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from govinda_patch.patching import is_govinda_wrapper

    with overlay_scope(environ) as scope:
        custom = AttentionBackendEnum.CUSTOM
        state = {
            "custom_backend": custom.get_path() if custom.is_overridden() else None,
            "compute_hash_wrapped": is_govinda_wrapper(config_module.VllmConfig.__dict__["compute_hash"]),
        }
    return state, scope


def _strict_refuses(environ: dict) -> str:
    with pytest.raises(GovindaStrictError) as refused:
        _patched(dict(environ, GOVINDA_STRICT="1"))
    return str(refused.value)


def _table(tmp_path: Path, edit) -> Path:
    """A copy of patches.yaml changed by ``edit(text) -> text``."""
    path = tmp_path / "patches.yaml"
    path.write_text(edit((REPO / "patches.yaml").read_text()))
    return path


def test_python_startup_imports_neither_torch_nor_vllm(child, base_env):
    result = child("import sys\nreport(sorted(m for m in ('torch', 'vllm', 'wrapt', 'yaml', 'govinda_patch') if m in sys.modules))", base_env)
    assert result.returncode == 0, result
    assert result.result == []
    # The trigger is installed, i.e. the overlay really is on the path.
    probe = child("import sys\nreport([type(f).__name__ for f in sys.meta_path])", base_env)
    assert "_VllmImportTrigger" in probe.result


def test_importing_vllm_applies_the_patches(child, base_env):
    result = child(PATCHED_PROBE, base_env)
    assert result.returncode == 0, result
    assert result.result["custom_backend"] == "govinda_patch.int8.backend.GovindaInt8AttentionBackend"
    assert result.result["compute_hash_wrapped"] is True
    status = [line for line in result.govinda_lines() if "status:" in line]
    assert len(status) == 1, result.govinda_lines()
    assert "[pid " in status[0] and "vllm=" in status[0] and "torch=" in status[0] and "triton=" in status[0]
    assert "int8_backend_registration=applied" in status[0]


def test_master_kill_switch_leaves_stock_objects(overlay_env):
    state, scope = _patched(dict(overlay_env, GOVINDA_DISABLE="1"))
    assert state == {"custom_backend": None, "compute_hash_wrapped": False}
    assert scope.overlay is None and scope.lines() == []


def test_per_patch_switch_disables_its_whole_group(overlay_env):
    state, scope = _patched(dict(overlay_env, GOVINDA_PATCH_INT8_KV_CACHE_SPEC="0"))
    assert state == {"custom_backend": None, "compute_hash_wrapped": False}
    status = " ".join(scope.lines())
    assert "int8_kv_cache_spec=disabled(GOVINDA_PATCH_INT8_KV_CACHE_SPEC=0)" in status
    assert "group int8_kv incomplete" in status


def test_group_switch_and_explicit_set(overlay_env):
    off, _ = _patched(dict(overlay_env, GOVINDA_INT8_KV="0"))
    assert off == {"custom_backend": None, "compute_hash_wrapped": False}, off
    chosen, _ = _patched(dict(overlay_env, GOVINDA_PATCHES="int8_kv"))
    assert chosen["compute_hash_wrapped"] is True, chosen
    partial, _ = _patched(dict(overlay_env, GOVINDA_PATCHES="int8_compile_cache_key"))
    assert partial["compute_hash_wrapped"] is False, partial


def test_spawned_children_are_patched(child, base_env):
    code = """
    import multiprocessing as mp

    def probe(queue):
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        queue.put(AttentionBackendEnum.CUSTOM.get_path())

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        process = ctx.Process(target=probe, args=(queue,))
        process.start()
        path = queue.get(timeout=240)
        process.join()
        report({"child": path, "parent_imported_vllm": "vllm" in __import__("sys").modules})
    """
    script = Path(base_env["GOVINDA_CACHE_DIR"]) / "spawn_probe.py"
    prelude = "import json\ndef report(o):\n    print('RESULT-JSON:' + json.dumps(o), flush=True)\n"
    script.write_text(prelude + textwrap.dedent(code))
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(script)], env=base_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT-JSON:")][-1]
    assert '"child": "govinda_patch.int8.backend.GovindaInt8AttentionBackend"' in line
    assert '"parent_imported_vllm": false' in line


@pytest.mark.parametrize(
    "case",
    ["malformed_yaml", "unknown_key", "implementation_outside_package", "missing_attribute", "version_outside_range"],
)
def test_bad_input_leaves_vllm_stock_with_one_clear_line(overlay_env, tmp_path, case):
    edits = {
        "malformed_yaml": lambda t: t + "\n  - name: [unclosed\n",
        "unknown_key": lambda t: t.replace("    default: true\n", "    default: true\n    colour: blue\n", 1),
        "implementation_outside_package": lambda t: t.replace(
            "govinda_patch.patches.register_int8_backend", "os.system", 1
        ),
        "missing_attribute": lambda t: t.replace("attribute: register_backend", "attribute: register_backend_removed_upstream"),
        "version_outside_range": lambda t: re.sub(
            r'vllm_versions: \[[^\]]*\](?=\n    platforms: \[rocm, cuda\]\n    targets:\n      - module: vllm.config.vllm)',
            'vllm_versions: ["==0.1.0"]', t),
    }
    table = _table(tmp_path, edits[case])
    assert table.read_text() != (REPO / "patches.yaml").read_text()
    env = dict(overlay_env, GOVINDA_PATCHES_FILE=str(table))
    state, scope = _patched(env)
    assert state == {"custom_backend": None, "compute_hash_wrapped": False}
    problem_lines = scope.problems()
    expected_words = {
        "malformed_yaml": "not valid YAML",
        "unknown_key": "colour",
        "implementation_outside_package": "implementation",
        "missing_attribute": "register_backend_removed_upstream",
        "version_outside_range": "",
    }[case]
    if case == "version_outside_range":
        status = " ".join(scope.lines())
        assert "int8_compile_cache_key=skipped-version" in status and "GOVINDA_FORCE=1" in status
        assert "group int8_kv incomplete" in status
    else:
        assert len(problem_lines) == 1, scope.lines()
        assert expected_words in problem_lines[0]
        assert str(table) in problem_lines[0] or case == "missing_attribute"

    _strict_refuses(env)


def test_force_applies_outside_verified_versions(overlay_env, tmp_path):
    # Every patch-level version list (4-space indent; target-level lists are deeper).
    table = _table(tmp_path, lambda t: re.sub(r"(?m)^    vllm_versions: \[.*\]$", '    vllm_versions: ["==0.1.0"]', t))
    state, scope = _patched(dict(overlay_env, GOVINDA_PATCHES_FILE=str(table), GOVINDA_FORCE="1"))
    assert state["compute_hash_wrapped"] is True
    assert any("GOVINDA_FORCE=1 applies it anyway" in l for l in scope.lines())


def test_unknown_names_and_malformed_values_warn_with_valid_choices(overlay_env):
    env = dict(overlay_env, GOVINDA_PATCHES="int8_kv,no_such_patch", GOVINDA_LOG_LEVEL="chatty")
    state, scope = _patched(env)
    warnings = [l for l in scope.lines() if " WARNING " in l]
    assert any("no_such_patch" in w and "int8_backend_priority" in w for w in warnings), warnings
    assert any("GOVINDA_LOG_LEVEL" in w and "DEBUG" in w for w in warnings), warnings
    assert state["custom_backend"] is not None  # the valid part of the request still applies
    assert "no_such_patch" in _strict_refuses(env)


def test_apply_is_idempotent_and_revert_restores_exact_originals(overlay_env):
    import vllm.config.vllm as config_module
    import vllm.v1.attention.backends.registry as registry

    from govinda_patch.patching import original_of

    stock = config_module.VllmConfig.__dict__["compute_hash"]
    with overlay_scope(overlay_env) as scope:
        overlay = scope.overlay
        wrapped_once = config_module.VllmConfig.__dict__["compute_hash"]
        entry = overlay.entries["int8_compile_cache_key"]
        overlay.apply_target(entry, entry.active_targets[0], config_module)  # second apply: no-op
        same_after_reapply = config_module.VllmConfig.__dict__["compute_hash"] is wrapped_once
        overlay.revert_all()
        overlay.revert_all()  # second revert: no-op
        assert {
            "same_after_reapply": same_after_reapply,
            "undo_steps": len(entry.record.undo_steps),
            "restored_exact": config_module.VllmConfig.__dict__["compute_hash"] is original_of(wrapped_once) is stock,
            "custom_cleared": not registry.AttentionBackendEnum.CUSTOM.is_overridden(),
        } == {"same_after_reapply": True, "undo_steps": 0, "restored_exact": True, "custom_cleared": True}


def test_status_command_prints_plan_without_importing_vllm(child, base_env):
    code = """
    import io, sys, contextlib
    from govinda_patch.__main__ import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["status"])
    report({"rc": rc, "text": out.getvalue(), "vllm": "vllm" in sys.modules, "torch": "torch" in sys.modules})
    """
    result = child(code, dict(base_env, GOVINDA_PATCH_INT8_BACKEND_PRIORITY="0"))
    assert result.returncode == 0, result
    assert result.result["vllm"] is False and result.result["torch"] is False
    text = result.result["text"]
    assert "int8_backend_priority" in text and "disabled: GOVINDA_PATCH_INT8_BACKEND_PRIORITY=0" in text
    assert "vllm=" in text


def test_shadowed_sitecustomize_still_runs(child, base_env, tmp_path):
    other = tmp_path / "other_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_SITECUSTOMIZE_RAN = True\n")
    env = dict(base_env, PYTHONPATH=os.pathsep.join([base_env["PYTHONPATH"], str(other)]))
    result = child("import builtins, sys\nreport([getattr(builtins, 'SHADOWED_SITECUSTOMIZE_RAN', False), type(sys.modules['sitecustomize'].shadowed).__name__])", env)
    assert result.returncode == 0, result
    assert result.result == [True, "module"]


def test_broken_shadowed_sitecustomize_does_not_break_python(child, base_env, tmp_path):
    other = tmp_path / "broken_site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('boom from a foreign sitecustomize')\n")
    env = dict(base_env, PYTHONPATH=os.pathsep.join([base_env["PYTHONPATH"], str(other)]))
    result = child("report('alive')", env)
    assert result.returncode == 0 and result.result == "alive", result
    assert "boom from a foreign sitecustomize" in result.stderr


def test_hugging_face_kernels_probe_is_not_fooled(child, base_env):
    code = """
    import importlib.util
    from transformers.utils import import_utils
    available = import_utils.is_kernels_available()
    import transformers.integrations.hub_kernels as hub_kernels  # must import cleanly
    spec = importlib.util.find_spec("kernels")
    report({"available": available, "has_init": bool(spec and spec.origin and spec.origin.endswith("__init__.py"))})
    """
    with_overlay = child(code, base_env)
    env_without = {k: v for k, v in base_env.items() if k != "PYTHONPATH"}
    without = child(code, env_without)
    assert with_overlay.returncode == 0 and without.returncode == 0, (with_overlay, without)
    assert with_overlay.result["available"] == without.result["available"]
    assert with_overlay.result["has_init"] is False  # our kernels/ is never a regular package


def test_a_real_kernels_package_later_on_the_path_wins(child, base_env, tmp_path):
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("IS_HUB_KERNELS = True\n")
    env = dict(base_env, PYTHONPATH=os.pathsep.join([base_env["PYTHONPATH"], str(site)]))
    result = child("import kernels\nreport(getattr(kernels, 'IS_HUB_KERNELS', False))", env)
    assert result.returncode == 0, result
    assert result.result is True
