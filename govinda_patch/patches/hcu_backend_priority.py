"""Put the CUSTOM (Govinda INT8) backend first in the priorities of Hygon's ``vllm_hcu`` platform plugin."""

from __future__ import annotations

from govinda_patch.int8.priorities import lead_with_int8


def _flags_as_called(args, kwargs):
    # HCUPlatform.get_valid_backends calls _get_backend_priorities(use_mla, use_sparse) positionally,
    # whatever the function names its second parameter (some vllm_hcu releases: device_capability).
    use_mla = kwargs.get("use_mla", args[0] if args else False)
    second = kwargs.get("use_sparse", args[1] if len(args) > 1 else False)
    return bool(use_mla), second is True


def apply(ctx) -> None:
    lead_with_int8(ctx, _flags_as_called)
