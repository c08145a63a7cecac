"""govinda_patch.scope: the overlay applied to the real vLLM in this process for a block, then reverted."""

from __future__ import annotations

import logging
import os

import pytest

from govinda_patch import bootstrap
from govinda_patch.int8.kv_spec import BACKEND_PATH
from govinda_patch.manager import GovindaStrictError
from govinda_patch.scope import OverlayScopeError, overlay_scope


def _state() -> dict:
    import vllm.config.vllm as config_module
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from govinda_patch.patching import is_govinda_wrapper

    custom = AttentionBackendEnum.CUSTOM
    return {
        "custom_backend": custom.get_path() if custom.is_overridden() else None,
        "compute_hash": config_module.VllmConfig.__dict__["compute_hash"],
        "compute_hash_wrapped": is_govinda_wrapper(config_module.VllmConfig.__dict__["compute_hash"]),
    }


def _process_state() -> tuple:
    logger = logging.getLogger("govinda")
    return ({k: v for k, v in os.environ.items() if k.startswith("GOVINDA_")}, list(logger.handlers), logger.level,
            logger.propagate, bootstrap.OVERLAY)


def test_applied_inside_stock_after(overlay_env):
    stock = _state()
    assert stock["custom_backend"] is None and stock["compute_hash_wrapped"] is False
    process = _process_state()
    with overlay_scope(dict(overlay_env, GOVINDA_KV_ROTATION="none")) as scope:
        inside = _state()
        assert os.environ["GOVINDA_KV_ROTATION"] == "none"
        assert bootstrap.OVERLAY is scope.overlay
        status = scope.overlay.status_line()
    assert inside["custom_backend"] == BACKEND_PATH == "govinda_patch.int8.backend.GovindaInt8AttentionBackend"
    assert inside["compute_hash_wrapped"] is True
    assert "int8_compile_cache_key=applied" in status and "int8_backend_registration=applied" in status
    assert len([line for line in scope.lines() if "status:" in line]) == 1, scope.lines()
    after = _state()
    assert after["custom_backend"] is None and after["compute_hash"] is stock["compute_hash"]
    assert _process_state() == process
    assert {e.state for e in scope.overlay.entries.values()} <= {"disabled", "failed", "skipped-platform"}


def test_reentering_applies_the_same_once_and_scopes_do_not_nest(overlay_env):
    from govinda_patch.patching import original_of

    stock = _state()
    wrappers = []
    for _ in range(2):
        with overlay_scope(overlay_env) as scope:
            wrappers.append(_state()["compute_hash"])
            with pytest.raises(OverlayScopeError):
                with overlay_scope(overlay_env):
                    pass
            assert _state()["compute_hash"] is wrappers[-1]  # the refused inner scope changed nothing
        assert _state() == stock
    # One layer each time, around vLLM's own function: a second scope never wraps a leftover.
    assert all(original_of(w) is stock["compute_hash"] for w in wrappers) and wrappers[0] is not wrappers[1]
    assert scope.problems() == [], scope.lines()


def test_off_switch_and_errors_leave_the_process_as_it_was(overlay_env):
    process = _process_state()
    with overlay_scope(dict(overlay_env, GOVINDA_DISABLE="1")) as scope:
        assert scope.overlay is None and _state()["compute_hash_wrapped"] is False
    with pytest.raises(GovindaStrictError, match="no_such_patch"):
        with overlay_scope(dict(overlay_env, GOVINDA_PATCHES="int8_kv,no_such_patch", GOVINDA_STRICT="1")):
            pytest.fail("a strict error must stop the scope before its block")
    with pytest.raises(KeyError):
        with overlay_scope(overlay_env):
            assert _state()["compute_hash_wrapped"] is True
            raise KeyError("the block fails")
    assert _state()["compute_hash_wrapped"] is False
    assert _process_state() == process
