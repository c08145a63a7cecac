"""Fixtures for the overlay tests (helpers live in overlay_testing.py: a module name of our own,
since tests/kernels has a conftest too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlay_testing import child_env, run_child


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("govinda-cache")


@pytest.fixture
def base_env(cache_dir) -> dict:
    """Environment for a child: the repo on PYTHONPATH, no inherited GOVINDA_* switches."""
    return child_env(cache_dir)


@pytest.fixture
def dcu_env(cache_dir) -> dict:
    """A simulated Hygon DCU: vLLM's ROCm platform activates; kernels are trusted (CPU only)."""
    return child_env(cache_dir, dcu=True)


@pytest.fixture
def child():
    return run_child
