"""Reversible attribute replacement: every change is recorded so revert restores the exact originals."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import wrapt

_MISSING = object()


def resolve_owner(module, dotted_attribute: str) -> tuple[Any, str]:
    """``("Cls.method")`` -> (Cls, "method"); raises AttributeError naming the missing part.

    A missing owner is named as such: Python's own message for a module still being imported
    ("partially initialized module ... most likely due to a circular import") would hide it."""
    owner = module
    parts = dotted_attribute.split(".")
    module_name = getattr(module, "__name__", module)
    for depth, part in enumerate(parts[:-1]):
        try:
            owner = getattr(owner, part)
        except AttributeError:
            where = ".".join([str(module_name)] + parts[:depth])
            raise AttributeError(f"{where} has no attribute {part!r}, the owner of {parts[-1]!r} in {dotted_attribute!r}") from None
    if not _has_own_or_inherited(owner, parts[-1]):
        raise AttributeError(f"{module_name} has no attribute {dotted_attribute!r}")
    return owner, parts[-1]


def _has_own_or_inherited(owner, name: str) -> bool:
    try:
        inspect.getattr_static(owner, name)
        return True
    except AttributeError:
        return False


def raw_attribute(owner, name: str):
    """The attribute as stored (a classmethod object, not the bound method)."""
    if inspect.isclass(owner):
        for klass in owner.__mro__:
            if name in vars(klass):
                return vars(klass)[name]
        raise AttributeError(name)
    return getattr(owner, name)


@dataclass
class PatchRecord:
    """What one patch changed, in order, so it can be undone exactly."""

    undo_steps: list[Callable[[], None]] = field(default_factory=list)

    def replace(self, owner, name: str, new_value) -> Any:
        """Set ``owner.name = new_value``; returns the original (raw) attribute."""
        own = vars(owner).get(name, _MISSING) if inspect.isclass(owner) else getattr(owner, name, _MISSING)
        original = raw_attribute(owner, name)
        setattr(owner, name, new_value)

        def undo():
            if own is _MISSING:
                # The attribute was inherited (or absent): drop our override.
                delattr(owner, name)
            else:
                setattr(owner, name, own)

        self.undo_steps.append(undo)
        return original

    def wrap(self, owner, name: str, wrapper: Callable) -> Any:
        """Wrap ``owner.name`` with a wrapt ``wrapper(wrapped, instance, args, kwargs)``."""
        original = raw_attribute(owner, name)
        wrapped = wrapt.FunctionWrapper(original, wrapper)
        setattr_marker(wrapped, original)
        self.replace(owner, name, wrapped)
        return original

    def on_revert(self, step: Callable[[], None]) -> None:
        self.undo_steps.append(step)

    def revert(self) -> None:
        while self.undo_steps:
            self.undo_steps.pop()()


def setattr_marker(wrapper_object, original) -> None:
    # wrapt proxies forward attribute writes to the wrapped object unless the name starts with
    # "_self_"; keep the marker on the proxy itself.
    wrapper_object._self_govinda_original = original


def is_govinda_wrapper(obj) -> bool:
    # wrapt 1.x and 2.x expose different proxy base classes; the marker is what identifies ours.
    return hasattr(obj, "_self_govinda_original")


def original_of(obj):
    return getattr(obj, "_self_govinda_original", obj)
