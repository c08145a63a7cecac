"""Issue #25: the ``int8_kv`` group decides from the backend vLLM actually selected, never from the plan
alone, next to vendor platform plugins too.

Each case runs in a fresh interpreter on the simulated DCU against the real vLLM, for the hybrid
Qwen3.5 shape and a dense Llama-3-8B shape: vLLM's engine config, one attention layer built as the
model builds it, its KV-cache spec, the worker-side block-size alignment and vLLM's page
unification (``get_kv_cache_groups``). The pages are either all INT8 or all stock, unification never
fails, and a case that stays stock although the overlay is on logs exactly one WARNING saying why.
Platform plugins are found by vLLM's own loader through their ``vllm.platform_plugins`` entry points
(stand-in distributions under tests/platform_plugins).
"""

from __future__ import annotations

import os

from overlay_testing import DCU_SIM, REPO
from rank_layers import RANK_LAYERS

PLUGINS = REPO / "tests" / "platform_plugins"
MAX_LINE = 2000

PROBE = """
import sys
SABOTAGE = globals().get("REJECT_INT8_HEAD_SIZE")  # set by REJECTING_PROBE
if SABOTAGE:  # vLLM's validation of our backend says no where our own plan says yes
    import vllm
    from govinda_patch.int8.backend import GovindaInt8AttentionBackend
    GovindaInt8AttentionBackend.supports_head_size = classmethod(lambda cls, head_size: False)
""" + RANK_LAYERS + """
from govinda_patch.patching import is_govinda_wrapper

def one_model(name):
    cfg, layer, spec, layers, groups = rank_layers(name)
    mc, pc, cache = cfg.model_config, cfg.parallel_config, cfg.cache_config
    return {"backend": layer.get_attn_backend().get_name(), "spec_dtype": str(spec.dtype), "spec_head": spec.head_size,
            "head": mc.get_head_size(), "kv_heads": mc.get_num_kv_heads(pc),
            "pages": sorted({g.kv_cache_spec.page_size_bytes for g in groups}), "mamba_padded": cache.mamba_page_size_padded}

result = {name: one_model(name) for name in models}
module = sys.modules[type(current_platform).__module__]
result["platform"] = type(current_platform).__name__
result["priorities_wrapped"] = is_govinda_wrapper(getattr(module, "_get_backend_priorities", None))
if type(current_platform).__name__ == "HCUPlatform":
    result["hcu_priorities"] = [b.name for b in module._get_backend_priorities(False, False)]
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    result["triton_attn_class"] = AttentionBackendEnum.TRITON_ATTN.get_path()
report(result)
"""

# The sabotage is switched on in the code, not by a variable of the child's environment: a variable
# outside GOVINDA_*/VLLM_* would need a warm interpreter of its own (tests/warm_interpreter.py), ~10 s.
REJECTING_PROBE = "REJECT_INT8_HEAD_SIZE = True\n" + PROBE


def _env(dcu_env, plugin=None, **switches):
    env = dict(dcu_env, **switches)
    if plugin is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DCU_SIM), str(PLUGINS / plugin)])
    return env


def _problems(result) -> list[str]:
    return [line for line in result.govinda_lines() if " ERROR " in line or " WARNING " in line]


def _assert_pages(model: dict, int8: bool) -> None:
    """All INT8 or all stock, and vLLM unified them into one page size."""
    heads, head = model["kv_heads"], model["head"]
    token_bytes = 2 * heads * (head + 4) if int8 else 2 * heads * head * 2
    assert model["spec_dtype"] == ("torch.int8" if int8 else "torch.bfloat16"), model
    assert (model["backend"] == "CUSTOM") is int8, model
    (page,) = model["pages"]
    assert page % token_bytes == 0, model
    if model["mamba_padded"] is not None:  # hybrid: the padded mamba page is whole attention blocks
        assert model["mamba_padded"] == page, model


def _run_stock(child, env, *words, probe=PROBE):
    result = child(probe, env)
    assert result.returncode == 0, result
    for name in ("qwen35", "dense"):
        _assert_pages(result.result[name], int8=False)
    problems = _problems(result)
    if words:
        assert len(problems) == 1 and all(w in problems[0] for w in words), result.govinda_lines()
        assert len(problems[0]) < MAX_LINE and "Traceback" not in result.stderr
    else:
        assert problems == [], result.govinda_lines()
    return result


