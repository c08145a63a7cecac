"""Whether a module can be imported, decided without importing it or its parent packages.

``importlib.util.find_spec("a.b.c")`` imports ``a.b`` first; here each package's search path is
taken from its spec instead, so planning costs a few directory listings, not vLLM's model code.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import PathFinder


def module_findable(name: str) -> bool:
    if name in sys.modules:
        return True
    parts = name.split(".")
    search_path = None
    for depth in range(1, len(parts) + 1):
        qualified = ".".join(parts[:depth])
        module = sys.modules.get(qualified)
        if module is not None:
            search_path = getattr(module, "__path__", None)
        else:
            spec = PathFinder.find_spec(qualified, search_path)
            if spec is None:
                return _found_by_import_system(name, parts[0])
            search_path = spec.submodule_search_locations
        if search_path is None and depth < len(parts):
            return False  # a plain module has no submodules
    return True


def _found_by_import_system(name: str, top: str) -> bool:
    # Installs with their own finders (e.g. editable ones) are invisible to PathFinder. Asking the
    # import system imports the parents; do that only where the top package is loaded already.
    if top not in sys.modules:
        return False
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # a parent package that fails to import: the module cannot be imported either
        return False
