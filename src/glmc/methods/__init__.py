"""The alignment methods: one registry, read by the Python API and by every command.

A method takes two checked canonical models A and B (see :func:`glmc.pair.prepare_pair`) and
the :class:`AlignOptions`, and returns B in A's coordinates: an :class:`Alignment` (B moved by
a transform, with the matching's details), B itself (``canonical``: no alignment), or a path
between the two (``none``: the stock weights averaged as loaded). The path is the straight
line λ·A + (1 − λ)·π(B) unless the method returns a path of its own.

    weight, weight-perm          weight matching (orthogonal / permutation residual map)
    activation, activation-perm  activation matching (Git Re-Basin's; orthogonal /
                                 permutation residual map; data)
    activation-prepost           activation matching, pre- and post-activation (data)
    learned, learned-perm        weight matching, then learned matching (data)
    none, canonical              no alignment (merge and barrier only)

A new method is a function ``fn(a, b, options)`` and one :func:`register_method` line. The
registry is torch-free (the command line lists the names without importing torch): built-in
methods name their function as ``"module:function"`` (in :mod:`glmc.methods.builtin`),
imported on first use. Options are defined once, in :class:`AlignOptions`, with the
matchers' own defaults, and checked when it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from glmc._lazy import lazy_exports, resolve
from glmc.errors import GlmcError

#: How attention heads are matched: ``inner`` (keep head_dim, align each head's inner bases)
#: or ``circuit`` (both models rewritten with heads as QK/OV circuits first).
HEADS: tuple[str, ...] = ("inner", "circuit")


@dataclass(frozen=True)
class Method:
    """An alignment method (see the module's docstring).

    ``impl``: the function ``fn(a, b, options)``, or where it lives (``"module:function"``);
    ``transform``: it moves B by a transform (``glmc align`` takes it); ``data``: it reads
    training data (``options.data``); ``uses_data``: it needs none but reads data when given
    (weight matching starts from activation matching's residual map); ``stock``: it reads
    the models' stock weights (``options.stock``, Hugging Face folders); ``residual``: the
    residual group it fixes.
    """

    name: str
    impl: Callable[..., Any] | str
    description: str
    transform: bool = True
    data: bool = False
    uses_data: bool = False
    stock: bool = False
    residual: str | None = None

    @property
    def fn(self) -> Callable[..., Any]:
        return resolve(self.impl) if isinstance(self.impl, str) else self.impl

    def __call__(self, a: Any, b: Any, options: Any) -> Any:
        if self.residual is not None:
            options = replace(options, residual=self.residual)
        return self.fn(a, b, options)


_METHODS: dict[str, Method] = {}
METHODS = MappingProxyType(_METHODS)
"""Name -> :class:`Method` of every alignment method, in registration order."""


def register_method(name: str, fn: Callable[..., Any] | str, description: str, *,
                    replace: bool = False, **flags: Any) -> None:
    """Add an alignment method ``fn(a, b, options)`` under ``name`` (``flags``: see
    :class:`Method`)."""
    if name in _METHODS and not replace:
        raise ValueError(f"alignment method {name!r} is already registered")
    _METHODS[name] = Method(name, fn, description, **flags)


def get_method(name: str) -> Method:
    """The method called ``name``; GlmcError listing the available ones otherwise."""
    if name not in _METHODS:
        raise GlmcError(f"unknown alignment method {name!r} (available: "
                        f"{', '.join(_METHODS)})")
    return _METHODS[name]


def aligning_methods() -> tuple[str, ...]:
    """The methods that move B by a transform (what ``glmc align`` takes)."""
    return tuple(n for n, m in _METHODS.items() if m.transform)


_BUILTIN = "glmc.methods.builtin"
register_method("none", f"{_BUILTIN}:no_alignment", "no alignment: vanilla averaging of the "
                "stock weights as loaded (LayerNorm γ and β averaged as they are; Hugging Face "
                "folders)", transform=False, stock=True)
register_method("canonical", f"{_BUILTIN}:canonical_coordinates", "averaging in canonical "
                "coordinates (after the exact RMSNorm rewrite), no alignment", transform=False)
register_method("weight", f"{_BUILTIN}:weight", "weight matching, orthogonal residual map "
                "(data-free; with data, the map starts from activation matching's)",
                uses_data=True)
register_method("weight-perm", f"{_BUILTIN}:weight", "weight matching, permutation-only "
                "residual map (the paper's ablation)", residual="permutation")
register_method("activation", f"{_BUILTIN}:activation",
                "activation matching (Git Re-Basin's) on the training split: units paired by "
                "the correlation of what the next layer reads (post-activation outputs, a "
                "ResNet stage's stream after each addition); attention heads by the canonical "
                "correlations of their outputs, then their inner maps; the residual stream "
                "by an orthogonal Procrustes", data=True)
register_method("learned", f"{_BUILTIN}:learned",
                "learned matching on the training split, from weight matching's solution",
                data=True)
register_method("learned-perm", f"{_BUILTIN}:learned", "learned matching with a "
                "permutation-only residual map (the paper's ablation)", data=True,
                residual="permutation")
# (the variants of activation matching after the rest: the commands' help lists the names
# in this order, and argparse wraps it at hyphens, which must not split a name)
register_method("activation-perm", f"{_BUILTIN}:activation", "activation matching with a "
                "permutation-only residual map and head dimensions (the paper's ablation)",
                data=True, residual="permutation")
register_method("activation-prepost", f"{_BUILTIN}:activation_prepost",
                "activation matching, glmc's variant: each unit's correlations before and "
                "after its activation summed, a ResNet stream correlated at its writers (the "
                "summands before the addition)", data=True)

# The types and helpers the methods share, loaded on first use (they import torch).
_EXPORTS = {
    "AlignOptions": "glmc.methods.options",
    "Alignment": "glmc.methods.alignment",
    **dict.fromkeys(("CircuitPath", "statistics_batches", "token_masks",
                     "STATISTICS_EXAMPLES"), _BUILTIN),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["HEADS", "METHODS", "Method", "aligning_methods", "get_method", "register_method",
           *_EXPORTS]
