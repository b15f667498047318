"""Weight matching (data-free): maximise Σ_t w_t·⟨A_t, π(B)_t⟩ by coordinate descent.

Generic over the spec. Units of the descent:

- the residual space (group "orthogonal"): orthogonal Procrustes, or an assignment for the
  permutation-only ablation;
- every plain permutation space (MLP units, heads in circuit form): a linear assignment;
- every block permutation with nested inner spaces (heads in head form): an assignment over
  heads with a cost invariant to the inner maps (inner products of QK and OV circuits,
  computed from the low-rank factors), then each matched head's inner basis.

Spaces other than the residual one touch only the residual space, so given the residual map
they are independent: one iteration solves all of them, then the residual map. Tensors
inside a head contribute through their circuits (invariant to the inner maps); all others
through their plain inner product. The objective never decreases: a step that would lower
it is undone.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from glmc.errors import GlmcError
from glmc.matching.solvers import align_inner, assignment, balancing_map, procrustes
from glmc.models.model import CanonicalModel
from glmc.symmetry.groups import BlockMatrix, Element, Matrix, Permutation, ones_complement_basis
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform, _nested_pairs, apply_axes

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


@dataclass
class MatchResult:
    transform: Transform
    trace: list[dict]  # per iteration: objective, normalised objective, seconds per kind
    converged: bool
    init_objective: float
    norm: float  # sqrt(‖A‖²·‖B‖²) of the weighted objective, to read it as a cosine

    def to_json(self) -> dict:
        return {"iterations": len(self.trace), "converged": self.converged,
                "init_objective": self.init_objective, "norm": self.norm, "trace": self.trace}


# -- the problem ----------------------------------------------------------------------------


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


def _weights(spec: SymmetrySpec, state: StateDict, scheme: str) -> dict[str, float]:
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


def _stack(state: StateDict, parts: list[tuple[str, int]]) -> torch.Tensor:
    return torch.cat([state[n].movedim(ax, 0).reshape(state[n].shape[ax], -1)
                      for n, ax in parts], dim=1)


def _axis_first(t: torch.Tensor, axis: int) -> torch.Tensor:
    return t.movedim(axis, 0).reshape(t.shape[axis], -1)


class Problem:
    """Weighted A and B, the spec's units, and the objective's terms."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions):
        spec = a.spec
        self.spec, self.opts = spec, opts
        w = _weights(spec, a.state, opts.weighting)
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
        nested = _nested_pairs(spec)
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
        self.units = [s for s, g in spec.spaces.items()
                      if g.kind == "permutation" and s not in self.residual]
        for s in spec.spaces:
            if spec.spaces[s].kind == "block_invertible" and s not in inner_spaces:
                raise GlmcError(f"space {s}: a free invertible space is not supported")

    # -- objective --------------------------------------------------------------------------
    def bundle_gram(self, bd: Bundle, sa: StateDict, sb: StateDict,
                    diagonal: bool = False) -> torch.Tensor:
        """(H, H) circuit inner products ⟨X_aᵢᵀ Y_aᵢ, X_bⱼᵀ Y_bⱼ⟩ between heads i of a, j of b
        (only i = j, shape (H,), with ``diagonal``): tr(X_aᵢ X_bⱼᵀ · (Y_aᵢ Y_bⱼᵀ)ᵀ)."""
        k = self.spec.spaces[bd.space].block
        xa, xb = _stack(sa, bd.xs), _stack(sb, bd.xs)
        ya, yb = _stack(sa, bd.ys), _stack(sb, bd.ys)
        h = xa.shape[0] // k
        xa, xb, ya, yb = (t.view(h, k, -1) for t in (xa, xb, ya, yb))
        if diagonal:
            return ((xa @ xb.mT) * (ya @ yb.mT)).sum((1, 2))
        gx = (xa.reshape(h * k, -1) @ xb.reshape(h * k, -1).T).view(h, k, h, k)
        gy = (ya.reshape(h * k, -1) @ yb.reshape(h * k, -1).T).view(h, k, h, k)
        return (gx * gy).sum((1, 3))

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
                x, y = _stack(s, bd.xs), _stack(s, bd.ys)
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


