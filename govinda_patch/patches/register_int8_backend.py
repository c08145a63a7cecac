"""Register Govinda's INT8 backend as vLLM's ``AttentionBackendEnum.CUSTOM``."""

from __future__ import annotations

from govinda_patch.int8.kv_spec import BACKEND_PATH


def apply(ctx) -> None:
    registry = ctx.module
    custom = registry.AttentionBackendEnum.CUSTOM
    previous = registry._ATTN_OVERRIDES.get(custom)
    registry.register_backend(custom, BACKEND_PATH)

    def restore() -> None:
        if previous is None:
            custom.clear_override()
        else:
            registry.register_backend(custom, previous)

    ctx.record.on_revert(restore)