def test_a_wrong_govinda_platform_leaves_every_page_stock_with_one_warning(child, dcu_env):
    env = _env(dcu_env, GOVINDA_PLATFORM="cuda")
    result = _run_stock(child, env, " WARNING ", "RocmPlatform", "GOVINDA_PLATFORM=cuda", "vllm.platforms.cuda")
    assert result.result["platform"] == "RocmPlatform" and result.result["priorities_wrapped"] is False
    strict = child(PROBE, dict(env, GOVINDA_STRICT="1"))
    assert strict.returncode != 0 and "GovindaStrictError" in strict.stderr and "GOVINDA_PLATFORM=cuda" in strict.stderr, strict


def test_the_priority_patch_switched_off_leaves_every_page_stock(child, dcu_env):
    result = _run_stock(child, _env(dcu_env, GOVINDA_PATCH_INT8_BACKEND_PRIORITY="0"))
    status = [line for line in result.govinda_lines() if "status:" in line]
    assert len(status) == 1 and "int8_backend_priority=disabled(GOVINDA_PATCH_INT8_BACKEND_PRIORITY=0)" in status[0], status


def test_a_foreign_platform_plugin_leaves_vllm_stock_and_is_named(child, dcu_env):
    result = _run_stock(child, _env(dcu_env, plugin="foreign"), " WARNING ", "ForeignDcuPlatform",
                        "platform plugin foreign_dcu of foreign-dcu-platform 1.0")
    assert result.result["platform"] == "ForeignDcuPlatform"


def test_when_vllm_rejects_the_int8_backend_every_page_stays_stock(child, dcu_env):
    # Our plan says the model is served (head size 256/128 are ours), vLLM's validation says no:
    # the selection decides, on vLLM 0.18 asked before any layer exists (the hybrid alignment).
    result = _run_stock(child, _env(dcu_env), " WARNING ", "not the INT8 backend", "head_size not supported",
                        probe=REJECTING_PROBE)
    assert result.result["priorities_wrapped"] is True


def test_the_vendor_plugin_platform_serves_int8(child, dcu_env):
    result = child(PROBE, _env(dcu_env, plugin="hcu"))
    assert result.returncode == 0, result
    r = result.result
    assert r["platform"] == "HCUPlatform" and r["priorities_wrapped"] is True
    # Our backend leads the vendor's own list; its TRITON_ATTN is still the plugin's class.
    assert r["hcu_priorities"] == ["CUSTOM", "TRITON_ATTN", "FLASH_ATTN"]
    assert r["triton_attn_class"] == "vllm_hcu.v1.attention.backends.triton_attn.HcuTritonAttentionBackend"
    for name in ("qwen35", "dense"):
        _assert_pages(r[name], int8=True)
    assert _problems(result) == [], result.govinda_lines()
    status = [line for line in result.govinda_lines() if "status:" in line]
    assert len(status) == 1 and "int8_backend_priority_hcu=skipped" not in status[0], status


def test_the_vendor_patch_switched_off_leaves_the_vendor_platform_stock(child, dcu_env):
    result = _run_stock(child, _env(dcu_env, plugin="hcu", GOVINDA_PATCH_INT8_BACKEND_PRIORITY_HCU="0"))
    assert result.result["platform"] == "HCUPlatform" and result.result["priorities_wrapped"] is False
    assert result.result["hcu_priorities"] == ["TRITON_ATTN", "FLASH_ATTN"]


def test_without_the_vendor_plugin_its_patch_is_skipped_and_the_group_planned():
    from govinda_patch.manager import Overlay

    for extra in ({}, {"GOVINDA_PATCHES": "int8_kv"}):
        overlay = Overlay.from_environment({"GOVINDA_PLATFORM": "rocm", **extra})
        entry = overlay.entries["int8_backend_priority_hcu"]
        assert entry.state == "skipped-platform" and "vllm_hcu.platforms.hcu is not installed" in entry.reason
        assert overlay.errors == [] and overlay.warnings == []
        assert {e.state for name, e in overlay.entries.items() if name != entry.spec.name} == {"pending"}
