"""The heads' inner maps aligned afresh for given head assignments and residual map (after
learned or activation matching moved them, say)."""

from __future__ import annotations

from glmc.matching.heads import propose_heads
from glmc.matching.problem import Problem, WeightMatchingOptions, head_tensors
from glmc.model import CanonicalModel
from glmc.symmetry.elements import Element
from glmc.symmetry.transform import Transform, apply_axes

__all__ = ["inner_maps", "realign_inner"]


def inner_maps(prob: Problem, unit: str, el: dict[str, Element]) -> dict[str, Element]:
    """The inner maps of ``unit``'s heads (and the unit's own element) for its assignment in
    ``el`` and every other element there (e.g. after learned matching reassigned heads)."""
    spec = prob.spec
    mine = {unit, *prob.inner_of[unit]}
    names = sorted({n for s in mine for n, _, _ in spec.occurrences(s)})
    others = {k: e for k, e in el.items() if k not in mine}
    bt = {n: apply_axes(prob.B[n], spec.axes[n], others) for n in names}
    return propose_heads(prob, unit, el, bt).finish(el[unit])


def realign_inner(a: CanonicalModel, b: CanonicalModel, transform: Transform,
                  units: list[str] | None = None,
                  opts: WeightMatchingOptions | None = None) -> Transform:
    """The heads' inner maps aligned afresh for ``transform``'s head assignments and residual
    map (on ``opts.device``; returned on the host); every other element is kept."""
    prob = Problem(a, b, opts or WeightMatchingOptions(), only=head_tensors(a.spec))
    el = dict(transform.elements)
    for unit in units if units is not None else list(prob.head_units):
        if unit in prob.head_units:  # (circuit form: heads without inner bases)
            el.update(inner_maps(prob, unit, el))
    return Transform(el).to("cpu")
