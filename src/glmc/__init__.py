"""glmc: align networks modulo their weight symmetries, measure loss barriers, merge them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmc._lazy import lazy_exports
from glmc._version import __version__
from glmc.errors import GlmcError

if TYPE_CHECKING:
    from glmc.api import (
        Alignment,
        align,
        interpolate,
        load,
        merge,
        merge_many,
        read_state_dict,
        save,
    )
    from glmc.model import CanonicalModel
    from glmc.symmetry.spec import SymmetrySpec
    from glmc.symmetry.transform import Transform

# Loaded on first use, so that ``import glmc.cli.main`` (and ``glmc --help``) skip torch.
_EXPORTS = {
    **dict.fromkeys(("Alignment", "align", "interpolate", "load", "merge", "merge_many",
                     "read_state_dict", "save"), "glmc.api"),
    "CanonicalModel": "glmc.model",
    "SymmetrySpec": "glmc.symmetry.spec",
    "Transform": "glmc.symmetry.transform",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["Alignment", "CanonicalModel", "GlmcError", "SymmetrySpec", "Transform", "align",
           "interpolate", "load", "merge", "merge_many", "read_state_dict", "save",
           "__version__"]
