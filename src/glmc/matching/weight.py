"""Weight matching (data-free): minimise D(π) = Σ_t w_t·‖A_t − π(B)_t‖² by coordinate descent.

D is the distance of what the merge interpolates (:mod:`glmc.matching.problem`); π holds an
element for every space of the spec. Each iteration takes them in turn, each given the others:

1. every unit (a space with a step of its own: MLP units, heads, a convnet's channels): the
   cost its group's step maximises, made from the tensors the spec says it acts on
   (``problem.UNIT_STEPS``: D's own terms, or for heads what is left after aligning each
   pair's inner maps), the assignment on it (``steps.solve``), and the new element kept only
   if D falls (the cost need not be D itself);
2. then the residual (orthogonal) map: D's exact minimiser given the units, a Procrustes on
   the tensors' cross-correlations (:mod:`glmc.matching.residual`), kept if D falls;

until an iteration lowers D by almost nothing (``descent.Sweeps``). This module is that loop.
Where its work runs is the :class:`~glmc.matching.executors.Executor` it calls: the units one
after another, several at once on threads (given the residual map, a transformer's units
share no tensor), or shared out among torchrun's ranks (:class:`glmc.matching.spread.Ranks`),
with the same result bit for bit. The state and the trace are :mod:`glmc.matching.descent`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing, nullcontext

from glmc import distributed
from glmc.matching import descent, executors, spread, workspace
from glmc.matching.descent import Descent, MatchResult, Record, Sweeps, UnitStep, same_element
from glmc.matching.executors import Executor
from glmc.matching.problem import (
    UNIT_STEPS,
    Problem,
    WeightMatchingOptions,
    centred_pair,
    check_pair,
    fixes_ones,
)
from glmc.matching.residual import ResidualCache
from glmc.matching.steps import solve
from glmc.model import CanonicalModel
from glmc.symmetry.elements import Element
from glmc.symmetry.transform import Transform, apply_axes, unapply_axes
from glmc.tensors import StateDict

__all__ = ["MatchResult", "WeightMatchingOptions", "centred_pair", "check_pair", "fixes_ones",
           "solve_unit", "weight_matching"]


def weight_matching(a: CanonicalModel, b: CanonicalModel,
                    opts: WeightMatchingOptions | None = None, progress=None, where: str = "",
                    on_iteration: Callable[[int, Transform], None] | None = None
                    ) -> MatchResult:
    """Align B to A: the transform π with π(B) ≈ A, and D's trace. ``progress(iteration,
    relative D)`` after each iteration; ``where``: the pair's name in error messages;
    ``on_iteration(k, π after k iterations)`` from the start (k = 0) to the last."""
    opts = opts or WeightMatchingOptions()
    d = (spread.start if distributed.spread() else descent.start)(a, b, opts, where)
    sweeps = Sweeps(d.prob.units, opts.tol, opts.stop)  # (inner spaces go with their heads)
    trace: list[dict] = []
    if on_iteration is not None:
        on_iteration(0, d.transform())
    # (the residual cache's files, when it spills, removed however the descent ends)
    with executor(d) as run, closing(d.cache) if d.cache is not None else nullcontext():
        for it in range(opts.max_iter):
            start, record = d.distance(), Record(d, sweeps.due(it))
            for step in run.solve(record.due, d, solve_unit):  # each given the others
                d.take(step)
                sweeps.solved(step.unit, step.same, it)
                record.unit(step)
            record.units_done()
            trace.append(record.row(it, step_residual(d, run)))  # given every unit
            if progress is not None:
                progress(it + 1, trace[-1]["relative"])
            if on_iteration is not None:
                on_iteration(it + 1, d.transform())
            if sweeps.converged(start, trace[-1]):
                return MatchResult(d.transform(), trace, True, d.init_distance, d.scale)
    return MatchResult(d.transform(), trace, False, d.init_distance, d.scale)


def solve_unit(prob: Problem, cache: ResidualCache | None, unit: str,
               el: dict[str, Element], bt_all: StateDict) -> UnitStep:
    """``unit`` given every other element: its cost, its assignment, kept if D falls. It
    reads ``el`` and writes only its own tensors' entries of the cache and ``bt_all``
    (``cache.refresh``: brought up to the residual map), so units sharing no tensor may run
    at once."""
    t0, spec = time.perf_counter(), prob.spec
    spaces, own = {unit, *prob.inner_of.get(unit, [])}, prob.term_names(unit)  # (its tensors)
    names = sorted(own)
    if cache is not None:
        cache.refresh(names, el)
    bt = {n: unapply_axes(bt_all[n], spec.axes[n], {k: el[k] for k in spaces}) for n in names}
    group = prob.groups[unit]
    proposal = UNIT_STEPS[type(group)](prob, unit, el, bt)  # the cost, from the spec
    solution = solve(group, proposal.cost, el[unit], prob.dtype)  # the assignment
    proposal.cost = None  # (n x n: freed before the tensors are moved)
    # Both elements it may take, made now: the proposal (heads: every pair's statistics and
    # maps, n x n blocks) is freed before the tensors are read and moved.
    new = proposal.finish(solution)
    current = proposal.finish(el[unit]) if len(spaces) > 1 else None
    del proposal
    if prob.opts.hand_over:  # (the worker's n x n buffers too: the pair fills the memory)
        workspace.release()
    before = prob.terms({n: bt_all[n] for n in names}, own)

    def moved_to(new: dict[str, Element]) -> tuple[StateDict, dict[str, float]]:
        if len(spaces) == 1 and same_element(new[unit], el[unit]):  # (back: bt_all itself)
            return {n: bt_all[n] for n in names}, dict(before)
        moved = prob.moved((n, apply_axes(bt[n], spec.axes[n], new)) for n in names)
        return moved, prob.terms(moved, own)

    moved, terms = moved_to(new)
    rejected = not lowers(terms, before)  # (the cost is not D: the step may raise it)
    if rejected and current is not None:  # (the inner maps for the current heads, if they lower D)
        new = current
        moved, terms = moved_to(new)
    if not lowers(terms, before):
        return UnitStep(unit, names, True, {k: el[k] for k in spaces},
                        {n: bt_all[n] for n in names}, before, {}, time.perf_counter() - t0,
                        rejected=True)
    same = same_element(new[unit], el[unit])
    cross = ({} if cache is None or same else cache.permuted(moved, unit, el[unit], new[unit]))
    return UnitStep(unit, names, same, new, moved, terms, cross, time.perf_counter() - t0,
                    rejected=rejected)


def step_residual(d: Descent, run: Executor) -> bool | None:
    """The residual map given every unit: D's exact minimiser (linearised where it acts twice
    on a tensor, as on circuit-form attention, so kept only if D does not rise). Returns
    whether it was kept; None: the spec has no residual map to solve."""
    if d.cache is None:
        return None
    new, terms, moved = run.residual(d)
    if not lowers(terms, {n: d.terms[n] for n in terms}):
        return False
    d.take_residual(new, terms, moved)
    return True


def lowers(terms: dict[str, float], before: dict[str, float]) -> bool:
    """Whether the terms sum to no more than before (up to rounding)."""
    now, then = sum(terms.values()), sum(before.values())
    return now <= then + 1e-12 * abs(then)


def executor(d: Descent) -> Executor:
    """Where ``d``'s work runs: this process (its threads), or the ranks sharing it out."""
    here = executors.local(d.prob)
    return spread.Ranks(d, here) if isinstance(d, spread.SpreadDescent) else here
