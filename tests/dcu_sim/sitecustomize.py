"""Simulated DCU, start-up part: Triton reports its HIP driver active, as it does on a DCU.

vLLM decides at import whether Triton is usable (exactly one active non-CPU driver) and otherwise
hands its modules placeholders; from vLLM 0.33 some ROCm backends in the selector's list
(ULTRAQUANT, TURBOQUANT) then fail to import with an AttributeError that the selector does not
catch, so no backend could be selected at all on a CPU host. Only the activity check is simulated:
compiling or launching a kernel still fails, and the tests run kernels with TRITON_INTERPRET=1.

The repo's sitecustomize runs this file (it chains to the one it shadows on the path).
"""

try:
    from triton.backends.amd.driver import HIPDriver
except ImportError:  # no Triton, or one without a HIP backend: nothing to simulate
    pass
else:
    HIPDriver.is_active = staticmethod(lambda: True)