def _cross(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> torch.Tensor:
    """M = Σ over (tensor, axis) of ``space``: A_axis-first · B̃_axis-firstᵀ, (n, n).

    ``bt`` holds B with every space but ``space`` applied (tensors it lacks are skipped). The
    occurrences are concatenated into one product. Where the space acts on a tensor twice (a
    circuit-form attention weight) the term is quadratic: it is linearised at the current
    element, applied on the other axis.
    """
    counts: dict[str, int] = defaultdict(int)
    for n, _, _ in prob.spec.occurrences(space):
        counts[n] += 1
    left, right = [], []
    for n, axis, _ in prob.spec.occurrences(space):
        if n not in bt:
            continue
        b = bt[n]
        if counts[n] > 1:
            b = apply_axes(b, prob.spec.axes[n], {space: el[space]}, skip={(axis, space)})
        left.append(_axis_first(prob.A[n], axis))
        right.append(_axis_first(b, axis))
    return torch.cat(left, 1) @ torch.cat(right, 1).T


def _current(el: dict[str, Element], space: str) -> torch.Tensor | None:
    """The current permutation of ``space`` (a warm start for the assignment), if any."""
    cur = el[space]
    return cur.perm if isinstance(cur, Permutation) else None


@dataclass
class Proposal:
    """One unit's step: an assignment problem, and how its solution becomes elements."""

    cost: torch.Tensor
    current: torch.Tensor | None
    finish: Callable[[torch.Tensor], dict[str, Element]]


def _propose_permutation(prob: Problem, space: str, el: dict[str, Element],
                         bt: StateDict) -> Proposal:
    block = prob.spec.spaces[space].block
    return Proposal(_cross(prob, space, el, bt), _current(el, space),
                    lambda perm: {space: Permutation(perm, block)})


def _propose_heads(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """Assign heads by circuit similarity, then align each matched head's inner bases."""
    k = prob.spec.spaces[space].block
    bundles = [bd for bd in prob.bundles if bd.space in prob.inner_of[space]]
    cost = sum(prob.bundle_gram(bd, prob.A, bt) for bd in bundles)

    def finish(sigma: torch.Tensor) -> dict[str, Element]:
        out: dict[str, Element] = {space: Permutation(sigma, k)}
        inv_sigma = torch.argsort(sigma)
        for bd in bundles:
            group_in = prob.spec.spaces[bd.space]
            xa, ya = _stack(prob.A, bd.xs), _stack(prob.A, bd.ys)
            xb, yb = _stack(bt, bd.xs), _stack(bt, bd.ys)
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

    return Proposal(cost, _current(el, space), finish)


def _residual_cross(prob: Problem, space: str, bt: StateDict) -> torch.Tensor:
    """Σ over occurrences of ``space`` in ``bt``'s tensors: A_axis-first · B̃_axis-firstᵀ."""
    m = None
    for n, axis, _ in prob.spec.occurrences(space):
        if n in bt:
            c = (_axis_first(prob.A[n], axis) @ _axis_first(bt[n], axis).T).double()
            m = c if m is None else m + c
    return m


def _spectral_init(prob: Problem, space: str) -> Element:
    """Residual map from invariants: T·G_B·Tᵀ = G_A for the Gram matrices of every tensor
    whose other axes carry only permutation/orthogonal spaces; the eigenvector signs come
    from the tensors that only the residual space touches."""
    spec = prob.spec
    ga = gb = m_ro = None
    for n, axis, _ in spec.occurrences(space):
        others = spec.spaces_of(n) - {space}
        if any(spec.spaces[s].kind == "block_invertible" for s in others):
            continue
        a, b = _axis_first(prob.A[n], axis), _axis_first(prob.B[n], axis)
        ga = a @ a.T if ga is None else ga + a @ a.T
        gb = b @ b.T if gb is None else gb + b @ b.T
        if not others:
            m_ro = a @ b.T if m_ro is None else m_ro + a @ b.T
    d = prob.spec.spaces[space].size
    if ga is None:
        return Matrix(torch.eye(d), True)
    q = (ones_complement_basis(d) if prob.opts.fix_ones else torch.eye(d, dtype=torch.float64))
    ga, gb = q.T @ ga.double() @ q, q.T @ gb.double() @ q
    _, ua = torch.linalg.eigh(ga)
    _, ub = torch.linalg.eigh(gb)
    if m_ro is not None:
        signs = torch.sign(torch.diagonal(ua.T @ (q.T @ m_ro.double() @ q) @ ub))
        signs[signs == 0] = 1
    else:
        signs = torch.ones(ua.shape[1], dtype=torch.float64)
    t = q @ (ua * signs) @ ub.T @ q.T
    if prob.opts.fix_ones:
        t = t + torch.full((d, d), 1.0 / d, dtype=torch.float64)
    if prob.opts.residual == "permutation":
        return Permutation(assignment(t))
    return Matrix(t.to(prob.A[next(iter(prob.A))].dtype), True)


class ResidualCache:
    """The residual step without touching most of the model.

    Every tensor the residual space acts on once keeps its cross-correlation
    C_n = A_n·B̂_nᵀ (B̂: B with every other element applied, not the residual map), which only
    changes when its own unit's assignment does. Then the residual step needs only Σ C_n, and
    a tensor's term is ⟨T, C_n⟩. B̃ (``bt_all``) may lag behind the residual map for tensors
    whose units are not due; ``refresh`` brings them up to date before their unit is solved.
    Tensors in head bundles (circuit terms, and inner maps that move even when the heads'
    assignment does not) and tensors the space acts on twice are kept fresh instead.
    """

    def __init__(self, prob: Problem, space: str, t: Element, bt_all: StateDict) -> None:
        self.prob, self.space, self.bt_all = prob, space, bt_all
        counts: dict[str, int] = defaultdict(int)
        for n, _, _ in prob.spec.occurrences(space):
            if n in bt_all:
                counts[n] += 1
        bundled = {n for bd in prob.bundles for n, _ in bd.xs + bd.ys}
        self.fresh = sorted(n for n in bt_all if n in bundled or counts.get(n, 0) > 1)
        self.direct = [n for n in self.fresh if n in counts]  # its M term computed each time
        self.axis = {n: ax for n, ax, _ in prob.spec.occurrences(space)
                     if counts.get(n) == 1 and n not in self.fresh}
        self.at = dict.fromkeys(counts, t)  # the residual element applied to bt_all[n]
        self.cross: dict[str, torch.Tensor] = {}
        self.recross(list(self.axis))

    def refresh(self, names: list[str], el: dict[str, Element]) -> None:
        t = el[self.space]
        for n in names:
            if n in self.at and self.at[n] is not t:
                step = t.compose(self.at[n].inverse())
                self.bt_all[n] = apply_axes(self.bt_all[n], self.prob.spec.axes[n],
                                            {self.space: step})
                self.at[n] = t

    def recross(self, names: list[str]) -> None:
        """C_n = A·B̃ᵀ·T for fresh tensors (B̃ = T·B̂ on the residual axis)."""
        for n in names:
            if n in self.axis:
                ax = self.axis[n]
                c = _axis_first(self.prob.A[n], ax) @ _axis_first(self.bt_all[n], ax).T
                self.cross[n] = c.double() @ self.at[n].matrix(torch.float64)

    def solve(self, el: dict[str, Element], const: torch.Tensor) -> Element:
        self.refresh(self.fresh, el)
        m = sum(self.cross.values(), const.clone())
        if self.direct:  # (quadratic terms are linearised at T)
            c = _residual_cross(self.prob, self.space, {n: self.bt_all[n] for n in self.direct})
            m = m + c @ el[self.space].matrix(torch.float64)
        if self.prob.opts.residual == "permutation":
            return Permutation(assignment(m, _current(el, self.space)))
        return Matrix(procrustes(m, self.prob.opts.fix_ones).to(self.prob.dtype),
                      orthogonal=True)

    def terms(self, t: Element, el: dict[str, Element]) -> tuple[dict[str, float], StateDict]:
        """The objective terms under residual map ``t`` and the fresh tensors moved to it."""
        if t is el[self.space]:
            moved = {n: self.bt_all[n] for n in self.fresh}
        else:
            step = t.compose(el[self.space].inverse())
            moved = {n: apply_axes(self.bt_all[n], self.prob.spec.axes[n], {self.space: step})
                     for n in self.fresh}
        out = self.prob.terms(moved)
        tm = t.matrix(torch.float64)
        for n, c in self.cross.items():
            if n in self.prob.plain:
                out[n] = float((tm * c).sum())
        return out, moved

    def moved(self, moved: StateDict, t: Element) -> None:
        self.bt_all.update(moved)
        for n in moved:
            if n in self.at:
                self.at[n] = t


def _solo_cross(prob: Problem, space: str, names: list[str]) -> torch.Tensor:
    d = prob.spec.spaces[space].size
    m = torch.zeros(d, d, dtype=torch.float64)  # computed once: worth full precision
    for n, axis, _ in prob.spec.occurrences(space):
        if n in names:
            m += _axis_first(prob.A[n], axis).double() @ _axis_first(prob.B[n], axis).double().T
    return m


def centred_pair(a: CanonicalModel, b: CanonicalModel) -> bool:
    """Both streams stay in the ones-complement: residual maps should fix the ones direction."""
    return a.uncentred_writer() is None and b.uncentred_writer() is None


def realign_inner(a: CanonicalModel, b: CanonicalModel, transform: Transform,
                  units: list[str] | None = None) -> Transform:
    """The heads' inner maps aligned afresh for ``transform``'s head assignment and residual
    map (e.g. after learned matching reassigned heads); every other element is kept."""
    prob = Problem(a, b, WeightMatchingOptions())
    spec, el = prob.spec, dict(transform.elements)
    for unit in units if units is not None else list(prob.inner_of):
        if not prob.inner_of.get(unit):
            continue  # (circuit form: heads without inner bases)
        mine = {unit, *prob.inner_of[unit]}
        names = sorted({n for s in mine for n, _, _ in spec.occurrences(s)})
        others = {k: e for k, e in el.items() if k not in mine}
        bt = {n: apply_axes(prob.B[n], spec.axes[n], others) for n in names}
        el.update(_propose_heads(prob, unit, el, bt).finish(el[unit].perm))
    return Transform(el)


# -- the loop -------------------------------------------------------------------------------


def unapply_axes(x: torch.Tensor, tags: tuple, elements: dict[str, Element]) -> torch.Tensor:
    """Undo ``apply_axes(x, tags, elements)`` (inverses, in reverse order)."""
    for axis, tag in enumerate(tags):
        for space, variance in reversed(tag or ()):
            if space in elements:
                x = elements[space].inverse().apply(x, axis, variance)
    return x


def weight_matching(
    a: CanonicalModel,
    b: CanonicalModel,
    opts: WeightMatchingOptions | None = None,
    progress=None,
) -> MatchResult:
    """Align B to A: returns the transform π with π(B) ≈ A and the objective's trace.

    progress: optional callable(iteration, normalised objective) called after each iteration.
    """
    opts = opts or WeightMatchingOptions()
    check_pair(a, b)
    if opts.residual not in ("orthogonal", "permutation", "none"):
        raise GlmcError(f"unknown residual mode {opts.residual!r}")
    if opts.fix_ones is None:
        opts = replace(opts, fix_ones=centred_pair(a, b))
    prob = Problem(a, b, opts)
    spec = prob.spec
    el: dict[str, Element] = {s: g.identity(a.dtype) for s, g in spec.spaces.items()}
    residual = [] if opts.residual == "none" else prob.residual
    for s in residual:
        if opts.residual == "permutation":
            el[s] = Permutation(torch.arange(spec.spaces[s].size))
        if opts.init == "spectral":
            el[s] = _spectral_init(prob, s)
    # Tensors only the residual space touches (embedding tables, the head, biases) enter
    # through one constant cross-correlation: their term is ⟨T, A·Bᵀ⟩, never re-applied.
    solo = {s: [n for n, _, _ in spec.occurrences(s) if spec.spaces_of(n) == {s}]
            for s in residual}
    const = {s: _solo_cross(prob, s, solo[s]) for s in residual}
    skip = {n for names in solo.values() for n in names}
    bt_all = prob.apply(el, set(), [n for n in spec.axes if n not in skip])
    cache = ResidualCache(prob, residual[0], el[residual[0]], bt_all) if residual else None
    terms = prob.terms(bt_all)
    for s in residual:
        terms[f"<solo:{s}>"] = float((el[s].matrix(const[s].dtype) * const[s]).sum())
    objective = init_objective = sum(terms.values())
    norm = prob.norm()
    trace: list[dict] = []
    converged = False
    units = prob.units  # (the heads' inner spaces are solved with their heads)
    # Permutations settle after a few iterations while the residual map keeps improving: a
    # unit whose assignment did not change is solved again only every third iteration. The
    # run ends only after a full sweep (every unit solved) that changed almost nothing.
    quiet = dict.fromkeys(units, 0)
    pool = ThreadPoolExecutor(max_workers=1)  # assignments overlap the next unit's products
    try:
        for it in range(opts.max_iter):
            times: dict[str, float] = defaultdict(float)
            start = objective
            due = [u for u in units if quiet[u] == 0 or (it + 1 - quiet[u]) % 3 == 0]
            full = len(due) == len(units)
            changed = 0
            # 1) every non-residual unit given the others (in canonical models they only meet
            #    the residual space, so they are independent and their order is irrelevant).
            #    Assignments run on a worker thread while the next unit's products are
            #    computed; at most two units are in flight (each holds an n x n cost).
            in_flight: list = []
            for unit in [*due, None]:  # None: drain
                if unit is not None:
                    t0 = time.perf_counter()
                    mine = {unit, *prob.inner_of.get(unit, [])}
                    names = sorted({n for s in mine for n, _, _ in spec.occurrences(s)})
                    if cache is not None:
                        cache.refresh(names, el)
                    bt = {n: unapply_axes(bt_all[n], spec.axes[n], {k: el[k] for k in mine})
                          for n in names}
                    propose = _propose_heads if prob.inner_of.get(unit) else _propose_permutation
                    prop = propose(prob, unit, el, bt)
                    future = pool.submit(assignment, prop.cost, prop.current)
                    in_flight.append((unit, names, bt, prop, future, time.perf_counter() - t0))
                while len(in_flight) > (1 if unit is not None else 0):
                    done, names, bt, prop, future, spent = in_flight.pop(0)
                    t0 = time.perf_counter()
                    new = prop.finish(future.result())
                    moved = {n: apply_axes(bt[n], spec.axes[n], new) for n in names}
                    new_terms = prob.terms(moved, prob.term_names(done))
                    same = torch.equal(new[done].perm, el[done].perm)
                    if same or sum(new_terms.values()) >= sum(terms[k] for k in new_terms):
                        # (Same assignment: the terms are unchanged, as circuits do not see the
                        # inner maps, which may still move; rounding noise must not veto them.)
                        el.update(new)
                        bt_all.update(moved)
                        if not same:
                            terms.update(new_terms)
                            changed += 1
                        if cache is not None and not same:
                            cache.recross(names)
                        quiet[done] = (quiet[done] or it + 1) if same else 0  # 1-based
                    kind = spec.roles.get(done, "permutation")
                    times[kind] += spent + time.perf_counter() - t0
            # 2) the residual map, given all the others.
            if cache is not None:
                t0 = time.perf_counter()
                s = cache.space
                new_el = cache.solve(el, const[s])
                new_terms, moved = cache.terms(new_el, el)
                old_terms, _ = cache.terms(el[s], el)  # the same arithmetic, for a fair test
                for t_el, tt in ((new_el, new_terms), (el[s], old_terms)):
                    tt[f"<solo:{s}>"] = float((t_el.matrix(torch.float64) * const[s]).sum())
                if sum(new_terms.values()) >= sum(old_terms.values()):
                    el[s] = new_el
                    terms.update(new_terms)
                    cache.moved(moved, new_el)
                times["residual"] += time.perf_counter() - t0
            objective = sum(terms.values())
            trace.append({"iteration": it + 1, "objective": objective,
                          "normalized": objective / norm if norm else 0.0,
                          "units_solved": len(due), "units_changed": changed,
                          "seconds": {k: round(v, 4) for k, v in times.items()}})
            if progress is not None:
                progress(it + 1, objective / norm if norm else 0.0)
            if objective - start <= opts.tol * abs(start):
                if full and changed == 0:
                    converged = True
                    break
                quiet = dict.fromkeys(units, 0)  # confirm with a full sweep
    finally:
        pool.shutdown()
    return MatchResult(Transform(el), trace, converged, init_objective, norm)
