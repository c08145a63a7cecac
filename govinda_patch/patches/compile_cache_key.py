"""Mix the active patch set into ``VllmConfig.compute_hash`` (vLLM's torch.compile cache key)."""

from __future__ import annotations

import hashlib


def apply(ctx) -> None:
    from govinda_patch.int8.fingerprint import kernel_sources_digest

    overlay = ctx.overlay

    def key_with_patch_set(wrapped, instance, args, kwargs):
        stock = wrapped(*args, **kwargs)
        if not ctx.group_active():
            return stock
        # The rotation changes what the compiled graph's attention reads: never share artefacts.
        signature = (
            overlay.planned_signature()
            + "|kernels="
            + kernel_sources_digest()
            + "|kv_rotation="
            + overlay.settings.kv_rotation
        )
        return hashlib.sha256(f"{stock}|govinda:{signature}".encode()).hexdigest()[: len(stock)]

    ctx.record.wrap(ctx.owner, ctx.attribute, key_with_patch_set)
