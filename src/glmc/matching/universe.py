"""Universe matching: every model's map into one frame found at once, by Frank-Wolfe.

The objective is the agreement of every pair in the frame (C2M3's; weight matching's
weighting of the tensors)::

    F(π_1, ..., π_N) = Σ_{i<j} Σ_t w_t ⟨π_i(θ_i)_t, π_j(θ_j)_t⟩

MergeMany climbs it by block steps: one model at a time, one space at a time. Here every map
of every model moves together. Each space whose group has a weight-matching step (an
assignment for permutations, Procrustes for orthogonal maps: both maximise a linear function
over the group, i.e. over its convex hull) is relaxed to that hull (doubly stochastic matrices;
the spectral-norm ball) and held as a dense matrix X acting as T does. An iteration takes the
gradient G of F in every X, the group element S maximising ⟨S, G⟩ (the step of its group:
the linear oracle), and the best point on every X + γ(S − X) (an exact line search: F along
the segment is a polynomial in γ, of degree twice the most maps on one tensor; F never
falls); it stops when the Frank-Wolfe gap Σ⟨G, S − X⟩, or the step's gain, is at most
``tol`` of F. Each X is
then rounded to its nearest group element (the same step on X itself).

Spaces without such a step (heads' invertible inner maps, rotary maps) keep their start
during the descent; once the assignments are rounded, each model's are chosen afresh against
the mean of the others, as weight matching's own head step would (two passes).

The start is the star alignment (every model to the first), so F starts where the star leaves
it, or the barycenter: the first model as it is (it anchors the frame), every other model's
permutations at the centre of their hull (every entry 1/n), its other maps the identity. The
frame is then moved into the first model's coordinates, as MergeMany's is: maps through it
compose by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from glmc.errors import GlmcError
from glmc.matching import workspace
from glmc.matching.inner import realign_inner
from glmc.matching.many import Frame, check_models, frame_options, mean_of_others, star
from glmc.matching.options import WeightMatchingOptions
from glmc.matching.problem import (
    effective_groups,
    head_tensors,
    stream_space,
    tensor_weights,
)
from glmc.matching.steps import solvable, solve
from glmc.model import CanonicalModel
from glmc.symmetry.elements import Element, Matrix
from glmc.symmetry.groups import Group, GroupedPermutationGroup, PermutationGroup
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform, apply_axes

STARTS = ("star", "barycenter")

#: The centre of a group's convex hull, by group type (the barycenter start); other groups
#: start at the identity.
CENTRES: dict[type[Group], Callable[[Any, torch.dtype], torch.Tensor]] = {
    PermutationGroup: lambda g, dtype: torch.full((g.n, g.n), 1.0 / g.n, dtype=dtype),
    GroupedPermutationGroup: lambda g, dtype: torch.block_diag(
        *[torch.full((g.per_group, g.per_group), 1.0 / g.per_group, dtype=dtype)] * g.groups),
}


def relaxed_spaces(spec: SymmetrySpec, opts: WeightMatchingOptions) -> dict[str, Group]:
    """The spaces the descent relaxes, with the group each is matched in: those whose group
    has a weight-matching step and keeps norms (permutations, orthogonal maps)."""
    groups = effective_groups(spec, opts.residual, opts.inner or "invertible",
                              bool(opts.fix_ones))
    stream = stream_space(spec)
    return {s: g for s, g in groups.items()
            if solvable(g) and g.isometric and not (s == stream and opts.residual == "none")}


class Agreement:
    """F for N models, at given elements and along a segment. The relaxed maps are dense
    matrices X (n, n) held as ``Matrix(X, orthogonal=True)``: that acts as X on an output
    side and as W·Xᵀ on an input side, which for a permutation or an orthogonal map is its
    own action (W·T⁻¹ = W·Tᵀ), so the relaxation agrees with the group on its vertices."""

    def __init__(self, models: Sequence[CanonicalModel], opts: WeightMatchingOptions):
        self.spec = models[0].spec.weights_only()
        w = tensor_weights(self.spec, models[0].state, opts.weighting, None, opts.bias_weight,
                           opts.role_weights)
        # (√w_t folded into the tensors: ⟨√w a, √w b⟩ = w⟨a, b⟩)
        self.states = [{n: m.state[n] * w[n] ** 0.5 for n in self.spec.axes} for m in models]

    def moved(self, i: int, elements: dict[str, Element]) -> dict[str, torch.Tensor]:
        return {n: apply_axes(x, self.spec.axes[n], elements)
                for n, x in self.states[i].items()}

    def term(self, name: str, elements: list[dict[str, Element]]) -> torch.Tensor:
        """Tensor ``name``'s part of F: (‖Σ_i A_i‖² − Σ_i ‖A_i‖²) / 2 (A_i: model i's
        tensor moved)."""
        tags = self.spec.axes[name]
        moved = [apply_axes(state[name], tags, el)
                 for state, el in zip(self.states, elements, strict=True)]
        return (sum(moved).pow(2).sum() - sum(x.pow(2).sum() for x in moved)) / 2

    def value(self, elements: list[dict[str, Element]]) -> torch.Tensor:
        """F, the sum of every tensor's :meth:`term`."""
        return sum(self.term(name, elements) for name in self.spec.axes)

    def gradient(self, elements: list[dict[str, Element]], xs: list[dict[str, torch.Tensor]],
                 ) -> tuple[float, list[dict[str, torch.Tensor]]]:
        """F and its gradient in the relaxed maps ``xs`` (leaves of ``elements``, which holds
        them as Matrix elements), tensor by tensor: each tensor's term is differentiated on
        its own and its graph freed, so that one tensor's moved copies are held at a time,
        never every model's whole graph."""
        grads = [{s: torch.zeros_like(x) for s, x in x_i.items()} for x_i in xs]
        total = 0.0
        for name, tags in self.spec.axes.items():
            term = self.term(name, elements)
            total += float(term.detach())
            spaces = {s for tag in tags for s, _ in tag or ()}
            wrt = [(i, s) for i, x_i in enumerate(xs) for s in spaces
                   if s in x_i and x_i[s].requires_grad]
            if wrt:
                for (i, s), g in zip(wrt, torch.autograd.grad(term, [xs[i][s] for i, s in wrt]),
                                     strict=True):
                    grads[i][s] += g
            del term
        return total, grads

    def along(self, fixed: list[dict[str, Element]], xs: list[dict[str, torch.Tensor]],
              dirs: list[dict[str, torch.Tensor]]) -> list[float]:
        """The coefficients c_k of F(X + γD) = Σ_k c_k γ^k, exactly: a tensor moved by maps
        X + γD on k axes is a polynomial of degree k in γ (its coefficients found axis by
        axis), and F is a sum of inner products of such polynomials. Tensor by tensor, so
        that only one tensor's coefficients are held at a time."""
        poly: list[float] = []

        def add(p: list[torch.Tensor], sign: float) -> None:  # (+ sign·‖p(γ)‖²)
            for a, pa in enumerate(p):
                for b, pb in enumerate(p):
                    while len(poly) <= a + b:
                        poly.append(0.0)
                    poly[a + b] += sign * float((pa * pb).sum())

        for name, tags in self.spec.axes.items():
            total: list[torch.Tensor] = []  # (Σ_i of model i's polynomial, coefficientwise)
            for i, state in enumerate(self.states):
                p = _moved_along(state[name], tags, fixed[i], xs[i], dirs[i])
                add(p, -0.5)
                total = [total[k] + p[k] if k < len(total) and k < len(p)
                         else (total[k] if k < len(total) else p[k])
                         for k in range(max(len(total), len(p)))]
            add(total, 0.5)
        return poly


