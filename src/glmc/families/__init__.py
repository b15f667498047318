"""Architecture families, one package each, and the registries they fill.

Every family package declares its family, trainable architectures and stock importers in its
``__init__`` (torch-free: see :mod:`glmc.families.registry`); their code loads on first use.
Adding a family means adding its package and one import line here; nothing outside its
package names it.
"""

from __future__ import annotations

from glmc.families.registry import (
    ARCHS,
    FAMILIES,
    IMPORTERS,
    arch_named,
    declare_arch,
    declare_family,
    declare_importer,
    family_named,
    family_of,
    importer_for,
)

__all__ = ["ARCHS", "FAMILIES", "IMPORTERS", "arch_named", "declare_arch", "declare_family",
           "declare_importer", "family_named", "family_of", "importer_for"]

# The families declare themselves on import (torch-free).
from glmc.families import transformer, convnet  # noqa: E402, F401, I001
