"""Fixtures for the overlay tests (helpers live in overlay_testing.py: a module name of our own,
since tests/kernels has a conftest too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from overlay_testing import DCU_SIM, REPO, run_child


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("govinda-cache")


@pytest.fixture
def base_env(cache_dir) -> dict:
    """Environment for a child: the repo on PYTHONPATH, no inherited GOVINDA_* switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOVINDA_")}
    env["PYTHONPATH"] = str(REPO)
    env["GOVINDA_CACHE_DIR"] = str(cache_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


@pytest.fixture
def dcu_env(base_env) -> dict:
    """A simulated Hygon DCU: vLLM's ROCm platform activates; kernels are trusted (CPU only)."""
    env = dict(base_env)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DCU_SIM)])
    env["GOVINDA_PLATFORM"] = "rocm"
    env["GOVINDA_SELFTEST"] = "skip"
    return env


@pytest.fixture
def child():
    return run_child
