"""Packages whose public names load on first use (PEP 562), so that importing one is cheap.

``import glmc`` (or ``glmc.data``, ``glmc.training``) then costs nothing until a name is used:
the command line builds its parser and answers ``--help`` without importing torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``.

    Args:
        package: the package's ``__name__``.
        exports: each public name -> the module that defines it, imported on first look-up.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later look-ups find it directly
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


def resolve(impl: str) -> Any:
    """The attribute named by ``"package.module:attribute"``, imported now."""
    module, _, attr = impl.partition(":")
    return getattr(importlib.import_module(module), attr)
