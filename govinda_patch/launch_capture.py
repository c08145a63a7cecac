"""Record the Triton kernel launches a launch wrapper makes, without running them.

The AMD compile gate needs each kernel's exact arguments, constexprs and compiler options.
Rather than keeping a second hand-written copy of every signature (which would drift from the
wrappers), it calls the real wrappers (``store_kv_int8``, ``paged_attention_int8``) on small CPU
tensors while ``JITFunction.run`` is replaced by a recorder. Needs compiled-mode Triton: under
``TRITON_INTERPRET=1`` kernels are not ``JITFunction`` objects and nothing is recorded.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

_LOCK = threading.Lock()


@dataclass
class CapturedLaunch:
    fn: Any  # triton.runtime.jit.JITFunction
    args: tuple
    kwargs: dict  # constexprs and launch options (num_warps, num_stages, HIP knobs)
    grid: Any

    @property
    def name(self) -> str:
        return self.fn.fn.__name__

    def options(self) -> dict:
        """The compiler options the wrapper passed (not the kernel's constexpr parameters)."""
        params = {p.name for p in self.fn.params}
        return {k: v for k, v in self.kwargs.items() if k not in params}


@dataclass
class LaunchRecorder:
    launches: list[CapturedLaunch] = field(default_factory=list)


@contextlib.contextmanager
def capture_launches() -> Iterator[LaunchRecorder]:
    """While active, every ``kernel[grid](...)`` call is recorded instead of compiled and launched."""
    from triton.runtime.jit import JITFunction

    recorder = LaunchRecorder()

    def record(self, *args, grid, warmup, **kwargs):
        recorder.launches.append(CapturedLaunch(self, args, dict(kwargs), grid))
        return None

    with _LOCK:
        original = JITFunction.run
        JITFunction.run = record
        try:
            yield recorder
        finally:
            JITFunction.run = original
