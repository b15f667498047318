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
from dataclasses import dataclass

import torch

from glmc.errors import GlmcError
from glmc.matching.options import WEIGHTINGS, WeightMatchingOptions
from glmc.matching.solvers import assignment, balancing_map, polar
from glmc.model import CanonicalModel, check_pair
from glmc.symmetry.groups import BlockMatrix, Element, Group, PermutationGroup
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import apply_axes, nested_pairs
from glmc.tensors import StateDict, axis_first

__all__ = ["UNIT_STEPS", "WEIGHTINGS", "Problem", "WeightMatchingOptions", "check_pair",
           "cross", "propose_heads", "propose_permutation", "propose_unit"]


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


@dataclass
class Bundle:
    """The tensors of one inner space: X (its output side) and Y (its input side)."""

    space: str
    xs: list[tuple[str, int]]
    ys: list[tuple[str, int]]


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
    """The tensors of every head space and its inner spaces (what aligning inner maps reads)."""
    return {n for pair in nested_pairs(spec) for s in pair for n, _, _ in spec.occurrences(s)}


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
        nested = nested_pairs(spec)
        self.inner_of: dict[str, list[str]] = defaultdict(list)
        for inner, outer in sorted(nested):
            self.inner_of[outer].append(inner)
        inner_spaces = {i for i, _ in nested}
        self.bundles = [
            Bundle(s, [(n, ax) for n, ax, v in spec.occurrences(s) if v == "out"],
                   [(n, ax) for n, ax, v in spec.occurrences(s) if v == "in"])
            for s in sorted(inner_spaces)
        ]
        self.bundled = {n for bd in self.bundles for n, _ in bd.xs + bd.ys}
        self.residual = [s for s, r in spec.roles.items() if r == "residual"]
        if len(self.residual) > 1:  # the residual step solves one stream
            raise GlmcError(f"the spec has {len(self.residual)} residual spaces; weight "
                            "matching supports one")
        #: The residual space the descent solves (None: residual "none"; see ``solve_stream``)
        self.stream = self.residual[0] if self.residual and opts.residual != "none" else None
        # Every other space is a unit with a step of its own (by its group, ``UNIT_STEPS``) or
        # is solved with the unit it is nested in (the heads' inner maps).
        self.units = [s for s, g in spec.spaces.items()
                      if type(g) in UNIT_STEPS and s not in self.residual]
        for s, g in spec.spaces.items():
            if s not in self.units and s not in self.residual and s not in inner_spaces:
                raise GlmcError(f"space {s}: weight matching has no step for a free {g.kind} "
                                "space")
        # Units that share no tensor are independent given the residual map (transformers:
        # every unit meets only the residual stream); chained ones (an MLP's hidden layers)
        # must be solved one after another.
        owners: dict[str, set[str]] = defaultdict(set)
        for u in self.units:
            for s in [u, *self.inner_of.get(u, [])]:
                for n, _, _ in spec.occurrences(s):
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
        """The group the residual map is sought in: the stream's own, or its permutations
        (the permutation-only ablation)."""
        group = self.spec.spaces[self.stream]
        return group.permutations() if self.opts.residual == "permutation" else group

    def solve_stream(self, m: torch.Tensor, current: Element | None = None) -> Element:
        """The residual map maximising ⟨T, m⟩ (Procrustes, or an assignment)."""
        return self.stream_group().solve(m, current, fix_ones=bool(self.opts.fix_ones),
                                         dtype=self.dtype)

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

    def balancing(self, bd: Bundle) -> tuple[torch.Tensor, torch.Tensor]:
        """Per head, the balancing maps (H, k, k) of A's and of B's own heads (unweighted),
        computed once: orthogonal maps of the residual stream leave the Grams alone."""
        if bd.space not in self._balance:
            k = self.spec.spaces[bd.space].block
            maps = []
            for s in (self.A, self.B):
                x, y = self.stack(s, bd.xs), self.stack(s, bd.ys)
                h = x.shape[0] // k
                maps.append(balancing_map(x.view(h, k, -1), y.view(h, k, -1)))
            self._balance[bd.space] = (maps[0], maps[1])
        return self._balance[bd.space]

    def stack(self, state: StateDict, parts: list[tuple[str, int]]) -> torch.Tensor:
        """The parts side by side, axis first, unweighted, in float64."""
        return torch.cat([axis_first(state[n], ax).double() * self.raw(n) for n, ax in parts],
                         dim=1)


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


@dataclass
class Proposal:
    """One unit's step: a cost over its group (maximised by ``Group.solve``), and how the
    solution becomes elements (the unit's own, and those of the spaces nested in it)."""

    cost: torch.Tensor | None  # (n, n), maximised; dropped once solved
    finish: Callable[[Element], dict[str, Element]]


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


