"""Weight matching's step for heads: a permutation of items (attention heads, or key/value
groups) that carries the spaces nested in it.

Nested spaces are of two kinds, both found in the spec (``SymmetrySpec.nested_in``):

- *block* spaces, one k × k map per item (each head's QK and OV inner bases): a space's
  tensors on their output side form X, those on their input side Y, so the map M acts as
  M·X and M⁻ᵀ·Y. A key/value head's map also acts on every query head of its group (the spec
  names it on the query rows too: the chunk holds r k-vectors).
- at most one *grouped permutation* (the order of the r query heads inside each key/value
  group), applied to the tensors of the query heads.

For every pair (A's item i, B's item j) the step finds the query heads' order (an assignment
on their circuits, which no inner map changes), then each block space's best map given it
(by the block group's own pair solver, registered per group type with :func:`pair_solver`),
and what is left of the distance (the weighted distance weight matching reports). The items
are then assigned on what is left, the chosen pairs' maps are refined to a minimum of their
terms where the pair solver's answer is only exact for planted pairs (GL's balanced maps:
:func:`pair_refiner`), and the pairs' orders and maps become the nested spaces' elements. All
of it is k × k arithmetic on cross-correlations and Gram matrices of the heads' factors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from glmc.errors import GlmcError
from glmc.matching.solvers import assignment, balancing_from_grams, polar_batch
from glmc.symmetry.groups import (
    BlockInvertibleGroup,
    BlockMatrix,
    BlockOrthogonalGroup,
    BlockPermutationGroup,
    Element,
    Group,
    GroupedPermutationGroup,
    Permutation,
    RotaryGroup,
    complex_blocks,
)
from glmc.tensors import StateDict, axis_first


@dataclass(frozen=True)
class Part:
    """One tensor axis of a block space: ``r`` k-vectors per item, and whether the grouped
    permutation (the query heads' order) acts on it too."""

    name: str
    axis: int
    r: int
    grouped: bool


@dataclass(frozen=True)
class Bundle:
    """A block space nested in a head unit: its output-side parts X and input-side parts Y."""

    space: str
    xs: tuple[Part, ...]
    ys: tuple[Part, ...]


@dataclass(frozen=True)
class HeadUnit:
    """A head permutation of ``n`` items, its block spaces, and its grouped permutation (the
    query heads' order, ``r`` per item; None and 1 without one)."""

    unit: str
    n: int
    bundles: tuple[Bundle, ...]
    grouped: str | None
    r: int


def head_unit(spec: Any, groups: dict[str, Group], unit: str) -> HeadUnit:
    """The structure of ``unit``'s nested spaces, from the spec (shapes recorded)."""
    nested = spec.nested_in(unit)
    grouped = [s for s in nested if isinstance(groups[s], GroupedPermutationGroup)]
    blocks = [s for s in nested if s not in grouped]
    if len(grouped) > 1:
        raise GlmcError(f"space {unit}: weight matching supports one grouped permutation "
                        f"nested in it, got {', '.join(grouped)}")
    n = groups[unit].n
    tau = grouped[0] if grouped else None
    r = groups[tau].per_group if tau else 1  # type: ignore[attr-defined]
    bundles = []
    for s in blocks:
        g = groups[s]
        if not (isinstance(g, Group) and hasattr(g, "k") and g.n == n):
            raise GlmcError(f"space {s} nested in {unit}: expected one block per item of "
                            f"{unit} ({n}), got a {g.kind} group")
        xs, ys = [], []
        for name, axis, var in spec.occurrences(s):
            size = spec.shapes[name][axis]
            part = Part(name, axis, size // g.size, tau is not None and tau in
                        {t for t, _ in spec.axes[name][axis]})
            (xs if var == "out" else ys).append(part)
        bundles.append(Bundle(s, tuple(xs), tuple(ys)))
    return HeadUnit(unit, n, tuple(bundles), tau, r)


def stacked(state: StateDict, parts: tuple[Part, ...], n: int, k: int,
            r: int) -> tuple[torch.Tensor, bool]:
    """The parts' rows per item, (n, k, r, columns) in float64, as weighted in the distance
    (so that the step minimises the distance's own terms), and whether the r axis is the
    query heads' (else it is 1: a part that only broadcasts folds its copies into the
    columns)."""
    grouped = {p.grouped for p in parts}
    if len(grouped) > 1:
        raise GlmcError(f"tensors {', '.join(p.name for p in parts)}: the query heads' order "
                        "acts on some of one side's tensors but not on others")
    is_grouped = grouped.pop()
    out = []
    for p in parts:
        t = axis_first(state[p.name], p.axis).double()
        x = t.view(n, p.r, k, -1).permute(0, 2, 1, 3)  # (n, k, r_p, columns)
        if is_grouped:
            if p.r != r:
                raise GlmcError(f"tensor {p.name}: {p.r} query heads per item, the query "
                                f"heads' order permutes {r}")
        else:
            x = x.reshape(n, k, 1, -1)
        out.append(x)
    return torch.cat(out, dim=3), is_grouped


@dataclass
class PairStats:
    """What every (A item i, B item j) pair's alignment needs, per block space: the
    cross-correlations cx = X_ai·X_bjᵀ and cy = Y_ai·Y_bjᵀ (n, n, k, k) under the chosen query
    heads' order, and both models' Gram matrices (n, k, k)."""

    cx: torch.Tensor
    cy: torch.Tensor
    gxa: torch.Tensor
    gya: torch.Tensor
    gxb: torch.Tensor
    gyb: torch.Tensor

    def sub(self, s: slice) -> PairStats:
        """The statistics of the coordinates ``s`` of each block."""
        return PairStats(self.cx[..., s, s], self.cy[..., s, s], self.gxa[:, s, s],
                         self.gya[:, s, s], self.gxb[:, s, s], self.gyb[:, s, s])

    def residual(self, maps: torch.Tensor, maps_it: torch.Tensor) -> torch.Tensor:
        """dist[i, j] = ‖X_ai − M X_bj‖² + ‖Y_ai − M⁻ᵀ Y_bj‖² for the maps M (n, n, k, k)
        and their inverse-transposes."""
        sq_a = (_trace(self.gxa) + _trace(self.gya))[:, None]
        return (sq_a - 2 * (maps * self.cx).sum((2, 3)) - 2 * (maps_it * self.cy).sum((2, 3))
                + ((maps.mT @ maps) * self.gxb[None]).sum((2, 3))
                + ((maps_it.mT @ maps_it) * self.gyb[None]).sum((2, 3)))


def _trace(g: torch.Tensor) -> torch.Tensor:
    return g.diagonal(dim1=-2, dim2=-1).sum(-1)


# -- the pair solvers, one per block group -----------------------------------------------------

PairSolver = Callable[[Any, PairStats, Any], tuple[torch.Tensor, torch.Tensor]]
#: Block group type -> ``fn(group, stats, balance) -> (maps, maps_it)``: the best map of B's
#: item j onto A's item i for every pair (balance: the models' balancing maps, or None).
PAIR_SOLVERS: dict[type[Group], PairSolver] = {}


def pair_solver(kind: type[Group]) -> Callable[[PairSolver], PairSolver]:
    """Register the pair solver of block groups of type ``kind``."""
    def register(fn: PairSolver) -> PairSolver:
        PAIR_SOLVERS[kind] = fn
        return fn
    return register


def balancing(st: PairStats) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's balancing maps (n, k, k): N with N·X and N⁻ᵀ·Y of equal Grams."""
    return balancing_from_grams(st.gxa, st.gya), balancing_from_grams(st.gxb, st.gyb)


@pair_solver(BlockInvertibleGroup)
def _invertible(group: Any, st: PairStats, balance: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GL(k): balance both heads, then Procrustes between the balanced factors (unique up to
    an orthogonal map): M = N_a⁻¹ R N_b."""
    na, nb = balance if balance is not None else balancing(st)
    na_i, nb_i = torch.linalg.inv(na), torch.linalg.inv(nb)
    r = polar_batch(na[:, None] @ st.cx @ nb[None] + na_i[:, None] @ st.cy @ nb_i[None])
    return na_i[:, None] @ r @ nb[None], na[:, None] @ r @ nb_i[None]  # (N symmetric)


def _orthogonal(group: Any, st: PairStats, balance: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """O(k): Procrustes (M⁻ᵀ = M)."""
    maps = polar_batch(st.cx + st.cy)
    return maps, maps


pair_solver(BlockOrthogonalGroup)(_orthogonal)


@pair_solver(BlockPermutationGroup)
def _permutation(group: Any, st: PairStats, balance: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A permutation of each head's coordinates past ``fixed`` (an assignment per pair)."""
    s = st.cx + st.cy
    n, _, k, _ = s.shape
    f = group.fixed
    eye = torch.eye(k, dtype=s.dtype, device=s.device)
    maps = eye.expand(n, n, k, k).clone()
    if k > f:
        for i in range(n):
            for j in range(n):
                order = torch.cat([torch.arange(f), f + assignment(s[i, j, f:, f:])])
                maps[i, j] = eye[order]
    return maps, maps


@pair_solver(RotaryGroup)
def _rotary(group: Any, st: PairStats, balance: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """On each frequency pair the best complex scalar given the others (:func:`best_scalars`),
    on the coordinates past ``rotary`` the invertible (or orthogonal) solution."""
    n, _, k, _ = st.cx.shape
    rot = group.rotary
    h = rot // 2
    maps = st.cx.new_zeros(n, n, k, k)
    maps_it = torch.zeros_like(maps)
    i = torch.arange(h)

    def cplx(c: torch.Tensor) -> torch.Tensor:  # Σ x_a·conj(x_b) per pair, x = x_i + i·x_{i+h}
        return torch.complex(c[..., i, i] + c[..., i + h, i + h],
                             c[..., i + h, i] - c[..., i, i + h])

    def norm(g: torch.Tensor) -> torch.Tensor:  # |x_b|² per pair
        return g[:, i, i] + g[:, i + h, i + h]

    z = best_scalars(cplx(st.cx), cplx(st.cy), norm(st.gxb)[None], norm(st.gyb)[None],
                     unit=group.orthogonal)
    w = z / z.abs().pow(2)  # (the inverse-transpose of a scale-rotation: 1/s, same angle)
    complex_blocks(z.real, z.imag, out=maps)  # (in place: every pair's maps, n x n blocks)
    complex_blocks(w.real, w.imag, out=maps_it)
    if k > rot:
        rest = slice(rot, k)
        solve = _orthogonal if group.orthogonal else _invertible
        m, m_it = solve(group, st.sub(rest), None)
        maps[..., rest, rest], maps_it[..., rest, rest] = m, m_it
    return maps, maps_it


def best_scalars(px: torch.Tensor, py: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
                 unit: bool = False, iters: int = 80) -> torch.Tensor:
    """argmin over complex z ≠ 0 of ‖x_a − z·x_b‖² + ‖y_a − (z/|z|²)·y_b‖², elementwise.

    With z = s·e^{iθ} the objective is s²·|x_b|² + |y_b|²/s² − 2·Re(e^{−iθ}(s·p_x + p_y/s))
    plus a constant (p = Σ a·conj(b)): for each scale the best angle is that of
    s·p_x + p_y/s, which leaves a function of s alone, minimised by a golden-section search
    on log s around the balanced scale (|s·x_b| = |y_b/s|). ``unit``: s = 1 (rotations only).
    Exact for a planted pair (x_a = z₀x_b, y_a = z₀/|z₀|²·y_b).
    """
    tiny = 1e-300
    if unit:
        return torch.polar(torch.ones_like(px.real), torch.angle(px + py))
    xb, yb = xb.clamp_min(tiny), yb.clamp_min(tiny)

    def f(u: torch.Tensor) -> torch.Tensor:
        s = torch.exp(u)
        return s * s * xb + yb / (s * s) - 2 * (s * px + py / s).abs()

    centre = 0.25 * torch.log(yb / xb)
    lo, hi = centre - 6.0, centre + 6.0
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(iters):
        left = fa < fb
        hi = torch.where(left, b, hi)
        lo = torch.where(left, lo, a)
        b_new = torch.where(left, a, lo + g * (hi - lo))
        a_new = torch.where(left, hi - g * (hi - lo), b)
        fb_new = torch.where(left, fa, f(b_new))
        fa_new = torch.where(left, f(a_new), fb)
        a, b, fa, fb = a_new, b_new, fa_new, fb_new
    s = torch.exp((lo + hi) / 2)
    theta = torch.angle(s * px + py / s)
    return torch.polar(s, theta)


# -- refining the chosen pairs' maps -------------------------------------------------------------

Refiner = Callable[[Any, torch.Tensor, PairStats], torch.Tensor]
#: Block group type -> ``fn(group, maps, stats) -> maps``: the chosen pairs' maps (n, k, k)
#: moved to a minimum of their distance (stats of those pairs, (n, 1, k, k) crosses), where
#: the pair solver's answer is exact only for a planted pair (the balanced maps of GL).
PAIR_REFINERS: dict[type[Group], Refiner] = {}


def pair_terms(m: torch.Tensor, st: PairStats) -> torch.Tensor:
    """‖X_a − M X_b‖² + ‖Y_a − M⁻ᵀ Y_b‖² less its constant, per chosen pair (n,), for maps
    ``m`` (n, k, k) and the pairs' statistics (crosses (n, 1, k, k))."""
    n_it = torch.linalg.inv(m).mT
    return (-2 * (m * st.cx[:, 0]).sum((1, 2)) + ((m.mT @ m) * st.gxb).sum((1, 2))
            - 2 * (n_it * st.cy[:, 0]).sum((1, 2)) + ((n_it.mT @ n_it) * st.gyb).sum((1, 2)))


def refine_invertible(maps: torch.Tensor, st: PairStats, iters: int = 25) -> torch.Tensor:
    """M minimising ‖X_a − M X_b‖² + ‖Y_a − M⁻ᵀ Y_b‖² per pair, from ``maps`` (n, k, k), by
    L-BFGS on M = M₀(I + W) (k × k arithmetic on the pairs' statistics); never worse than
    the start."""
    m0 = maps.double()
    w = torch.zeros_like(m0, requires_grad=True)

    def objective() -> torch.Tensor:
        return pair_terms(m0 + m0 @ w, st).sum()

    with torch.no_grad():
        start = float(objective())
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=iters, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    try:
        opt.step(closure)
    except (RuntimeError, torch.linalg.LinAlgError):  # (a singular trial point: the start)
        return maps
    with torch.no_grad():
        if not float(objective()) <= start:
            return maps
        return (m0 + m0 @ w).to(maps.dtype)


def pair_refiner(kind: type[Group]) -> Callable[[Refiner], Refiner]:
    """Register the refinement of the chosen pairs' maps for block groups of type ``kind``."""
    def register(fn: Refiner) -> Refiner:
        PAIR_REFINERS[kind] = fn
        return fn
    return register


@pair_refiner(BlockInvertibleGroup)
def _refine_gl(group: Any, maps: torch.Tensor, st: PairStats) -> torch.Tensor:
    return refine_invertible(maps, st)


@pair_refiner(RotaryGroup)
def _refine_rotary(group: Any, maps: torch.Tensor, st: PairStats) -> torch.Tensor:
    """The scalars on the frequency pairs are exact already; the invertible map on the other
    coordinates (partial rotary) is refined."""
    rot, k = group.rotary, group.k
    if group.orthogonal or rot == k:
        return maps
    rest = slice(rot, k)
    out = maps.clone()
    out[:, rest, rest] = refine_invertible(maps[:, rest, rest], st.sub(rest))
    return out

# -- the step ----------------------------------------------------------------------------------


@dataclass
class HeadCosts:
    """Every (A item, B item) pair of one head unit: the query heads' order (n, n, r), each
    block space's maps (n, n, k, k), and the distance left (n, n)."""

    order: torch.Tensor | None
    maps: dict[str, torch.Tensor]
    dist: torch.Tensor
    stats: dict[str, PairStats]  # (the refinement of the chosen pairs reads them)


def _order(prob: Any, hu: HeadUnit, sides: dict[str, tuple]) -> torch.Tensor | None:
    """The query heads' order for every pair (n, n, r): an assignment on their circuits'
    inner products (X_ar·X_bsᵀ against Y_a·Y_bᵀ, or the other way round), which no inner map
    changes."""
    if hu.grouped is None or hu.r == 1:
        return None
    n, r = hu.n, hu.r
    cost = torch.zeros(n, n, r, r, dtype=torch.float64, device=prob.device)
    for sx, sy, gx, gy in sides.values():
        if gx:
            cost += torch.einsum("ijrskl,ijkl->ijrs", sx, sy[:, :, 0, 0])
        elif gy:
            cost += torch.einsum("ijkl,ijrskl->ijrs", sx[:, :, 0, 0], sy)
    order = torch.empty(n, n, r, dtype=torch.long)  # (on the host, as the assignments)
    for i in range(n):
        for j in range(n):
            order[i, j] = assignment(cost[i, j])
    return order


def _chosen(cross: torch.Tensor, grouped: bool, order: torch.Tensor | None) -> torch.Tensor:
    """cx[i, j] = Σ_r X_ai,r·X_bj,order[i,j,r]ᵀ (n, n, k, k) from the sub-head crosses."""
    if not grouped or order is None:
        return cross[:, :, 0, 0]
    n, _, r = order.shape
    index = order.to(cross.device).view(n, n, r, 1, 1, 1)
    picked = cross.gather(3, index.expand(-1, -1, -1, 1, *cross.shape[4:]))
    return picked[:, :, :, 0].sum(2)


def _gram(t: torch.Tensor) -> torch.Tensor:
    """Each item's Gram matrix (n, k, k) of its stacked rows ``t`` (n, k, r, columns)."""
    return torch.einsum("ikrc,ilrc->ikl", t, t)


def head_costs(prob: Any, hu: HeadUnit, bt: StateDict) -> HeadCosts:
    """Every pair's order, maps and distance left, for B's tensors ``bt`` (every space but
    this unit's and its nested ones applied)."""
    sides, grams = {}, {}
    for bd in hu.bundles:
        k = prob.groups[bd.space].k
        xa, gx = stacked(prob.A, bd.xs, hu.n, k, hu.r)
        xb, _ = stacked(bt, bd.xs, hu.n, k, hu.r)
        ya, gy = stacked(prob.A, bd.ys, hu.n, k, hu.r)
        yb, _ = stacked(bt, bd.ys, hu.n, k, hu.r)
        sx = torch.einsum("ikrc,jlsc->ijrskl", xa, xb)
        sy = torch.einsum("ikrc,jlsc->ijrskl", ya, yb)
        sides[bd.space] = (sx, sy, gx, gy)
        # (A's Grams once: A never moves)
        gxa, gya = prob.memo(f"grams:{bd.space}", lambda xa=xa, ya=ya: (_gram(xa), _gram(ya)))
        grams[bd.space] = (gxa, gya, _gram(xb), _gram(yb))
        del xa, xb, ya, yb  # (the rows, in float64: not held beside the next ones' maps)
    order = _order(prob, hu, sides)
    maps, stats = {}, {}
    total = torch.zeros(hu.n, hu.n, dtype=torch.float64, device=prob.device)
    for bd in hu.bundles:
        sx, sy, gx, gy = sides.pop(bd.space)  # (freed once chosen, where _chosen copies)
        gxa, gya, gxb, gyb = grams[bd.space]
        st = PairStats(_chosen(sx, gx, order), _chosen(sy, gy, order), gxa, gya, gxb, gyb)
        group = prob.groups[bd.space]
        balance = prob.balance(bd.space, st) if isinstance(group, BlockInvertibleGroup) else None
        m, m_it = PAIR_SOLVERS[type(group)](group, st, balance)
        maps[bd.space], stats[bd.space] = m, st
        total += st.residual(m, m_it)
    return HeadCosts(order, maps, total, stats)


@dataclass
class Proposal:
    """One unit's step: a cost over its group (maximised by its step), and how the solution
    becomes elements (the unit's own, and those of the spaces nested in it)."""

    cost: torch.Tensor | None  # (n, n), maximised; dropped once solved
    finish: Callable[[Element], dict[str, Element]]


def propose_heads(prob: Any, unit: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """Items assigned by what is left after aligning each pair's nested spaces; then the
    matched pairs' orders and maps."""
    hu = prob.head_units[unit]
    costs = head_costs(prob, hu, bt)

    def finish(heads: Element) -> dict[str, Element]:
        sigma = heads.perm  # type: ignore[attr-defined]
        out: dict[str, Element] = {unit: heads}
        inv = torch.argsort(sigma)  # B's item j goes to A's item inv[j]
        j = torch.arange(sigma.numel())
        for name, maps in costs.maps.items():
            group = prob.groups[name]
            chosen = maps[inv, j]
            refine = PAIR_REFINERS.get(type(group))
            if refine is not None:  # (the distance's own minimum for the chosen pairs)
                st = costs.stats[name]
                pairs = PairStats(st.cx[inv, j][:, None], st.cy[inv, j][:, None], st.gxa[inv],
                                  st.gya[inv], st.gxb, st.gyb)
                current = el.get(name)
                if isinstance(current, BlockMatrix):  # (start from whichever is lower)
                    now = current.blocks.to(chosen.device).double()
                    better = pair_terms(now, pairs) < pair_terms(chosen, pairs)
                    chosen = torch.where(better[:, None, None], now, chosen)
                chosen = refine(group, chosen, pairs)
            out[name] = BlockMatrix(chosen.to(prob.dtype).contiguous(),
                                    orthogonal=group.isometric)
        if hu.grouped is not None:
            r = hu.r
            within = (costs.order[inv, j] if costs.order is not None
                      else torch.arange(r).expand(hu.n, r))
            out[hu.grouped] = Permutation((within + j[:, None] * r).reshape(-1))
        return out

    return Proposal(-costs.dist, finish)
