"""Weight matching (data-free): minimise D(π) = Σ_t w_t·‖A_t − π(B)_t‖² by coordinate descent.

D is the distance of what the merge interpolates (see ``problem``). Generic over the spec.
Units of the descent:

- the residual space (role "residual"): the step of its group (``Group.solve``), for the
  orthogonal group a Procrustes, the exact minimiser of D given the others; an assignment
  in its permutations for the permutation-only ablation;
- every other space with a step of its own (``problem.UNIT_STEPS``, by its group): for a
  plain permutation space (MLP units, heads in circuit form), a linear assignment on D's own
  terms (or the angle between the units' weight vectors, ``WeightMatchingOptions.unit_cost``);
  for a block permutation with nested inner spaces (heads in head form): for every pair of
  heads, the inner map that best aligns them (balanced factors, then Procrustes; or a
  permutation of the head dimensions) and the distance it leaves; an assignment over heads.

In transformers the spaces other than the residual one touch only the residual space, so
given the residual map they are independent: one iteration solves all of them (several at
once, one per core), then the residual map. Units that share a tensor (chained layers) are
solved one after another, each given the steps before it. The trace records D after every
iteration. The units' steps live in ``problem``, the residual map's in ``residual``.
``weight_matching`` is the loop: ``Descent`` holds its state and takes the steps, ``Sweeps``
says which units are due and when the run has converged, ``Workers`` solves the units. Under
torchrun the units are shared out among the ranks, with the same result
(:mod:`glmc.matching.spread`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from glmc import distributed
from glmc.matching import workspace
from glmc.matching.heads import propose_heads
from glmc.matching.problem import (
    UNIT_STEPS,
    Problem,
    WeightMatchingOptions,
    check_pair,
    head_tensors,
    relative,
    stream_space,
)
from glmc.matching.residual import ResidualCache, Solo, spectral_init
from glmc.matching.steps import solve
from glmc.model import CanonicalModel
from glmc.symmetry.elements import Element, Permutation
from glmc.symmetry.transform import Transform, apply_axes, unapply_axes
from glmc.tensors import StateDict

__all__ = ["MatchResult", "WeightMatchingOptions", "centred_pair", "check_pair", "fixes_ones",
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
    """Both streams stay in the ones-complement (every residual writer mean-zero)."""
    return a.uncentred_writer() is None and b.uncentred_writer() is None


def fixes_ones(a: CanonicalModel, b: CanonicalModel) -> bool:
    """Whether the residual map should fix the all-ones direction: when the family says the
    stock class needs it (a LayerNorm model's) and both models can still be written back as
    it (both streams centred)."""
    stream = stream_space(a.spec)
    return (stream is not None and a.spec.export.get(stream) == "fix_ones"
            and centred_pair(a, b))


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
    map; every other element is kept."""
    prob = Problem(a, b, opts or WeightMatchingOptions(), only=head_tensors(a.spec))
    el = dict(transform.elements)
    for unit in units if units is not None else list(prob.head_units):
        if unit in prob.head_units:  # (circuit form: heads without inner bases)
            el.update(inner_maps(prob, unit, el))
    return Transform(el)


def residual_start(prob: Problem, solo: Solo, dtype: torch.dtype,
                   grams: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
                   ) -> Element:
    """The residual map's start (``opts.init``): the Gram eigenbases matched ("spectral"), the
    best map for the tensors only the stream touches ("embeddings"), or the identity.
    ``grams``: the spectral start's Gram sums, made elsewhere (across the ranks)."""
    if prob.opts.init == "spectral":
        return spectral_init(prob, prob.stream, solo.const, grams)
    if prob.opts.init == "embeddings":
        return prob.solve_stream(solo.const)
    return prob.stream_group().identity(dtype)


@dataclass
class UnitStep:
    """One unit solved given the others: its new elements, its tensors moved to them, and
    their objective terms (the loop accepts the step unless it lowers the objective)."""

    unit: str
    names: list[str]
    same: bool  # the unit's assignment did not change
    new: dict[str, Element]
    moved: StateDict
    terms: dict[str, float]
    cross: dict[str, torch.Tensor]  # the residual cache's entries for the moved tensors
    seconds: float
    rejected: bool = False  # the proposal would have raised the distance: nothing changed


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
    group = prob.groups[unit]
    prop = UNIT_STEPS[type(group)](prob, unit, el, bt)
    solution = solve(group, prop.cost, el[unit], prob.dtype)
    prop.cost = None  # (n x n: freed before the tensors are moved)
    if prob.opts.hand_over:  # (the worker's n x n buffers too: the pair fills the memory)
        workspace.release()
    new = prop.finish(solution)
    own = prob.term_names(unit)
    before = prob.terms({n: bt_all[n] for n in names}, own)
    if len(mine) == 1 and same_element(new[unit], el[unit]):  # (moved back: bt_all itself)
        moved, terms = {n: bt_all[n] for n in names}, dict(before)
    else:
        moved = {n: apply_axes(bt[n], spec.axes[n], new) for n in names}
        terms = prob.terms(moved, own)
    # The proposal's cost is not the distance itself (the angle between units, the heads'
    # balanced maps): a step is taken only if the distance does not rise, so the descent
    # never goes up. Rejected, a unit with nested spaces still takes their maps for its
    # current assignment if those lower it.
    rejected = not _lowers(terms, before)
    if rejected and len(mine) > 1:
        new = prop.finish(el[unit])
        moved = {n: apply_axes(bt[n], spec.axes[n], new) for n in names}
        terms = prob.terms(moved, own)
    if not _lowers(terms, before):
        kept = {k: el[k] for k in mine}
        return UnitStep(unit, names, True, kept, {n: bt_all[n] for n in names}, before, {},
                        time.perf_counter() - t0, rejected=True)
    same = same_element(new[unit], el[unit])
    cross = {}
    if cache is not None and not same:
        cross = cache.permuted(moved, unit, el[unit], new[unit])
    return UnitStep(unit, names, same, new, moved, terms, cross, time.perf_counter() - t0,
                    rejected=rejected)


def _solve_unit_released(*args) -> UnitStep:
    """:func:`solve_unit`, then what it freed handed back (see ``workspace.release_freed``)."""
    step = solve_unit(*args)
    workspace.release_freed()
    return step


def _lowers(terms: dict[str, float], before: dict[str, float]) -> bool:
    """Whether the terms sum to no more than before (up to rounding)."""
    now, then = sum(terms.values()), sum(before.values())
    return now <= then + 1e-12 * abs(then)


def same_element(x: Element, y: Element) -> bool:
    """Whether two elements are equal (permutations: the same order)."""
    if isinstance(x, Permutation) and isinstance(y, Permutation):
        return torch.equal(x.perm, y.perm)
    tx, ty = x.tensors(), y.tensors()
    return tx.keys() == ty.keys() and all(torch.equal(tx[k], ty[k]) for k in tx)


def solved_in_order(pool: ThreadPoolExecutor, depth: int, prob: Problem,
                    cache: ResidualCache | None, due: list[str], el: dict[str, Element],
                    bt_all: StateDict) -> Iterator[UnitStep]:
    """The ``due`` units solved on the pool, yielded in order, at most ``depth`` in flight
    (each holds an n x n cost while it runs; depth 1: each sees the steps taken before)."""
    pending: list[Future] = []
    for unit in due:
        pending.append(pool.submit(_solve_unit_released, prob, cache, unit, el, bt_all))
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
    n = max(prob.groups[u].n for u in prob.units)
    fit = max(1, UNITS_IN_FLIGHT_BYTES // (12 * n * n) - 1)
    workers = max(1, min(threads, fit))
    return workers, workers + 1


def _worker_start() -> None:
    """A unit worker: single-threaded, keeping its n x n buffers from one unit to the next."""
    torch.set_num_threads(1)
    workspace.enable()


class Workers:
    """The pool that solves units: several at once, one per core, each single-threaded (an
    assignment is single-threaded anyway, and one product per core uses the cores as well
    as one product on all of them). A context manager; it restores the thread count."""

    def __init__(self, prob: Problem) -> None:
        self.threads = torch.get_num_threads()
        workers, self.depth = unit_workers(prob, self.threads)
        self.pool = ThreadPoolExecutor(max_workers=workers, initializer=_worker_start)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(cancel_futures=True)
        # (a worker's set_num_threads also sets the default of threads started later)
        torch.set_num_threads(self.threads)


class Sweeps:
    """Which units an iteration solves, and when the descent has converged.

    Permutations settle after a few iterations while the residual map keeps improving: a
    unit whose assignment did not change is solved again only every third iteration. The run
    ends only after a full sweep (every unit solved) that changed almost nothing.
    """

    def __init__(self, units: list[str], tol: float) -> None:
        self.units, self.tol = units, tol
        self.quiet = dict.fromkeys(units, 0)  # iteration (1-based) since a unit is unchanged

    def due(self, it: int) -> list[str]:
        return [u for u in self.units
                if self.quiet[u] == 0 or (it + 1 - self.quiet[u]) % 3 == 0]

    def solved(self, unit: str, same: bool, it: int) -> None:
        self.quiet[unit] = (self.quiet[unit] or it + 1) if same else 0

    def converged(self, start: float, row: dict) -> bool:
        """Whether the iteration of trace ``row``, which started at distance ``start``, ends
        the run (a small step after a partial sweep asks for a full one)."""
        if start - row["distance"] <= self.tol * abs(start):
            if row["units_solved"] == len(self.units) and row["units_changed"] == 0:
                return True
            self.quiet = dict.fromkeys(self.units, 0)
        return False


@dataclass
class Descent:
    """The descent's state: every element, B moved to them (``bt_all``; the residual cache
    may let it lag), the distance's terms, and what the residual step reads."""

    prob: Problem
    el: dict[str, Element]
    bt_all: StateDict
    terms: dict[str, float]
    cache: ResidualCache | None
    solo: Solo | None
    init_distance: float = 0.0
    scale: float = 0.0

    @classmethod
    def start(cls, prob: Problem, dtype: torch.dtype) -> Descent:
        """Every element the identity, but the residual map at its start; the tensors only
        the stream touches are folded into one constant (and their copies released)."""
        el: dict[str, Element] = {s: g.identity(dtype) for s, g in prob.spec.spaces.items()}
        solo = Solo.of(prob, prob.stream) if prob.stream is not None else None
        if solo is not None:
            el[prob.stream] = residual_start(prob, solo, dtype)
        fixed = solo.names if solo is not None else []
        prob.release(fixed)  # (their term is ⟨T, const⟩ from here on: freed before B moves)
        bt_all = prob.apply(el, set(), [n for n in prob.spec.axes if n not in fixed])
        cache = None if solo is None else ResidualCache(prob, prob.stream, el[prob.stream],
                                                        bt_all)
        terms = prob.terms(bt_all)
        if solo is not None:
            terms["<solo>"] = solo.term(el[prob.stream])
        d = cls(prob, el, bt_all, terms, cache, solo, scale=prob.scale())
        d.init_distance = d.distance()
        return d

    def distance(self) -> float:
        return sum(self.terms.values())

    def transform(self) -> Transform:
        return Transform(dict(self.el))

    def iterate(self, it: int, due: list[str], workers: Workers, sweeps: Sweeps) -> dict:
        """One iteration: every due unit given the others, then the residual map given them
        all. Returns the trace's row."""
        cpu: dict[str, float] = defaultdict(float)  # worker seconds per kind of unit
        changed, rejected, t0 = 0, 0, time.perf_counter()
        for step in solved_in_order(workers.pool, workers.depth, self.prob, self.cache, due,
                                    self.el, self.bt_all):
            self.take(step)
            changed += not step.same
            rejected += step.rejected
            sweeps.solved(step.unit, step.same, it)
            cpu[self.role(step.unit)] += step.seconds
        return self.finish_iteration(it, due, changed, rejected,
                                     time.perf_counter() - t0, cpu)

    def role(self, unit: str) -> str:
        """The kind of unit the trace counts it under (the spec's role: "mlp", "heads")."""
        return self.prob.spec.roles.get(unit, "permutation")

    def finish_iteration(self, it: int, due: list[str], changed: int, rejected: int,
                         units_wall: float, cpu: dict[str, float]) -> dict:
        """The residual step after the units (``due``: those solved), and the iteration's
        trace record."""
        wall = {"units": units_wall}  # wall seconds per phase
        residual_kept = False
        if self.cache is not None:
            t0 = time.perf_counter()
            residual_kept = not self.step_residual()
            wall["residual"] = time.perf_counter() - t0
        workspace.release_freed()
        distance = self.distance()
        solves: dict[str, int] = defaultdict(int)
        for unit in due:
            solves[self.role(unit)] += 1
        return {"iteration": it + 1, "distance": distance,
                "relative": relative(distance, self.scale),
                "units_solved": len(due), "units_changed": changed,
                "units_rejected": rejected, "residual_rejected": residual_kept,
                "seconds": {k: round(v, 4) for k, v in wall.items()},
                "unit_seconds": {k: round(v, 4) for k, v in cpu.items()},
                "unit_solves": dict(solves)}

    def take(self, step: UnitStep) -> None:
        """Take a unit's step (its inner maps may move when its assignment does not)."""
        self.el.update(step.new)
        self.bt_all.update(step.moved)
        self.terms.update(step.terms)
        if not step.same and self.cache is not None:
            self.cache.cross.update(step.cross)

    def step_residual(self) -> bool:
        """The residual map given all the others: D's exact minimiser (linearised where it
        acts twice on a tensor, as on circuit-form attention, so taken only if D does not
        rise). Returns whether it was taken."""
        assert self.cache is not None and self.solo is not None
        new = self.cache.solve(self.el, self.solo.const)
        terms, moved = self.cache.terms(new, self.el)  # (moves the fresh tensors)
        terms["<solo>"] = self.solo.term(new)
        before = sum(self.terms[n] for n in terms)
        if sum(terms.values()) > before + 1e-12 * abs(before):
            return False
        self.el[self.prob.stream] = new
        self.terms.update(terms)
        self.cache.moved(moved, new)
        return True


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
    if distributed.spread():  # (under torchrun: the units shared out among the ranks, the
        from glmc.matching import spread  # checks below made there; it builds on this module)

        descent = spread.start(a, b, opts, where)
    else:
        check_pair(a, b, where)
        if opts.fix_ones is None:
            opts = replace(opts, fix_ones=fixes_ones(a, b))
        workspace.release_freed()  # (what the caller freed before: loading, say)
        descent = Descent.start(Problem(a, b, opts), a.dtype)
    workspace.release_freed()
    sweeps = Sweeps(descent.prob.units, opts.tol)  # (inner spaces are solved with their heads)
    trace: list[dict] = []
    converged = False
    if on_iteration is not None:
        on_iteration(0, descent.transform())
    with Workers(descent.prob) as workers:
        for it in range(opts.max_iter):
            start = descent.distance()
            trace.append(descent.iterate(it, sweeps.due(it), workers, sweeps))
            if progress is not None:
                progress(it + 1, trace[-1]["relative"])
            if on_iteration is not None:
                on_iteration(it + 1, descent.transform())
            if sweeps.converged(start, trace[-1]):
                converged = True
                break
    return MatchResult(Transform(descent.el), trace, converged, descent.init_distance,
                       descent.scale)
