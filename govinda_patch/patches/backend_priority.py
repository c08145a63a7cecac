"""Put the CUSTOM (Govinda INT8) backend first in vLLM's own platforms' attention-backend priorities."""

from __future__ import annotations

from govinda_patch.int8.priorities import flags_by_name, lead_with_int8


def apply(ctx) -> None:
    lead_with_int8(ctx, flags_by_name(getattr(ctx.owner, ctx.attribute)))
