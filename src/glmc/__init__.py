"""glmc: align networks modulo their weight symmetries, measure loss barriers, merge them."""

from glmc.api import Alignment, align, interpolate, load, merge
from glmc.errors import GlmcError
from glmc.models.model import CanonicalModel
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform

__version__ = "0.1.0"
__all__ = ["Alignment", "CanonicalModel", "GlmcError", "SymmetrySpec", "Transform", "align",
           "interpolate", "load", "merge", "__version__"]
