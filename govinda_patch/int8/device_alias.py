"""The self-test cache's alias for this host's first visible GPU (``selftest/default-<key>.json``).

A process without a GPU context (the API server, the background self-test's launcher) knows only
"the first visible device of this host". The background self-test records which GPU model that
was, so those processes can use the verdict cached under the model's own key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from . import cache_files
from .device_cache import device_key
from .fingerprint import machine_key


def alias_path(directory: Path) -> Path:
    """Where the alias lives: keyed by the default device's key with this stack."""
    return directory / f"default-{machine_key(device_key(None))}.json"


def first_device_key(directory: Path) -> Optional[str]:
    """The GPU model the alias names, when its verdict is cached; else None (never raises). A
    process without a GPU context tests that device, so it may use that verdict instead of
    running a self-test child of its own."""
    from .cache_schemas import DeviceAlias, SelftestVerdict

    try:
        alias = cache_files.read_validated(alias_path(directory), DeviceAlias)
        if alias is None:
            return None
        key = alias["device_key"]
        return key if cache_files.read_validated(directory / f"{machine_key(key)}.json", SelftestVerdict) is not None else None
    except Exception:
        return None
