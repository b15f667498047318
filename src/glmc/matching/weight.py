"""Weight matching (data-free): minimise D(π) = Σ_t w_t·‖A_t − π(B)_t‖² by coordinate descent.

D is the distance of what the merge interpolates (see ``problem``). Generic over the spec.
Units of the descent:

- the residual space (group "orthogonal"): orthogonal Procrustes, the exact minimiser of D
  given the others; an assignment for the permutation-only ablation;
- every plain permutation space (MLP units, heads in circuit form): a linear assignment by the
  angle between the units' weight vectors (scale-free; see ``WeightMatchingOptions.unit_cost``);
- every block permutation with nested inner spaces (heads in head form): for every pair of
  heads, the inner map that best aligns them (balanced factors, then Procrustes; or a
  permutation of the head dimensions) and the distance it leaves; an assignment over heads.

In transformers the spaces other than the residual one touch only the residual space, so
given the residual map they are independent: one iteration solves all of them (several at
once, one per core), then the residual map. Units that share a tensor (chained layers) are
solved one after another, each given the steps before it. The trace records D after every
iteration. The units' steps live in ``problem``, the residual map's in ``residual``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from glmc.matching.problem import (
    Problem,
    StateDict,
    WeightMatchingOptions,
    check_pair,
    head_tensors,
    propose_heads,
    propose_permutation,
    relative,
)
from glmc.matching.residual import ResidualCache, solo_cross, spectral_init
from glmc.matching.solvers import assignment, procrustes
from glmc.model import CanonicalModel
from glmc.symmetry.groups import Element, Matrix, Permutation
from glmc.symmetry.transform import Transform, apply_axes, unapply_axes

__all__ = ["MatchResult", "WeightMatchingOptions", "centred_pair", "check_pair",
           "realign_inner", "weight_matching"]


@dataclass
class MatchResult:
    transform: Transform
    #: Per iteration: the distance D and D relative to the models' scale, units solved and
    #: changed, wall seconds per phase ("units", "residual") and the workers' seconds per kind
    #: of unit.
    trace: list[dict]
    converged: bool
    init_distance: float  # D before the first iteration (the start of the residual map)
    scale: float  # Σ w(‖A‖² + ‖B‖²): D / scale is about 1 for unrelated weights, 0 for equal

    @property
    def distance(self) -> float:
        return self.trace[-1]["distance"] if self.trace else self.init_distance

    @property
    def relative(self) -> float:
        return relative(self.distance, self.scale)

    def to_json(self) -> dict:
        return {"iterations": len(self.trace), "converged": self.converged,
                "init_distance": self.init_distance,
                "init_relative": relative(self.init_distance, self.scale),
                "distance": self.distance, "relative": self.relative, "scale": self.scale,
                "trace": self.trace}


# -- the problem ----------------------------------------------------------------------------


def centred_pair(a: CanonicalModel, b: CanonicalModel) -> bool:
    """Both streams stay in the ones-complement: residual maps should fix the ones direction."""
    return a.uncentred_writer() is None and b.uncentred_writer() is None


def inner_maps(prob: Problem, unit: str, el: dict[str, Element]) -> dict[str, Element]:
    """The inner maps of ``unit``'s heads (and the unit's own element) for its assignment in
    ``el`` and every other element there (e.g. after learned matching reassigned heads)."""
    spec = prob.spec
    mine = {unit, *prob.inner_of[unit]}
    names = sorted({n for s in mine for n, _, _ in spec.occurrences(s)})
    others = {k: e for k, e in el.items() if k not in mine}
    bt = {n: apply_axes(prob.B[n], spec.axes[n], others) for n in names}
    return propose_heads(prob, unit, el, bt).finish(el[unit].perm)


def realign_inner(a: CanonicalModel, b: CanonicalModel, transform: Transform,
                  units: list[str] | None = None,
                  opts: WeightMatchingOptions | None = None) -> Transform:
    """The heads' inner maps aligned afresh for ``transform``'s head assignments and residual
    map; every other element is kept."""
    prob = Problem(a, b, opts or WeightMatchingOptions(), only=head_tensors(a.spec))
    el = dict(transform.elements)
    for unit in units if units is not None else list(prob.inner_of):
        if prob.inner_of.get(unit):  # (circuit form: heads without inner bases)
            el.update(inner_maps(prob, unit, el))
    return Transform(el)


def cache_free_solve(prob: Problem, res: str, m: torch.Tensor) -> Element:
    """The residual map maximising ⟨T, m⟩ (Procrustes, or an assignment)."""
    if prob.opts.residual == "permutation":
        return Permutation(assignment(m))
    return Matrix(procrustes(m, prob.opts.fix_ones).to(prob.dtype), orthogonal=True)


# -- the loop -------------------------------------------------------------------------------


@dataclass
class UnitStep:
    """One unit solved given the others: its new elements, its tensors moved to them, and
    their objective terms (the loop accepts the step unless it lowers the objective)."""

    unit: str
    names: list[str]
    new: dict[str, Element]
    moved: StateDict
    terms: dict[str, float]
    cross: dict[str, torch.Tensor]  # the residual cache's entries for the moved tensors
    seconds: float


def solve_unit(prob: Problem, cache: ResidualCache | None, unit: str,
               el: dict[str, Element], bt_all: StateDict) -> UnitStep:
    """Solve ``unit`` given every other element. Of the shared state it writes only its own
    tensors' entries (``cache.refresh`` brings them up to date with the residual map) and
    reads ``el``, so units that share no tensor may run at once."""
    t0 = time.perf_counter()
    spec = prob.spec
    mine = {unit, *prob.inner_of.get(unit, [])}
    names = sorted({n for s in mine for n, _, _ in spec.occurrences(s)})
    if cache is not None:
        cache.refresh(names, el)
    bt = {n: unapply_axes(bt_all[n], spec.axes[n], {k: el[k] for k in mine}) for n in names}
    propose = propose_heads if prob.inner_of.get(unit) else propose_permutation
    prop = propose(prob, unit, el, bt)
    perm = assignment(prop.cost, prop.current)
    prop.cost = None  # (n x n: freed before the tensors are moved)
    new = prop.finish(perm)
    moved = {n: apply_axes(bt[n], spec.axes[n], new) for n in names}
    terms = prob.terms(moved, prob.term_names(unit))
    cross = {}
    if cache is not None and not torch.equal(new[unit].perm, el[unit].perm):
        cross = cache.permuted(moved, unit, el[unit], new[unit])
    return UnitStep(unit, names, new, moved, terms, cross, time.perf_counter() - t0)


def solved_in_order(pool: ThreadPoolExecutor, depth: int, prob: Problem,
                    cache: ResidualCache | None, due: list[str], el: dict[str, Element],
                    bt_all: StateDict) -> Iterator[UnitStep]:
    """The ``due`` units solved on the pool, yielded in order, at most ``depth`` in flight
    (each holds an n x n cost while it runs; depth 1: each sees the steps taken before)."""
    pending: list[Future] = []
    for unit in due:
        pending.append(pool.submit(solve_unit, prob, cache, unit, el, bt_all))
        if len(pending) >= depth:
            yield pending.pop(0).result()
    for future in pending:
        yield future.result()


#: Memory the units in flight may hold (each an n x n cost in float32 and its float64 copy).
UNITS_IN_FLIGHT_BYTES = 2 << 30


def unit_workers(prob: Problem, threads: int) -> tuple[int, int]:
    """(workers, depth): units solved at once (one per core, within the memory budget) and
    units in flight. Units that share a tensor are solved one after another."""
    if not prob.independent or not prob.units:
        return 1, 1
    n = max(prob.spec.spaces[u].size // prob.spec.spaces[u].block for u in prob.units)
    fit = max(1, UNITS_IN_FLIGHT_BYTES // (12 * n * n) - 1)
    workers = max(1, min(threads, fit))
    return workers, workers + 1


def weight_matching(
    a: CanonicalModel,
    b: CanonicalModel,
    opts: WeightMatchingOptions | None = None,
    progress=None,
    where: str = "",
    on_iteration: Callable[[int, Transform], None] | None = None,
) -> MatchResult:
    """Align B to A: returns the transform π with π(B) ≈ A and the distance's trace.

    progress: optional callable(iteration, relative distance) called after each iteration.
    where: how to name the pair in error messages.
    on_iteration: optional callable(k, transform after k iterations), k = 0 (the start) to
    the last iteration (to study how the alignment evolves).
    """
    opts = opts or WeightMatchingOptions()
    check_pair(a, b, where)
    if opts.fix_ones is None:
        opts = replace(opts, fix_ones=centred_pair(a, b))
    prob = Problem(a, b, opts)
    spec = prob.spec
    el: dict[str, Element] = {s: g.identity(a.dtype) for s, g in spec.spaces.items()}
    res = prob.residual[0] if prob.residual and opts.residual != "none" else None
    solo: list[str] = []
    if res is not None:
        if opts.residual == "permutation":
            el[res] = Permutation(torch.arange(spec.spaces[res].size))
        # Tensors only the residual space touches (embedding tables, the head, biases) enter
        # through one constant cross-correlation: their term is ⟨T, A·Bᵀ⟩, never re-applied.
        solo = [n for n, _, _ in spec.occurrences(res) if spec.spaces_of(n) == {res}]
        const = solo_cross(prob, res, solo)
        solo_sq = sum(prob.sq_a[n] + prob.sq_b[n] for n in solo)
        if opts.init == "spectral":
            el[res] = spectral_init(prob, res, const)
        elif opts.init == "embeddings":  # the tables (and biases) only the stream touches
            el[res] = cache_free_solve(prob, res, const)

        def solo_term(t: Element) -> float:
            return solo_sq - 2 * float((t.matrix(torch.float64) * const).sum())

    bt_all = prob.apply(el, set(), [n for n in spec.axes if n not in solo])
    cache = ResidualCache(prob, res, el[res], bt_all) if res is not None else None
    terms = prob.terms(bt_all)
    if res is not None:
        terms["<solo>"] = solo_term(el[res])
    distance = init_distance = sum(terms.values())
    scale = prob.scale()
    prob.release(solo)  # (their term is ⟨T, const⟩ from here on)
    trace: list[dict] = []
    converged = False
    units = prob.units  # (the heads' inner spaces are solved with their heads)
    # Permutations settle after a few iterations while the residual map keeps improving: a
    # unit whose assignment did not change is solved again only every third iteration. The
    # run ends only after a full sweep (every unit solved) that changed almost nothing.
    quiet = dict.fromkeys(units, 0)
    # Units are independent given the residual map, so several are solved at once, one per
    # core, each single-threaded (an assignment is single-threaded anyway, and one product
    # per core uses the cores as well as one product on all of them).
    threads = torch.get_num_threads()
    workers, depth = unit_workers(prob, threads)
    pool = ThreadPoolExecutor(max_workers=workers, initializer=torch.set_num_threads,
                              initargs=(1,))
    if on_iteration is not None:
        on_iteration(0, Transform(dict(el)))
    try:
        for it in range(opts.max_iter):
            wall: dict[str, float] = {}  # wall seconds per phase
            cpu: dict[str, float] = defaultdict(float)  # worker seconds per kind of unit
            start = distance
            due = [u for u in units if quiet[u] == 0 or (it + 1 - quiet[u]) % 3 == 0]
            full = len(due) == len(units)
            changed = 0
            # 1) every non-residual unit given the others (in canonical models they only meet
            #    the residual space, so their order is irrelevant).
            t0 = time.perf_counter()
            for step in solved_in_order(pool, depth, prob, cache, due, el, bt_all):
                done = step.unit
                same = torch.equal(step.new[done].perm, el[done].perm)
                el.update(step.new)  # (inner maps may move when the assignment does not)
                bt_all.update(step.moved)
                terms.update(step.terms)
                if not same:
                    changed += 1
                    if cache is not None:
                        cache.cross.update(step.cross)
                quiet[done] = (quiet[done] or it + 1) if same else 0  # 1-based
                cpu[spec.roles.get(done, "permutation")] += step.seconds
            wall["units"] = time.perf_counter() - t0
            # 2) the residual map, given all the others: D's exact minimiser (linearised where
            #    it acts twice on a tensor, as on circuit-form attention).
            if cache is not None:
                t0 = time.perf_counter()
                new_el = cache.solve(el, const)
                new_terms, moved = cache.terms(new_el, el)  # (moves the fresh tensors)
                new_terms["<solo>"] = solo_term(new_el)
                el[res] = new_el
                terms.update(new_terms)
                cache.moved(moved, new_el)
                wall["residual"] = time.perf_counter() - t0
            distance = sum(terms.values())
            trace.append({"iteration": it + 1, "distance": distance,
                          "relative": relative(distance, scale),
                          "units_solved": len(due), "units_changed": changed,
                          "seconds": {k: round(v, 4) for k, v in wall.items()},
                          "unit_seconds": {k: round(v, 4) for k, v in cpu.items()}})
            if progress is not None:
                progress(it + 1, relative(distance, scale))
            if on_iteration is not None:
                on_iteration(it + 1, Transform(dict(el)))
            if start - distance <= opts.tol * abs(start):
                if full and changed == 0:
                    converged = True
                    break
                quiet = dict.fromkeys(units, 0)  # confirm with a full sweep
    finally:
        pool.shutdown(cancel_futures=True)
        # (a worker's set_num_threads also sets the default of threads started later)
        torch.set_num_threads(threads)
    return MatchResult(Transform(el), trace, converged, init_distance, scale)
