"""Device-function calls under Triton's interpreter without re-patching ``triton.language`` each time.

A kernel launch under ``TRITON_INTERPRET=1`` (``GridExecutor.__call__``) patches the builtins of the
``triton.language`` modules its kernel's globals name, runs every program, then restores them. A
``@triton.jit`` helper called from inside (``InterpretedFunction.__call__``) patches them again on
every call (Triton 3.6 and 3.8), with an ``inspect.getmembers`` walk of each module: our kernels call
helpers per tile, and that walk was ~18 % of the kernel tests' time. ``install`` skips the repeat
when the enclosing launch has already patched every language module the helper's globals name;
anything else (a helper called outside a launch, a module the launch did not patch, an interpreter
of another shape) takes Triton's own path. The helper still runs through Triton's rewritten
function, with the same builtins, so results are bit-identical (tests/kernels/test_interpreter_device_calls.py).
Only this process: children and the warm interpreters run Triton unchanged.
"""

from __future__ import annotations

import inspect

_active: list = []  # the language modules (by id) that each enclosing launch patched
_originals: dict = {}


def _languages(fn, tl) -> frozenset:
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def install() -> bool:
    """Wrap the interpreter's launch and device-call entry points once; False where its shape differs."""
    if _originals:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor, function = getattr(interpreter, "GridExecutor", None), getattr(interpreter, "InterpretedFunction", None)
    if executor is None or function is None or not all(
            callable(getattr(interpreter, name, None)) for name in ("_patch_lang", "InterpreterError")):
        return False
    launch, device_call = executor.__call__, function.__call__

    def launch_and_remember(self, *args, **kwargs):
        _active.append(_languages(self.fn, tl))
        try:
            return launch(self, *args, **kwargs)
        finally:
            _active.pop()

    def call_in_patched_language(self, *args, **kwargs):
        if not _active or not _languages(self.fn, tl) <= _active[-1]:
            return device_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as Triton's own device call reports it
            raise interpreter.InterpreterError(repr(e)) from e

    _originals.update({(executor, "__call__"): launch, (function, "__call__"): device_call})
    executor.__call__ = launch_and_remember
    function.__call__ = call_in_patched_language
    return True


def uninstall() -> None:
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()
