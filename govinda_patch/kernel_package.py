"""Import our Triton kernels from the repo's top-level ``kernels/`` folder.

``kernels/`` deliberately has no ``__init__.py``: a regular package named ``kernels`` on
``PYTHONPATH`` would shadow (or fool probes for) the Hugging Face ``kernels`` hub library.
We mount the folder under a private package name instead, so ``govinda_kernels.<module>``
imports normally and relative imports between kernel modules work.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"
PACKAGE_NAME = "govinda_kernels"


def kernel_package() -> ModuleType:
    """The ``govinda_kernels`` package whose search path is ``kernels/``."""
    existing = sys.modules.get(PACKAGE_NAME)
    if existing is not None:
        return existing
    spec = importlib.machinery.ModuleSpec(PACKAGE_NAME, None, is_package=True)
    spec.submodule_search_locations = [str(KERNELS_DIR)]
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE_NAME] = package
    return package


def import_kernel(module_name: str) -> ModuleType:
    """Import ``kernels/<module_name>.py`` as ``govinda_kernels.<module_name>``."""
    kernel_package()
    return importlib.import_module(f"{PACKAGE_NAME}.{module_name}")