def _moved_along(x: torch.Tensor, tags: tuple, fixed: dict[str, Element],
                 xs: dict[str, torch.Tensor], dirs: dict[str, torch.Tensor],
                 ) -> list[torch.Tensor]:
    """x moved by the maps X + γD (and the fixed elements), as its coefficients in γ: the
    action of ``apply_axes``, axis by axis in its order, on a polynomial."""
    coeffs = [x]
    for axis, tag in enumerate(tags):
        for space, variance in tag or ():
            if space in xs:
                xm, dm = Matrix(xs[space], orthogonal=True), Matrix(dirs[space], orthogonal=True)
                out = [xm.apply(c, axis, variance) for c in coeffs] + [None]
                for k, c in enumerate(coeffs):
                    step = dm.apply(c, axis, variance)
                    out[k + 1] = step if out[k + 1] is None else out[k + 1] + step
                coeffs = out
            elif space in fixed:
                coeffs = [fixed[space].apply(c, axis, variance) for c in coeffs]
    return coeffs


def best_step(poly: Sequence[float], grid: int = 4096) -> tuple[float, float]:
    """The γ in [0, 1] maximising Σ_k c_k γ^k (on a fine grid; exact enough for a descent
    that re-linearises at once) and the gain over γ = 0."""
    gammas = torch.linspace(0.0, 1.0, grid + 1, dtype=torch.float64)
    values = sum(c * gammas**k for k, c in enumerate(poly))
    k = int(torch.argmax(values))
    return float(gammas[k]), float(values[k] - values[0])


def _elements(fixed: list[dict[str, Element]], xs: list[dict[str, torch.Tensor]],
              ) -> list[dict[str, Element]]:
    return [{**f, **{s: Matrix(x, orthogonal=True) for s, x in x_i.items()}}
            for f, x_i in zip(fixed, xs, strict=True)]


