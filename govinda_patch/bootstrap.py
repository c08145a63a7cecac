"""Entry point called by ``sitecustomize`` once ``import vllm`` has completed in this process."""

from __future__ import annotations

import logging

from .manager import PENDING, GovindaStrictError, Overlay, configure_logging
from .settings import Settings

logger = logging.getLogger("govinda")

# The process-wide overlay (None until vLLM is imported, or when the overlay could not start).
OVERLAY: Overlay | None = None


def on_vllm_imported(environ=None) -> Overlay | None:
    """Plan the patches and hook their target modules; idempotent. Never raises unless strict."""
    global OVERLAY
    if OVERLAY is not None:
        return OVERLAY
    settings = Settings.from_env(environ)
    configure_logging(settings.log_level)
    if settings.disabled:
        return None
    try:
        overlay = Overlay.from_environment(environ)
        for warning in overlay.warnings:
            logger.warning(warning)
        overlay.check_strict()
        OVERLAY = overlay
        overlay.hook_targets()
        if not any(e.state == PENDING for e in overlay.entries.values()):
            overlay.log_status_once()
    except GovindaStrictError:
        raise
    except Exception as exc:
        if settings.strict:
            raise GovindaStrictError(f"overlay could not start: {exc}") from exc
        logger.error("overlay off, vLLM runs stock: %s", exc)
        return None
    return OVERLAY
