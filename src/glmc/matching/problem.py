"""The weight-matching problem: weighted models, the spec's units, the objective's terms,
and each unit's step (an assignment problem and how its solution becomes group elements)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from glmc.errors import GlmcError
from glmc.matching.solvers import align_inner, balancing_map
from glmc.models.model import CanonicalModel
from glmc.symmetry.groups import BlockMatrix, Element, Permutation
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import apply_axes, nested_pairs

StateDict = dict[str, torch.Tensor]


@dataclass
class WeightMatchingOptions:
    residual: str = "orthogonal"  # "orthogonal" | "permutation" | "none"
    max_iter: int = 15
    tol: float = 1e-5  # stop when an iteration improves the objective by less (relative)
    init: str = "spectral"  # "spectral" | "identity": the residual map's starting point
    weighting: str = "sqrt"  # tables weighted by rows^-1/2 ("sqrt"), rows^-1 ("rows"), "none"
    #: Keep the residual map fixing the all-ones direction (exportable to LayerNorm models);
    #: None: when both models are centred (every residual writer mean-zero).
    fix_ones: bool | None = None
    #: Per parameter: (axis, boolean mask) of the rows that count (e.g. tokens seen).
    row_masks: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)


def check_pair(a: CanonicalModel, b: CanonicalModel) -> None:
    """Same parameters with the same shapes, all finite (clear errors otherwise)."""
    for name, ta in a.state.items():
        if name not in b.state:
            raise GlmcError(f"model B lacks tensor {name} (shape {list(ta.shape)} in A)")
        if ta.shape != b.state[name].shape:
            raise GlmcError(f"tensor {name}: shape {list(ta.shape)} in A, "
                            f"{list(b.state[name].shape)} in B (different sizes are not "
                            "supported yet)")
    extra = sorted(set(b.state) - set(a.state))
    if extra:
        raise GlmcError(f"model B has tensor {extra[0]} that A lacks")
    for who, m in (("A", a), ("B", b)):
        for name, t in m.state.items():
            if not bool(torch.isfinite(t).all()):
                raise GlmcError(f"model {who}: tensor {name} contains NaN or Inf")


WEIGHTINGS = {"sqrt": 0.5, "rows": 1.0, "none": 0.0}


def tensor_weights(spec: SymmetrySpec, state: StateDict, scheme: str) -> dict[str, float]:
    """w_t = r_t^(-p), r_t the rows no symmetry touches (vocabulary, positions, classes).

    p = 1/2 ("sqrt"), 1 ("rows") or 0 ("none"): a 50k-token embedding table does not drown
    the blocks, while a small one (a character vocabulary) still counts.
    """
    if scheme not in WEIGHTINGS:
        raise GlmcError(f"unknown weighting {scheme!r} (one of {', '.join(WEIGHTINGS)})")
    w = {}
    for name, tags in spec.axes.items():
        free = 1
        for size, tag in zip(state[name].shape, tags, strict=True):
            if tag is None:
                free *= size
        w[name] = float(free) ** -WEIGHTINGS[scheme]
    return w


@dataclass
class Bundle:
    """The tensors of one inner space: X (its output side) and Y (its input side)."""

    space: str
    xs: list[tuple[str, int]]
    ys: list[tuple[str, int]]


def stack(state: StateDict, parts: list[tuple[str, int]]) -> torch.Tensor:
    return torch.cat([axis_first(state[n], ax) for n, ax in parts], dim=1)


def axis_first(t: torch.Tensor, axis: int) -> torch.Tensor:
    """(t.shape[axis], rest): a view where the layout allows (a 2-D tensor's transpose)."""
    return t.movedim(axis, 0).reshape(t.shape[axis], -1)


def cross_sum(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Σ a·bᵀ over the pairs (each (n, ·) and (m, ·)): accumulated in place, never
    concatenated (a concatenation would copy every operand, transposed ones included)."""
    out = None
    for a, b in pairs:
        if out is None:
            out = a @ b.T
        else:
            out.addmm_(a, b.T)
    return out


class Problem:
    """Weighted A and B, the spec's units, and the objective's terms."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions):
        spec = a.spec
        self.spec, self.opts = spec, opts
        w = tensor_weights(spec, a.state, opts.weighting)
        self.A: StateDict = {}
        self.B: StateDict = {}
        for name in spec.axes:
            sa, sb = a.state[name], b.state[name]
            if name in opts.row_masks:
                axis, mask = opts.row_masks[name]
                shape = [1] * sa.dim()
                shape[axis] = -1
                m = mask.reshape(shape).to(sa.dtype)
                sa, sb = sa * m, sb * m
            scale = w[name] ** 0.5
            if scale != 1.0:  # (no copy of the blocks: they keep weight 1)
                sa, sb = sa * scale, sb * scale
            self.A[name], self.B[name] = sa, sb
        self.dtype = next(iter(self.A.values())).dtype
        self._balance: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
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
        in_bundle = {n for bd in self.bundles for n, _ in bd.xs + bd.ys}
        self.plain = [n for n in spec.axes if n not in in_bundle]
        self.residual = [s for s, r in spec.roles.items() if r == "residual"]
        if len(self.residual) > 1:  # the residual step below solves one stream
            raise GlmcError(f"the spec has {len(self.residual)} residual spaces; weight "
                            "matching supports one")
        self.units = [s for s, g in spec.spaces.items()
                      if g.kind == "permutation" and s not in self.residual]
        for s in spec.spaces:
            if spec.spaces[s].kind == "block_invertible" and s not in inner_spaces:
                raise GlmcError(f"space {s}: a free invertible space is not supported")
        # Units that share no tensor are independent given the residual map (transformers:
        # every unit meets only the residual stream); chained ones (an MLP's hidden layers)
        # must be solved one after another.
        owners: dict[str, set[str]] = defaultdict(set)
        for u in self.units:
            for s in [u, *self.inner_of.get(u, [])]:
                for n, _, _ in spec.occurrences(s):
                    owners[n].add(u)
        self.independent = all(len(us) <= 1 for us in owners.values())

    # -- objective --------------------------------------------------------------------------
    def bundle_gram(self, bd: Bundle, sa: StateDict, sb: StateDict,
                    diagonal: bool = False) -> torch.Tensor:
        """(H, H) circuit inner products ⟨X_aᵢᵀ Y_aᵢ, X_bⱼᵀ Y_bⱼ⟩ between heads i of a, j of b
        (only i = j, shape (H,), with ``diagonal``): tr(X_aᵢ X_bⱼᵀ · (Y_aᵢ Y_bⱼᵀ)ᵀ)."""
        k = self.spec.spaces[bd.space].block
        n = self.spec.spaces[bd.space].size
        h = n // k
        grams = []
        for parts in (bd.xs, bd.ys):
            pairs = [(axis_first(sa[t], ax), axis_first(sb[t], ax)) for t, ax in parts]
            if diagonal:  # per head (k, k): the heads' own blocks only
                pairs = [(a.reshape(h, k, -1), b.reshape(h, k, -1)) for a, b in pairs]
                grams.append(sum(a @ b.mT for a, b in pairs))
            else:
                grams.append(cross_sum(pairs).view(h, k, h, k))
        gx, gy = grams
        return (gx * gy).sum((1, 2)) if diagonal else (gx * gy).sum((1, 3))

    def terms(self, bt: StateDict, names: set[str] | None = None) -> dict[str, float]:
        """Objective terms of the transformed B ``bt`` (plain tensors and bundles)."""
        out = {}
        for n in self.plain:
            if n in bt and (names is None or n in names):
                out[n] = float((self.A[n] * bt[n]).sum())
        for bd in self.bundles:
            key = f"<{bd.space}>"
            if bd.xs[0][0] in bt and (names is None or key in names):
                out[key] = float(self.bundle_gram(bd, self.A, bt, diagonal=True).sum())
        return out

    def balancing(self, bd: Bundle) -> tuple[torch.Tensor, torch.Tensor]:
        """Per head, the balancing maps (H, k, k) of A's and of B's own heads, computed once:
        they depend on neither the residual map (it leaves the Grams alone) nor the others."""
        if bd.space not in self._balance:
            k = self.spec.spaces[bd.space].block
            maps = []
            for s in (self.A, self.B):
                x, y = stack(s, bd.xs), stack(s, bd.ys)
                h = x.shape[0] // k
                maps.append(balancing_map(x.view(h, k, -1), y.view(h, k, -1)))
            self._balance[bd.space] = (maps[0], maps[1])
        return self._balance[bd.space]

    def norm(self) -> float:
        sq = {}
        for who, s in (("a", self.A), ("b", self.B)):
            total = sum(float(s[n].pow(2).sum()) for n in self.plain)
            total += sum(float(self.bundle_gram(bd, s, s, diagonal=True).sum())
                         for bd in self.bundles)
            sq[who] = total
        return (sq["a"] * sq["b"]) ** 0.5

    def release(self, names: list[str]) -> None:
        """Drop the weighted copies of ``names`` (e.g. embedding tables whose contribution is
        already folded into a constant): their memory is returned before the loop starts."""
        for n in names:
            self.A.pop(n, None)
            self.B.pop(n, None)

    def term_names(self, space: str) -> set[str]:
        """The objective terms that ``space`` (or the inner spaces nested in it) touches."""
        names = set()
        for s in [space, *self.inner_of.get(space, [])]:
            for n, _, _ in self.spec.occurrences(s):
                names.add(n)
        keys = {n for n in names if n in self.plain}
        keys |= {f"<{bd.space}>" for bd in self.bundles if {n for n, _ in bd.xs} & names}
        return keys

    def apply(self, elements: dict[str, Element], exclude: set[str],
              names: list[str] | None = None) -> StateDict:
        """B with every element applied except those of the spaces in ``exclude``."""
        use = {k: e for k, e in elements.items() if k not in exclude}
        return {n: apply_axes(self.B[n], self.spec.axes[n], use)
                for n in (names if names is not None else self.spec.axes)}


# -- the units ------------------------------------------------------------------------------


def cross(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> torch.Tensor:
    """M = Σ over (tensor, axis) of ``space``: A_axis-first · B̃_axis-firstᵀ, (n, n).

    ``bt`` holds B with every space but ``space`` applied (tensors it lacks are skipped).
    Where the space acts on a tensor twice (a circuit-form attention weight) the term is
    quadratic: it is linearised at the current element, applied on the other axis.
    """
    counts: dict[str, int] = defaultdict(int)
    for n, _, _ in prob.spec.occurrences(space):
        counts[n] += 1
    pairs = []
    for n, axis, _ in prob.spec.occurrences(space):
        if n not in bt:
            continue
        b = bt[n]
        if counts[n] > 1:
            b = apply_axes(b, prob.spec.axes[n], {space: el[space]}, skip={(axis, space)})
        pairs.append((axis_first(prob.A[n], axis), axis_first(b, axis)))
    return cross_sum(pairs)


def current_perm(el: dict[str, Element], space: str) -> torch.Tensor | None:
    """The current permutation of ``space`` (a warm start for the assignment), if any."""
    cur = el[space]
    return cur.perm if isinstance(cur, Permutation) else None


@dataclass
class Proposal:
    """One unit's step: an assignment problem, and how its solution becomes elements."""

    cost: torch.Tensor | None  # (dropped once solved)
    current: torch.Tensor | None
    finish: Callable[[torch.Tensor], dict[str, Element]]


def propose_permutation(prob: Problem, space: str, el: dict[str, Element],
                         bt: StateDict) -> Proposal:
    block = prob.spec.spaces[space].block
    return Proposal(cross(prob, space, el, bt), current_perm(el, space),
                    lambda perm: {space: Permutation(perm, block)})


def propose_heads(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """Assign heads by circuit similarity, then align each matched head's inner bases."""
    k = prob.spec.spaces[space].block
    bundles = [bd for bd in prob.bundles if bd.space in prob.inner_of[space]]
    cost = sum(prob.bundle_gram(bd, prob.A, bt) for bd in bundles)

    def finish(sigma: torch.Tensor) -> dict[str, Element]:
        out: dict[str, Element] = {space: Permutation(sigma, k)}
        inv_sigma = torch.argsort(sigma)
        for bd in bundles:
            group_in = prob.spec.spaces[bd.space]
            xa, ya = stack(prob.A, bd.xs), stack(prob.A, bd.ys)
            xb, yb = stack(bt, bd.xs), stack(bt, bd.ys)
            h = xa.shape[0] // k
            xa, ya, xb, yb = (t.view(h, k, -1) for t in (xa, ya, xb, yb))
            # Block j of the inner map aligns B's head j to the head of A it is assigned to.
            invertible = group_in.kind == "block_invertible"
            balance = None
            if invertible:
                na, nb = prob.balancing(bd)
                balance = (na[inv_sigma], nb)
            blocks = align_inner(xa[inv_sigma], ya[inv_sigma], xb, yb, invertible=invertible,
                                 balance=balance)
            out[bd.space] = BlockMatrix(blocks, orthogonal=not invertible)
        return out

    return Proposal(cost, current_perm(el, space), finish)
