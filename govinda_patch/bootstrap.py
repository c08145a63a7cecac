"""Entry point called by ``sitecustomize`` once ``import vllm`` has completed in this process."""

from __future__ import annotations

import logging

from .guards import start_early
from .manager import PENDING, GovindaStrictError, Overlay, configure_logging
from .settings import settings_for

logger = logging.getLogger("govinda")

# The process-wide overlay (None until vLLM is imported, or when the overlay could not start).
OVERLAY: Overlay | None = None


def plan_and_report(environ=None) -> Overlay | None:
    """Load the table and plan the patches; log each warning and error once (one line each).

    Returns None when the overlay is off in this process. Never raises unless strict.
    """
    settings = settings_for(environ)
    configure_logging(settings.log_level)
    if settings.disabled:
        return None
    try:
        overlay = Overlay.from_environment(environ, settings=settings)
        for warning in overlay.warnings:
            logger.warning(warning)
        overlay.check_strict()
        for error in overlay.errors:
            logger.error(error)
    except GovindaStrictError:
        raise
    except Exception as exc:
        if settings.strict:
            raise GovindaStrictError(f"overlay could not start: {exc}") from exc
        logger.error("overlay off, vLLM runs stock: %s", exc)
        return None
    return overlay


def on_vllm_imported(environ=None) -> Overlay | None:
    """Plan the patches and hook their target modules; idempotent. Never raises unless strict."""
    global OVERLAY
    if OVERLAY is not None:
        return OVERLAY
    overlay = plan_and_report(environ)
    if overlay is None:
        return None
    OVERLAY = overlay
    try:
        overlay.hook_targets()
    except GovindaStrictError:
        raise
    except Exception as exc:  # e.g. wrapt missing: whatever was hooked already is undone
        for group in overlay.table.groups:
            overlay.fail_group(group.name, f"hooks could not be registered: {type(exc).__name__}: {exc}")
        return OVERLAY
    if not any(e.state == PENDING for e in overlay.entries.values()):
        overlay.log_status_once()
    _start_guards_early(overlay)
    return OVERLAY


# The module whose import precedes the worker's device initialisation in every engine process
# (the default worker class of the CUDA and ROCm platforms on every verified line).
WORKER_MODULE = "vllm.v1.worker.gpu_worker"


def _start_guards_early(overlay: Overlay) -> None:
    """Begin each planned group's guard early (``guards.EARLY_STARTS``: the kernel self-test starts in
    the background when this process launches a server) and make every process wait for it before
    its worker initialises the GPU. Never raises unless strict: the guard then runs inline."""
    settings = overlay.settings
    if settings.selftest != "auto":
        return
    planned = {e.spec.group for e in overlay.entries.values() if e.state == PENDING}
    names = sorted({group.guard for group in overlay.table.groups if group.guard and group.name in planned})
    for name in names:
        try:
            import wrapt

            started = start_early(name, settings)
            if started is None:
                continue
            note, waiter = started
            if note:
                logger.info(note)
            wrapt.register_post_import_hook(lambda module, waiter=waiter: waiter(settings), WORKER_MODULE)
        except Exception as exc:
            if settings.strict:
                raise GovindaStrictError(f"guard {name} early start: {type(exc).__name__}: {exc}") from exc
            logger.warning("guard %s not started early (%s: %s); it runs inline", name, type(exc).__name__, exc)