def universe(models: Sequence[CanonicalModel], opts: WeightMatchingOptions | None = None,
             max_iter: int = 50, tol: float = 1e-5, start: str = "star",
             progress: Callable[[int, int], None] | None = None) -> Frame:
    """Universe matching of ``models`` (see the module). ``rounds``: each model's relative
    distance to the mean of the others at the start and at the end; ``trace``: F over the
    magnitude of its start after every iteration; ``converged``: the gap or the gain fell to
    ``tol``."""
    check_models(models)
    if start not in STARTS:
        raise GlmcError(f"unknown start {start!r} (one of {', '.join(STARTS)})")
    opts = frame_options(models, opts)
    spec, n = models[0].spec, len(models)
    init = (star(models, opts) if start == "star"
            else Frame("identity", [Transform.identity(spec)] * n))
    groups = relaxed_spaces(spec, opts)
    f = Agreement(models, opts)
    dtype = next(iter(f.states[0].values())).dtype
    fixed = [{s: e for s, e in t.elements.items() if s not in groups} for t in init.transforms]
    xs = [{s: (t.elements[s].matrix(dtype) if s in t.elements else torch.eye(g.n, dtype=dtype))
           for s, g in groups.items()} for t in init.transforms]
    if start == "barycenter":  # (model 1 anchors the frame; the others start undecided)
        for x_i in xs[1:]:
            for s, g in groups.items():
                if type(g) in CENTRES:
                    x_i[s] = CENTRES[type(g)](g, dtype)
    with torch.no_grad():
        f0 = float(f.value(_elements(fixed, xs)))
    trace: list[float] = []
    converged = False
    for k in range(max_iter):
        leaves = [{s: x.detach().requires_grad_(True) for s, x in x_i.items()} for x_i in xs]
        current, grads = f.gradient(_elements(fixed, leaves), leaves)
        del leaves
        workspace.release_freed()
        dirs, gap = [], 0.0
        for x_i, g_i in zip(xs, grads, strict=True):
            d_i = {}
            for s, x in x_i.items():
                g = g_i[s]
                vertex = solve(groups[s], g.double(), None, dtype).matrix(dtype)
                d_i[s] = vertex - x
                gap += float((g * d_i[s]).sum())
            dirs.append(d_i)
        del grads
        if gap <= tol * max(abs(current), 1e-300):
            converged = True
            break
        with torch.no_grad():
            gamma, gain = best_step(f.along(fixed, xs, dirs))
        workspace.release_freed()
        if gamma == 0.0 or gain <= tol * max(abs(current), 1e-300):  # (settled)
            converged = True
            break
        xs = [{s: x + gamma * d[s] for s, x in x_i.items()}
              for x_i, d in zip(xs, dirs, strict=True)]
        best = current + gain
        trace.append(best / abs(f0) if f0 else best)
        if progress is not None:
            progress(k + 1, max_iter)
    transforms = [Transform({**fi, **{s: solve(groups[s], x.double(), None, dtype)
                                      for s, x in x_i.items()}})
                  for fi, x_i in zip(fixed, xs, strict=True)]
    if len(groups) < len(spec.spaces):
        transforms = _inner_passes(models, transforms, opts)
    back = transforms[0].inverse(spec)
    transforms = [Transform.identity(spec), *(back.compose(t, spec) for t in transforms[1:])]
    rounds = [spreads(models, init.transforms, opts), spreads(models, transforms, opts)]
    return Frame("universe", transforms, rounds, converged, trace)


def _inner_passes(models: Sequence[CanonicalModel], transforms: list[Transform],
                  opts: WeightMatchingOptions, passes: int = 2) -> list[Transform]:
    """Each model's heads' inner maps chosen afresh against the mean of the others (their
    assignments and every other map kept), model after model, ``passes`` times. Only the
    tensors the heads' maps read are moved and averaged (the others are placeholders)."""
    n, spec = len(models), models[0].spec
    names = head_tensors(spec)
    transforms = list(transforms)
    unread = {k: torch.empty_like(t, device="meta") for k, t in models[0].state.items()
              if k not in names}

    def moved(i: int) -> dict[str, torch.Tensor]:
        return {k: apply_axes(models[i].state[k], spec.axes[k], transforms[i].elements)
                for k in names}

    heads = [moved(i) for i in range(n)]
    for _ in range(passes):
        for i in range(n):
            target = models[0].with_state({**unread, **mean_of_others(heads, i)})
            transforms[i] = realign_inner(target, models[i], transforms[i], opts=opts)
            heads[i] = moved(i)
    return transforms


def spreads(models: Sequence[CanonicalModel], transforms: Sequence[Transform],
            opts: WeightMatchingOptions) -> list[float]:
    """Each model's weighted relative distance to the mean of the others in the frame,
    D / Σ w(‖θ_i‖² + ‖mean‖²) over the spec's tensors."""
    spec = models[0].spec.weights_only()
    w = tensor_weights(spec, models[0].state, opts.weighting, None, opts.bias_weight,
                       opts.role_weights)
    n = len(models)
    num, den = [0] * n, [0] * n
    for k, tags in spec.axes.items():  # (one tensor of every model at a time)
        moved = [{k: apply_axes(m.state[k], tags, t.elements)}
                 for m, t in zip(models, transforms, strict=True)]
        for i in range(n):
            x, mean = moved[i][k].double(), mean_of_others(moved, i)[k].double()
            num[i] += w[k] * float((x - mean).pow(2).sum())
            den[i] += w[k] * float(x.pow(2).sum() + mean.pow(2).sum())
    return [a / b if b > 0 else float("nan") for a, b in zip(num, den, strict=True)]
