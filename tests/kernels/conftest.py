"""Kernel tests run Triton's CPU interpreter; it must be switched on before any kernel module
is imported (``triton.jit`` picks the interpreter at decoration time)."""

import os

os.environ["TRITON_INTERPRET"] = "1"
# The tests assume the "interpreter" launch table (tiny tiles); an arch override would break that.
os.environ.pop("GOVINDA_KERNEL_ARCH", None)


def pytest_configure(config):
    # The interpreter itself trips a NumPy deprecation on every scalar index; it is not ours.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.runtime.interpreter")
