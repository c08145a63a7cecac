"""Installed versions and platform, read from package metadata: never by importing vLLM or torch."""

from __future__ import annotations

import sys
from importlib import metadata


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def release_of(version: str) -> str:
    """``2.10.0+cu128`` -> ``2.10.0`` (local tags never decide a version range)."""
    return version.split("+", 1)[0]


def detect_platform(override: str | None = None) -> str | None:
    """``rocm``, ``cuda`` or None. Uses torch's build tag; an imported torch is asked directly."""
    if override:
        return override
    torch = sys.modules.get("torch")
    version_module = getattr(torch, "version", None)
    if version_module is not None:
        if getattr(version_module, "hip", None):
            return "rocm"
        if getattr(version_module, "cuda", None):
            return "cuda"
        return None
    version = installed_version("torch") or ""
    local = version.partition("+")[2].lower()
    # Hygon DTK builds carry "das"/"dtk" tags; AMD builds "rocm".
    if any(tag in local for tag in ("rocm", "dtk", "das", "hip")):
        return "rocm"
    if local.startswith("cu"):
        return "cuda"
    # PyPI's default Linux wheels carry no local tag: their CUDA runtime is a separate distribution.
    if any(installed_version(name) for name in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime")):
        return "cuda"
    return None


def stack_versions() -> dict[str, str | None]:
    return {name: installed_version(name) for name in ("vllm", "torch", "triton")}
