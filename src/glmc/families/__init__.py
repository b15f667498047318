"""Architecture families (one package each) and the registries they fill.

``FAMILIES``: family name -> :class:`~glmc.families.base.Family`; ``ARCHS``: the
architectures ``glmc train`` trains -> :class:`~glmc.families.base.Arch`. Adding a family means
adding its package here and registering it; nothing outside its package names it.
"""

from __future__ import annotations

from typing import Any

from glmc.errors import GlmcError
from glmc.families.base import Arch, Family, Probe

FAMILIES: dict[str, Family] = {}
ARCHS: dict[str, Arch] = {}


def register_family(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def register_arch(arch: Arch) -> Arch:
    ARCHS[arch.name] = arch
    return arch


def family_of(config: Any) -> Family:
    """The family of a canonical config (by its class's ``family`` name)."""
    return FAMILIES[type(config).family]


def family_named(name: str, where: str = "") -> Family:
    if name not in FAMILIES:
        at = f"{where}: " if where else ""
        raise GlmcError(f"{at}unknown model family {name!r} (one of {', '.join(FAMILIES)})")
    return FAMILIES[name]


def arch_named(name: str) -> Arch:
    if name not in ARCHS:
        raise GlmcError(f"unknown architecture {name!r} (one of {', '.join(ARCHS)})")
    return ARCHS[name]


__all__ = ["ARCHS", "FAMILIES", "Arch", "Family", "Probe", "arch_named", "family_named",
           "family_of", "register_arch", "register_family"]

# The families register themselves on import (after the registries exist).
from glmc.families import convnet, transformer  # noqa: E402, F401
