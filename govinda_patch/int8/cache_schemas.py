"""The schemas of the on-disk cache files, checked before any entry is trusted (``cache_files``).

Strict types: a verdict ``{"ok": "false"}`` is not a boolean and must not turn INT8 on. What the
readers act on is typed; what they only show (clipped) may be any JSON, and keys not named here
are kept as they are (a newer overlay may write more).
pydantic is imported only with this module, i.e. when a cache file is read: vLLM's processes
have it loaded already (vLLM's configs are pydantic), the overlay's start-up never pays for it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

Scalar = Union[bool, int, float, str, None]
_TEXT = 20_000


class _Entry(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class SelftestVerdict(_Entry):
    """``selftest/<key>.json``: what ``run_selftest`` printed in the child."""

    ok: bool
    device: Optional[str] = Field(default=None, max_length=1000)
    reason: Optional[str] = Field(default=None, max_length=_TEXT)
    summary: Dict[str, Any] = {}
    cacheable: Optional[bool] = None


class DeviceAlias(_Entry):
    """``selftest/default-<key>.json``: the GPU model a process without a device tests (the prefetch)."""

    device_key: str = Field(max_length=1000)


class TunedChoiceEntry(_Entry):
    """``kernels/launch_configs.TunedChoice.to_json()``: three flat records of launch parameters."""

    decode: Dict[str, Scalar]
    prefill: Dict[str, Scalar]
    decode_splits: Dict[str, Scalar]


class TuneResult(_Entry):
    """``tune/<key>.json``: what ``run_tuning`` printed in the child (only successful ones are cached)."""

    ok: bool
    choice: TunedChoiceEntry
    elapsed_s: Optional[float] = None
    summary: Any = None  # shown in one log line (clipped), never acted on
    cacheable: Optional[bool] = None
    wrong_at_shape: Optional[str] = Field(default=None, max_length=_TEXT)  # tuner.WrongAtShape


class CountersSnapshot(_Entry):
    """``counters/<pid>.json``: one process's dispatch counters (``counters.py``)."""

    pid: int
    time: Optional[float] = None
    counters: Dict[str, int]
