"""GOVINDA_KV_ROTATION: parsed in settings, the same choices as the kernels, and part of the
torch.compile cache key (a server started with either rotation never reuses the other's graphs)."""

from __future__ import annotations

from govinda_patch import settings
from govinda_patch.kernel_package import import_kernel
from overlay_testing import REPO

HASH_PROBE = f"""
from vllm.engine.arg_utils import EngineArgs
cfg = EngineArgs(model={str(REPO / "tests" / "models" / "qwen3_5-27b-shape")!r}, max_model_len=4096,
                 load_format="dummy", language_model_only=True, skip_tokenizer_init=True).create_engine_config()
report(cfg.compute_hash())
"""


def test_switch_choices_match_the_kernels():
    assert settings.KV_ROTATIONS == import_kernel("kv_rotation").ROTATIONS
    assert settings.DEFAULT_KV_ROTATION in settings.KV_ROTATIONS
    names = [switch.name for switch in settings.GLOBAL_SWITCHES]
    assert "GOVINDA_KV_ROTATION" in names


def test_switch_parsing_and_bad_values():
    assert settings.Settings.from_env({}).kv_rotation == settings.DEFAULT_KV_ROTATION
    assert settings.Settings.from_env({"GOVINDA_KV_ROTATION": " None "}).kv_rotation == "none"
    assert settings.Settings.from_env({"GOVINDA_KV_ROTATION": "hadamard"}).kv_rotation == "hadamard"
    bad = settings.Settings.from_env({"GOVINDA_KV_ROTATION": "givens"})
    assert bad.kv_rotation == settings.DEFAULT_KV_ROTATION
    assert len(bad.warnings) == 1 and "GOVINDA_KV_ROTATION" in bad.warnings[0] and "hadamard" in bad.warnings[0]
    assert settings.kv_rotation({"GOVINDA_KV_ROTATION": "none"}) == "none"


def test_rotation_changes_the_compile_cache_key(child, dcu_env):
    hashes = {}
    for rotation in ("none", "hadamard"):
        result = child(HASH_PROBE, dict(dcu_env, GOVINDA_KV_ROTATION=rotation))
        assert result.returncode == 0, result
        hashes[rotation] = result.result
    # Unpatched, vLLM's key would not depend on a GOVINDA_* variable at all.
    assert hashes["none"] != hashes["hadamard"], hashes
    assert all(isinstance(value, str) and len(value) >= 10 for value in hashes.values()), hashes


def test_smollm2_rotation_sides_file():
    """The served rotation run: both overlay sides pin the switch and check the worker logged it;
    the stock sides and the workload are those of the four-side agreement file."""
    from bench import ab

    def load(name):
        return ab.parse_config(["--sides", str(REPO / "scripts" / "h200" / name)])

    rotation, agreement = load("ab_smollm2_rotation.yaml"), load("ab_smollm2_agreement.yaml")
    assert [s.name for s in rotation.sides] == [
        "overlay_off", "overlay_rotated", "overlay_unrotated", "triton_bf16", "upstream_int8"
    ]
    assert rotation.baseline_name() == "overlay_off"
    # All five at once on one GPU, each with a fixed KV cache (no memory profiling next to the others).
    assert rotation.parallel and {s.env["CUDA_VISIBLE_DEVICES"] for s in rotation.sides} == {"0"}
    assert len({ab.side_port(rotation, s) for s in rotation.sides}) == 5
    assert rotation.server_args == agreement.server_args + [
        "--enforce-eager", "--gpu-memory-utilization", "0.15", "--kv-cache-memory-bytes", "1073741824"
    ]
    assert (rotation.model, rotation.env) == (agreement.model, agreement.env)
    assert rotation.bench["teacher_forced_texts"] == agreement.bench["teacher_forced_texts"]
    for side, value in ((rotation.sides[1], "hadamard"), (rotation.sides[2], "none")):
        assert side.env == {"GOVINDA_DISABLE": "0", "GOVINDA_KV_ROTATION": value, "CUDA_VISIBLE_DEVICES": "0"}
        patterns = {p.name: p for p in side.log_patterns}
        assert patterns["govinda_rotation"].regex == f"kv_rotation={value}" and patterns["govinda_rotation"].min == 1
    by_name = {s.name: s for s in agreement.sides}
    for side in rotation.sides[3:]:
        assert ({**side.env, "CUDA_VISIBLE_DEVICES": None}, side.server_args) == (
            {**by_name[side.name].env, "CUDA_VISIBLE_DEVICES": None}, by_name[side.name].server_args
        )


def test_selftest_checks_the_rotation_in_force_and_all_on_request(base_env):
    # The verdict's cache key holds the rotation, so a server tests only its own (#29: start-up cost).
    import json
    import subprocess
    import sys

    seen = {}
    for label, rotation, extra in (("default", None, []), ("hadamard", "hadamard", []), ("all", None, ["--all-rotations"])):
        env = dict(base_env, TRITON_INTERPRET="1")
        env.pop("GOVINDA_KV_ROTATION", None)
        if rotation:
            env["GOVINDA_KV_ROTATION"] = rotation
        done = subprocess.run(
            [sys.executable, "-m", "govinda_patch", "selftest", "--json", *extra],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        verdict = json.loads(done.stdout.strip().splitlines()[-1])
        assert verdict["ok"], verdict
        seen[label] = sorted(verdict["summary"])
    assert seen == {"default": [settings.DEFAULT_KV_ROTATION], "hadamard": ["hadamard"], "all": sorted(settings.KV_ROTATIONS)}
