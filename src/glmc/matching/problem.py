"""The weight-matching problem: weighted models, the spec's units, the distance's terms, and
each unit's step (an assignment problem and how its solution becomes group elements).

The objective is the distance of what the merge interpolates::

    D(π) = Σ_t w_t ‖A_t − π(B)_t‖²,   w_t = 1 / (entries of t)      (weighting "tensor")

so every tensor counts by its mean squared difference, whatever its size (an embedding table of
50k rows counts as much as one MLP matrix; the paper's code weighs its blocks the same way).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import torch

from glmc.errors import GlmcError
from glmc.matching.heads import HeadUnit, Proposal, balancing, head_unit, propose_heads
from glmc.matching.options import WEIGHTINGS, WeightMatchingOptions
from glmc.matching.steps import solve
from glmc.model import CanonicalModel, check_pair
from glmc.symmetry.groups import (
    Element,
    Group,
    GroupedPermutationGroup,
    OrthogonalGroup,
    PermutationGroup,
)
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import apply_axes
from glmc.tensors import StateDict, axis_first

__all__ = ["UNIT_STEPS", "WEIGHTINGS", "Problem", "Proposal", "WeightMatchingOptions",
           "check_pair", "cross", "effective_groups", "propose_heads", "propose_permutation",
           "propose_unit", "stream_space"]


def tensor_weights(spec: SymmetrySpec, state: StateDict, scheme: str,
                   row_masks: dict[str, tuple[int, torch.Tensor]] | None = None,
                   bias_weight: float = 1.0) -> dict[str, float]:
    """w_t per tensor: 1/entries ("tensor"; masked rows do not count) or 1 ("none"); under
    "tensor", bias vectors (1-D ``*.bias``) times ``bias_weight``."""
    if scheme not in WEIGHTINGS:
        raise GlmcError(f"unknown weighting {scheme!r} (one of {', '.join(WEIGHTINGS)})")
    w = {}
    for name in spec.axes:
        if scheme == "none":
            w[name] = 1.0
            continue
        owner = name[:-len("bias")] + "weight" if name.endswith(".bias") else name
        # ("layer": a bias counts as its layer's entries do)
        name_for_size = owner if scheme == "layer" and owner in state else name
        entries = state[name_for_size].numel()
        if row_masks and name_for_size in row_masks:
            axis, mask = row_masks[name_for_size]
            entries = entries // state[name_for_size].shape[axis] * max(1, int(mask.sum()))
        w[name] = 1.0 / entries
        if scheme == "tensor" and name.endswith(".bias") and state[name].dim() == 1:
            w[name] *= bias_weight
    return w


def cross_sum(pairs: list[tuple[torch.Tensor, torch.Tensor]],
              scales: list[float] | None = None) -> torch.Tensor:
    """Σ s·a·bᵀ over the pairs (each (n, ·) and (m, ·)): accumulated in place, never
    concatenated (a concatenation would copy every operand, transposed ones included)."""
    out = None
    for i, (a, b) in enumerate(pairs):
        s = 1.0 if scales is None else scales[i]
        if out is None:
            out = a @ b.T
            if s != 1.0:
                out.mul_(s)
        else:
            out.addmm_(a, b.T, alpha=s)
    return out


def head_tensors(spec: SymmetrySpec) -> set[str]:
    """The tensors of every space nested in another and of the spaces they nest in (what
    aligning heads' inner maps reads)."""
    spaces = {s for c in spec.chains() for s in c.spaces}
    return {n for s in spaces for n, _, _ in spec.occurrences(s)}


def stream_space(spec: SymmetrySpec) -> str | None:
    """The residual stream: the space whose group is orthogonal (weight matching supports
    one)."""
    streams = [s for s, g in spec.spaces.items() if isinstance(g, OrthogonalGroup)]
    if len(streams) > 1:
        raise GlmcError(f"the spec has {len(streams)} orthogonal spaces ({', '.join(streams)}); "
                        "weight matching supports one residual stream")
    return streams[0] if streams else None


def effective_groups(spec: SymmetrySpec, residual: str, inner: str,
                     fix_ones: bool) -> dict[str, Group]:
    """The group each space is matched in: the stream's (``residual``: "orthogonal", fixing
    the all-ones direction when ``fix_ones``; "permutation": its permutations, the
    ablation), the heads' inner maps restricted to ``inner`` ("invertible", "orthogonal" or
    "permutation"), every other space's own."""
    stream = stream_space(spec)
    nested = {s for c in spec.chains() for s in c.spaces[:-1]}
    out = dict(spec.spaces)
    for s, g in spec.spaces.items():
        if s == stream:
            out[s] = (g.permutations() if residual == "permutation"
                      else g.subgroup("fix_ones") if fix_ones else g)
        elif s in nested and not isinstance(g, GroupedPermutationGroup):
            out[s] = g.subgroup(inner)
    return out


class Problem:
    """Weighted A and B (each tensor times √w_t), the spec's units, and the distance's terms."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions,
                 only: set[str] | None = None):
        """``only``: weighted copies of these tensors alone (a caller that reads no others
        saves their memory; the distance and its scale then cover these only)."""
        spec = a.spec.weights_only()  # (statistics move with their units, unweighed)
        self.spec, self.opts = spec, opts
        self.w = tensor_weights(spec, a.state, opts.weighting, opts.row_masks,
                                opts.bias_weight)
        self.A: StateDict = {}
        self.B: StateDict = {}
        for name in spec.axes:
            if only is not None and name not in only:
                continue
            sa, sb = a.state[name], b.state[name]
            if name in opts.row_masks:
                axis, mask = opts.row_masks[name]
                shape = [1] * sa.dim()
                shape[axis] = -1
                m = mask.reshape(shape).to(sa.dtype)
                sa, sb = sa * m, sb * m
            scale = self.w[name] ** 0.5
            if scale != 1.0:
                sa, sb = sa * scale, sb * scale
            self.A[name], self.B[name] = sa, sb
        # ‖A_t‖², ‖B_t‖² (weighted): a tensor moved by permutations and orthogonal maps keeps
        # its norm, so its distance term is ‖A‖² + ‖B‖² − 2⟨A, π(B)⟩.
        self.sq_a = {n: float(t.double().pow(2).sum()) for n, t in self.A.items()}
        self.sq_b = {n: float(t.double().pow(2).sum()) for n, t in self.B.items()}
        self.dtype = a.state[next(iter(spec.axes))].dtype
        self._balance: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._unit_norms: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        #: The group each space is matched in (the ablations restrict the model's own).
        self.groups = effective_groups(spec, opts.residual, opts.inner or "invertible",
                                       bool(opts.fix_ones))
        stream = stream_space(spec)
        #: The residual space the descent solves (None: none, or residual "none")
        self.stream = stream if opts.residual != "none" else None
        nested = {s for c in spec.chains() for s in c.spaces[:-1]}
        # Every other space is a unit with a step of its own (``UNIT_STEPS``, by its group) or
        # is solved with the unit it is nested in (the heads' inner maps and orders).
        self.units = [s for s, g in self.groups.items()
                      if type(g) in UNIT_STEPS and s != stream and s not in nested]
        for s, g in self.groups.items():
            if s not in self.units and s != stream and s not in nested:
                raise GlmcError(f"space {s}: weight matching has no step for a free {g.kind} "
                                "space")
        #: What each unit carries nested in it (its inner spaces), and the head units'
        #: structure (see :mod:`glmc.matching.heads`).
        self.inner_of: dict[str, list[str]] = {u: spec.nested_in(u) for u in self.units}
        self.head_units: dict[str, HeadUnit] = {
            u: head_unit(spec, self.groups, u) for u in self.units if self.inner_of[u]}
        #: Tensors on which a nested space acts: their maps need not keep norms.
        self.bundled = {n for u in self.head_units for s in self.inner_of[u]
                        for n, _, _ in spec.occurrences(s)}
        # Units that share no tensor are independent given the residual map (transformers:
        # every unit meets only the residual stream); chained ones (an MLP's hidden layers)
        # must be solved one after another.
        owners: dict[str, set[str]] = defaultdict(set)
        for u in self.units:
            for n in self.term_names(u):
                owners[n].add(u)
        self.independent = all(len(us) <= 1 for us in owners.values())

    # -- the distance -------------------------------------------------------------------------
    def terms(self, bt: StateDict, names: set[str] | None = None) -> dict[str, float]:
        """w_t‖A_t − π(B)_t‖² for the tensors of the transformed B ``bt`` (those in ``names``).

        A tensor inside a head carries the heads' invertible inner maps, which change its norm:
        its term is computed directly; every other one from its inner product."""
        out = {}
        for n, x in bt.items():
            if names is not None and n not in names:
                continue
            if n in self.bundled:
                out[n] = float((self.A[n] - x).double().pow(2).sum())
            else:
                out[n] = self.sq_a[n] + self.sq_b[n] - 2 * float((self.A[n] * x).sum())
        return out

    def scale(self) -> float:
        """Σ_t w_t(‖A_t‖² + ‖B_t‖²): the distance of two unrelated models (to read it as a
        fraction: 0 for B = A, about 1 for unrelated weights, 2 for B = −A)."""
        return sum(self.sq_a.values()) + sum(self.sq_b.values())

    def release(self, names: list[str]) -> None:
        """Drop the weighted copies of ``names`` (e.g. embedding tables whose contribution is
        already folded into a constant): their memory is returned before the loop starts."""
        for n in names:
            self.A.pop(n, None)
            self.B.pop(n, None)

    def term_names(self, space: str) -> set[str]:
        """The tensors that ``space`` (or the inner spaces nested in it) touches."""
        return {n for s in [space, *self.inner_of.get(space, [])]
                for n, _, _ in self.spec.occurrences(s)}

    def apply(self, elements: dict[str, Element], exclude: set[str],
              names: list[str] | None = None) -> StateDict:
        """B with every element applied except those of the spaces in ``exclude``."""
        use = {k: e for k, e in elements.items() if k not in exclude}
        return {n: apply_axes(self.B[n], self.spec.axes[n], use)
                for n in (names if names is not None else self.spec.axes)}

    def stream_group(self) -> Group:
        """The group the residual map is sought in (see :func:`effective_groups`)."""
        return self.groups[self.stream]

    def solve_stream(self, m: torch.Tensor, current: Element | None = None) -> Element:
        """The residual map maximising ⟨T, m⟩ (Procrustes, or an assignment)."""
        return solve(self.stream_group(), m, current, self.dtype)

    # -- what the units' costs read -------------------------------------------------------
    def raw(self, name: str) -> float:
        """The factor that turns a weighted tensor back into the model's own entries."""
        return self.w[name] ** -0.5

    def unit_norms(self, space: str) -> tuple[torch.Tensor, torch.Tensor]:
        """‖a_i‖, ‖b_j‖ (n,) of the units' vectors (each unit's slices of every tensor it
        touches, unweighted). Permutations and orthogonal maps of the other axes keep them,
        so B's are computed once, in its own order."""
        if space not in self._unit_norms:
            out = []
            for s in (self.A, self.B):
                sq = None
                for n, ax, _ in self.spec.occurrences(space):
                    if n in s:
                        v = axis_first(s[n], ax).double().pow(2).sum(1) * self.raw(n) ** 2
                        sq = v if sq is None else sq + v
                out.append(sq.sqrt().clamp_min(1e-30))
            self._unit_norms[space] = (out[0], out[1])
        return self._unit_norms[space]

    def balance(self, space: str, st) -> tuple[torch.Tensor, torch.Tensor]:
        """The balancing maps (n, k, k) of A's and of B's own heads in ``space``, from the
        pair statistics ``st`` the first time (orthogonal maps of the residual stream and the
        query heads' order leave the Grams alone)."""
        if space not in self._balance:
            self._balance[space] = balancing(st)
        return self._balance[space]


# -- the units ------------------------------------------------------------------------------


def cross(prob: Problem, space: str, el: dict[str, Element], bt: StateDict,
          unweighted: bool = False) -> torch.Tensor:
    """M = Σ over (tensor, axis) of ``space``: A_axis-first · B̃_axis-firstᵀ, (n, n).

    ``bt`` holds B with every space but ``space`` applied (tensors it lacks are skipped).
    Where the space acts on a tensor twice (a circuit-form attention weight) the term is
    quadratic: it is linearised at the current element, applied on the other axis.
    ``unweighted``: the models' own entries (the units' costs), not the weighted ones.
    """
    counts: dict[str, int] = defaultdict(int)
    for n, _, _ in prob.spec.occurrences(space):
        counts[n] += 1
    pairs, scales = [], []
    for n, axis, _ in prob.spec.occurrences(space):
        if n not in bt:
            continue
        b = bt[n]
        if counts[n] > 1:
            b = apply_axes(b, prob.spec.axes[n], {space: el[space]}, skip={(axis, space)})
        pairs.append((axis_first(prob.A[n], axis), axis_first(b, axis)))
        scales.append(prob.raw(n) ** 2 if unweighted else 1.0)
    return cross_sum(pairs, scales)


def propose_permutation(prob: Problem, space: str, el: dict[str, Element],
                        bt: StateDict) -> Proposal:
    """Units assigned by the angle between their vectors (or by the squared distance)."""
    if prob.opts.unit_cost == "distance":
        cost = cross(prob, space, el, bt)
    else:  # −‖â_i − b̂_j‖ = −√(2 − 2 cos), from the unweighted cross-correlation
        na, nb = prob.unit_norms(space)
        cos = cross(prob, space, el, bt, unweighted=True).double() / (na[:, None] * nb[None])
        cost = cos.mul_(-2).add_(2).clamp_(min=0).sqrt_().neg_()
    return Proposal(cost, lambda perm: {space: perm})


def propose_unit(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """A permutation's step: its units assigned by their vectors, or, where its blocks carry
    inner spaces (heads in head form), by what is left after aligning each pair's inner
    maps."""
    propose = propose_heads if space in prob.head_units else propose_permutation
    return propose(prob, space, el, bt)


#: Weight matching's step for a unit, by the unit's group: the cost that its step
#: (:func:`glmc.matching.steps.solve`) maximises. (A space whose group has none is the
#: residual stream, or is nested in a unit.)
UNIT_STEPS: dict[type[Group], Callable[[Problem, str, dict[str, Element], StateDict],
                                      Proposal]] = {PermutationGroup: propose_unit}


def relative(distance: float, scale: float) -> float:
    return distance / scale if scale > 0 else math.nan
