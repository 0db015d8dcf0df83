"""Old names that still work for one release, with a ``DeprecationWarning``
naming the new one (Note [Deprecated names] in ``modelpar/__init__.py``).

A module that renamed something sets ``__getattr__ = renamed_names(__name__,
{"Old": "New"})``; ``modelpar.Old`` / ``module.Old`` then returns ``New``
and warns once per call site (Python's default filter)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed_names", "warn_renamed"]


def warn_renamed(old: str, new: str) -> None:
    """Warns that ``old`` is deprecated in favour of ``new`` (full dotted names)."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}",
                  DeprecationWarning, stacklevel=3)


def renamed_names(module: str, renames: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that answers each old name in
    ``renames`` with the module's attribute of the new name, warning."""
    def __getattr__(name: str) -> Any:
        new = renames.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warn_renamed(f"{module}.{name}", f"{module}.{new}")
        return getattr(sys.modules[module], new)
    return __getattr__
