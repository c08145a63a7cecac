"""The platform vLLM resolved in this process, and where it came from (vLLM itself or a plugin).

The planner picks platform-specific targets from torch's build (``versions.detect_platform``),
before vLLM has chosen its platform; vLLM then picks one from its built-in detectors and the
``vllm.platform_plugins`` entry points, where an installed plugin (e.g. Hygon's ``vllm_hcu``)
replaces the built-in ROCm platform. Nothing here makes vLLM resolve its platform: a process that
has not asked for it yet gets None.
"""

from __future__ import annotations

import functools
import sys
from importlib import metadata
from typing import Optional

from .excerpt import quote

PLUGIN_GROUP = "vllm.platform_plugins"  # vllm.plugins.PLATFORM_PLUGINS_GROUP


def resolved_class() -> Optional[type]:
    """The class of ``vllm.platforms.current_platform`` once vLLM has resolved it, else None."""
    platforms = sys.modules.get("vllm.platforms")
    current = getattr(platforms, "__dict__", {}).get("_current_platform")
    return None if current is None else type(current)


@functools.lru_cache(maxsize=4)
def _platform_plugins(search_path: tuple) -> tuple:
    """The ``vllm.platform_plugins`` entry points (reading every distribution's metadata costs tens of
    milliseconds: once per search path)."""
    try:
        return tuple(metadata.entry_points(group=PLUGIN_GROUP))
    except Exception:  # a broken distribution's metadata must not hide the platform's name
        return ()


def _plugin_of(module: str) -> Optional[str]:
    """``'name' (distribution version)`` of the platform plugin whose package holds ``module``."""
    top = module.partition(".")[0]
    for entry in _platform_plugins(tuple(sys.path)):
        if entry.value.partition(":")[0].partition(".")[0] != top:
            continue
        dist = getattr(entry, "dist", None)
        origin = f" of {quote(dist.metadata['Name'], 80)} {quote(dist.version, 40)}" if dist is not None else ""
        return f"platform plugin {quote(entry.name, 80)!s}{origin}"
    return None


def describe(platform_cls: type) -> str:
    """E.g. ``RocmPlatform (vllm.platforms.rocm, vLLM's own)`` or
    ``HCUPlatform (vllm_hcu.platforms.hcu, platform plugin hcu of vllm_hcu 0.18.1)``."""
    module = getattr(platform_cls, "__module__", "?")
    name = quote(getattr(platform_cls, "__qualname__", platform_cls.__name__), 80)
    if module == "vllm.platforms" or module.startswith("vllm.platforms."):
        return f"{name} ({module}, vLLM's own)"
    plugin = _plugin_of(module) or "not from a registered platform plugin"
    return f"{name} ({quote(module, 120)}, {plugin})"
