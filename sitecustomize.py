"""Govinda overlay bootstrap: runs in every Python process that has this repo on PYTHONPATH.

It must stay tiny and must never break an interpreter:
- first it runs the ``sitecustomize`` that this file shadows (the next one on ``sys.path``);
- then, unless ``GOVINDA_DISABLE=1``, it installs a one-shot import trigger for the top-level
  ``vllm`` package. Nothing else is imported here: no torch, no vLLM, no YAML, no wrapt (which
  alone costs ~15-60 ms). When ``vllm`` finishes importing, ``govinda_patch.bootstrap`` reads
  ``patches.yaml`` and registers wrapt post-import hooks for each patch's target modules.
Errors are reported on stderr and the overlay stays off; ``GOVINDA_STRICT=1`` re-raises them.
The switches are parsed by ``govinda_patch.settings`` alone (stdlib only), which is imported here
only when ``GOVINDA_DISABLE`` or ``GOVINDA_STRICT`` holds something other than a plain on/off word.

Two copies of the repo on the path (a symlink, a second checkout) must not chain into each other:
every sitecustomize of ours is skipped when looking for the shadowed one, and a guard in
``sys.modules`` makes a second run in the same process (e.g. via a foreign chaining
sitecustomize) a no-op. The overlay logs the skipped copies that are other files.
"""

import os
import sys

_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
# Set on the first run in a process; holds ``skipped_copies`` for the overlay to report.
_GUARD = "_govinda_sitecustomize_guard"
# Every version of our sitecustomize defines this class; no foreign one does.
_OURS = b"class _VllmImportTrigger"


# govinda_patch.settings.TRUE_WORDS / FALSE_WORDS (tests check they agree): a plain value of the
# kill switch is read here without importing anything, so GOVINDA_DISABLE=1 is the cheapest start.
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("0", "false", "no", "off")


def _setting(variable, attribute, if_unreadable):
    """The overlay's parse of a global switch; unset or a plain on/off word costs no import."""
    raw = os.environ.get(variable, "").strip().lower()
    if not raw or raw in _FALSE_WORDS:
        return False
    if raw in _TRUE_WORDS:
        return True
    try:  # a malformed value: the overlay's parse decides, and its warning says what applies
        from govinda_patch import settings

        return getattr(settings.current(), attribute)
    except Exception:
        return if_unreadable


def _strict():
    return _setting("GOVINDA_STRICT", "strict", False)


def _disabled():
    # A kill switch that cannot be read keeps the overlay off.
    return _setting("GOVINDA_DISABLE", "disabled", True)


def _report(what, exc):
    # repr escapes control characters (a foreign sitecustomize's message is not ours to trust)
    sys.stderr.write("govinda: ERROR %s: %s: %s (overlay off in this process)\n" % (what, type(exc).__name__, repr(str(exc))[1:-1][:2000]))


def _is_ours(origin):
    try:
        with open(origin, "rb") as handle:
            return _OURS in handle.read(1 << 16)
    except OSError:
        return False


def _run_shadowed_sitecustomize(guard):
    from importlib.machinery import PathFinder

    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == _THIS_DIR:
            continue
        spec = PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        if spec.origin and _is_ours(spec.origin):
            if os.path.realpath(spec.origin) != os.path.realpath(__file__):
                guard.skipped_copies.append(spec.origin)
            continue
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[__name__].shadowed = module
        return


class _VllmImportTrigger:
    """Meta-path finder that runs ``govinda_patch.bootstrap`` right after ``import vllm`` completes."""

    govinda_trigger = True

    def __init__(self):
        self._searching = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "vllm" or self._searching:
            return None
        self._searching = True
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec.loader = _NotifyingLoader(spec.loader)
        return spec


class _NotifyingLoader:
    """Delegates to vLLM's real loader, then puts it back and starts the overlay."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        try:
            from govinda_patch import bootstrap

            bootstrap.on_vllm_imported()
        except Exception as exc:
            if _strict():
                raise
            _report("overlay bootstrap failed", exc)


def _start():
    guard = type(sys)(_GUARD)
    guard.skipped_copies = []
    sys.modules[_GUARD] = guard
    try:
        _run_shadowed_sitecustomize(guard)
    except Exception as exc:  # a broken foreign sitecustomize must not take ours down
        _report("shadowed sitecustomize failed", exc)

    try:
        if not _disabled():
            if "vllm" in sys.modules:
                from govinda_patch import bootstrap

                bootstrap.on_vllm_imported()
            elif not any(getattr(finder, "govinda_trigger", False) for finder in sys.meta_path):
                sys.meta_path.insert(0, _VllmImportTrigger())
    except Exception as exc:
        if _strict():
            raise
        _report("overlay start-up failed", exc)


if _GUARD not in sys.modules:
    _start()