@dataclass
class HeadCosts:
    """One bundle's head pairs: the inner map M[i, j] that best aligns B's head j to A's head
    i, and what is left, dist[i, j] = ‖X_ai − M X_bj‖² + ‖Y_ai − M⁻ᵀ Y_bj‖² (unweighted)."""

    maps: torch.Tensor  # (H, H, k, k)
    dist: torch.Tensor  # (H, H)


def head_costs(prob: Problem, bd: Bundle, bt: StateDict) -> HeadCosts:
    """Every (A head, B head) pair of one bundle, in k × k arithmetic: the cross and Gram
    matrices of the heads' factors are all the distance needs."""
    k = prob.spec.spaces[bd.space].block
    xa, ya = prob.stack(prob.A, bd.xs), prob.stack(prob.A, bd.ys)
    xb, yb = prob.stack(bt, bd.xs), prob.stack(bt, bd.ys)
    h = xa.shape[0] // k
    xa, ya, xb, yb = (t.view(h, k, -1) for t in (xa, ya, xb, yb))
    cx = torch.einsum("ikm,jlm->ijkl", xa, xb)  # X_ai X_bjᵀ
    cy = torch.einsum("ikm,jlm->ijkl", ya, yb)
    sq_a = (xa.pow(2).sum((1, 2)) + ya.pow(2).sum((1, 2)))[:, None]
    if prob.opts.inner == "permutation":  # head dimensions permuted (no invertible maps)
        s = cx + cy
        eye = torch.eye(k, dtype=s.dtype)
        maps = torch.stack([torch.stack([eye[assignment(s[i, j])] for j in range(h)])
                            for i in range(h)])
        sq_b = (xb.pow(2).sum((1, 2)) + yb.pow(2).sum((1, 2)))[None, :]
        dist = sq_a + sq_b - 2 * (maps * s).sum((2, 3))
        return HeadCosts(maps, dist)
    if prob.opts.inner == "orthogonal":  # orthogonal inner maps: Procrustes, no balancing
        s = cx + cy
        maps = polar(s)
        sq_b = (xb.pow(2).sum((1, 2)) + yb.pow(2).sum((1, 2)))[None, :]
        return HeadCosts(maps, sq_a + sq_b - 2 * (maps * s).sum((2, 3)))
    na, nb = prob.balancing(bd)
    na_i, nb_i = torch.linalg.inv(na), torch.linalg.inv(nb)
    # Balanced factors of a head are unique up to an orthogonal map: Procrustes between them.
    r = polar(na[:, None] @ cx @ nb[None] + na_i[:, None] @ cy @ nb_i[None])
    maps = na_i[:, None] @ r @ nb[None]  # M = N_a⁻¹ R N_b
    maps_it = na[:, None] @ r @ nb_i[None]  # M⁻ᵀ (N symmetric)
    gxb, gyb = xb @ xb.mT, yb @ yb.mT
    dist = (sq_a - 2 * (maps * cx).sum((2, 3)) - 2 * (maps_it * cy).sum((2, 3))
            + ((maps.mT @ maps) * gxb[None]).sum((2, 3))
            + ((maps_it.mT @ maps_it) * gyb[None]).sum((2, 3)))
    return HeadCosts(maps, dist)


def propose_heads(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """Heads assigned by what is left after aligning each pair's inner bases; then the
    matched heads' inner maps."""
    bundles = [bd for bd in prob.bundles if bd.space in prob.inner_of[space]]
    costs = {bd.space: head_costs(prob, bd, bt) for bd in bundles}
    total = -sum(c.dist for c in costs.values())

    def finish(heads: Element) -> dict[str, Element]:
        sigma = heads.perm  # type: ignore[attr-defined]
        out: dict[str, Element] = {space: heads}
        inv = torch.argsort(sigma)  # B's head j goes to A's head inv[j]
        j = torch.arange(sigma.numel())
        for name, c in costs.items():
            blocks = c.maps[inv, j].to(prob.dtype)
            out[name] = BlockMatrix(blocks.contiguous(), orthogonal=prob.opts.inner != "invertible")
        return out

    return Proposal(total, finish)


def propose_unit(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """A permutation's step: its units assigned by their vectors, or, where its blocks carry
    inner spaces (heads in head form), by what is left after aligning each pair's inner
    maps."""
    propose = propose_heads if prob.inner_of.get(space) else propose_permutation
    return propose(prob, space, el, bt)


#: Weight matching's step for a unit, by the unit's group: the cost of its ``Group.solve``.
#: (A space whose group has none is the residual stream, or is nested in a unit.)
UNIT_STEPS: dict[type[Group], Callable[[Problem, str, dict[str, Element], StateDict],
                                      Proposal]] = {PermutationGroup: propose_unit}


def relative(distance: float, scale: float) -> float:
    return distance / scale if scale > 0 else math.nan
