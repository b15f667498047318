"""Weight matching spread across the ranks of a process group (torchrun): the result of one
process, bit for bit, with the units' work and the working set divided among the ranks.

Given the residual map the units (every space but the residual one: MLP units, heads) are
independent (see :mod:`glmc.matching.weight`), so each rank solves a share of them:
:func:`plan` splits the units into contiguous runs of about equal cost (their
cross-correlations' multiply-adds, :func:`unit_cost`), the same on every rank. A rank keeps
and moves only its units' tensors (A's weighted copies, B moved, the residual cache's
cross-correlations); rank 0 also reads the tensors only the stream touches (embeddings, the
head: their constant) and computes the residual map. An iteration:

1. each rank solves its due units on its own workers; every rank then takes every unit's new
   elements and terms (:func:`glmc.distributed.exchange`), and so holds the elements and the
   distance's terms of the single-process run;
2. the residual step: its sums (Σ C_n over the cached tensors, Σ A·B̃ᵀ over the fresh ones)
   are added across the ranks in the single process's order
   (:func:`glmc.distributed.ordered_sum`: the same sum, not an all-reduce's); rank 0 solves
   the Procrustes and hands the map on (:func:`glmc.distributed.from_root`); each rank
   computes its tensors' terms under it, and every rank adds them all in the single
   process's order to take or reject the step.

Every number that decides a step is computed on one rank and handed to the others, so the
ranks never disagree (on machines whose arithmetic differs too); a rank's failure stops them
all at the next exchange. The bits are those of one process whose products run on as many
threads as each rank's (torchrun's default: one per rank); the Procrustes, on rank 0, is the
part that does not shrink with more ranks. Units that share tensors (chained layers: MLPs,
convnets) are solved one after another: every rank then runs the single-process descent by
itself (the same result on each, no speed-up).

Loading is spread too (:func:`load_pair`, what ``glmc align`` does under torchrun): each rank
reads only its tensors of both folders (rank 0 also the stream's own tables), the others
being placeholders of their shapes (``load_model``'s ``only``), and the spectral start's Gram
sums are added across the ranks in the single process's order (:func:`_grams`). So a rank
holds about its share of the pair; rank 0 then writes B aligned from B's folder, part by
part (:mod:`glmc.io.moved`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch

from glmc import distributed
from glmc.errors import GlmcError
from glmc.io.folders import LoadedModel, load_model
from glmc.matching import workspace
from glmc.matching.descent import Descent, UnitStep
from glmc.matching.executors import ResidualProposal, Serial, UnitSolver
from glmc.matching.problem import Problem, WeightMatchingOptions, check_pair, fixes_ones
from glmc.matching.residual import ResidualCache, Solo, gram, gram_occurrences, residual_start
from glmc.model import CanonicalModel, fitted
from glmc.tensors import StateDict, axis_first

__all__ = ["Plan", "Ranks", "SpreadDescent", "load_pair", "local_tensors", "plan", "start",
           "unit_cost"]


def unit_cost(prob: Problem, unit: str, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """The multiply-adds of ``unit``'s cross-correlations: Σ over the (tensor, axis) that its
    spaces act on of the tensor's entries times the axis' length (k·f²·d for an MLP unit of
    f hidden units and k matrices over a stream of d; about 2·d³ for a layer's heads). The
    assignment, n³ at worst but far less in practice, adds n²."""
    seen: set[tuple[str, int]] = set()
    cost = prob.groups[unit].n ** 2
    for s in (unit, *prob.inner_of[unit]):
        for n, axis, _ in prob.spec.occurrences(s):
            if (n, axis) not in seen and n in shapes:
                seen.add((n, axis))
                cost += int(torch.Size(shapes[n]).numel()) * shapes[n][axis]
    return cost


def split(costs: list[int], world: int) -> list[int]:
    """The rank of each item: contiguous runs, the costliest run as cheap as it can be (the
    least bound whose greedy runs number at most ``world``)."""
    def runs(bound: int) -> list[int]:
        out, rank, load = [], 0, 0
        for c in costs:
            if load and load + c > bound:
                rank, load = rank + 1, 0
            out.append(rank)
            load += c
        return out

    lo, hi = max(costs, default=0), sum(costs)
    while lo < hi:
        mid = (lo + hi) // 2
        if runs(mid)[-1] < world:
            hi = mid
        else:
            lo = mid + 1
    return runs(lo) if costs else []


@dataclass(frozen=True)
class Plan:
    """Who does what, and the single process's orders of the residual step's sums (made
    from the spec and the shapes alone: the same on every rank)."""

    world: int
    unit_rank: dict[str, int]
    #: The rank holding each tensor (its unit's; rank 0 for a tensor no unit touches).
    tensor_rank: dict[str, int]
    names: list[str]  # B moved (``Descent.bt_all``): every tensor but the stream-only ones
    solo: list[str]  # the tensors only the stream touches (rank 0's)
    fresh: list[str]  # the residual cache's fresh tensors (``ResidualCache.fresh``)
    cached: list[str]  # its cached cross-correlations, in their order
    direct: list[tuple[str, int]]  # the (tensor, axis) of its direct term, in their order
    costs: dict[str, int]  # unit -> :func:`unit_cost`

    def local(self, rank: int) -> set[str]:
        """The tensors rank ``rank`` works on."""
        mine = {n for n, r in self.tensor_rank.items() if r == rank}
        return mine | set(self.solo) if rank == 0 else mine

    def loads(self) -> list[int]:
        """Each rank's share of the units' cost."""
        out = [0] * self.world
        for u, r in self.unit_rank.items():
            out[r] += self.costs[u]
        return out


def plan(prob: Problem, shapes: Mapping[str, tuple[int, ...]], world: int) -> Plan:
    """The units split across ``world`` ranks, and the residual step's orders (as
    :class:`~glmc.matching.residual.ResidualCache` makes them from the whole of B)."""
    spec, stream = prob.spec, prob.stream
    costs = {u: unit_cost(prob, u, shapes) for u in prob.units}
    unit_rank = dict(zip(prob.units, split([costs[u] for u in prob.units], world),
                         strict=True))
    occ = list(spec.occurrences(stream)) if stream is not None else []
    solo = [n for n in dict.fromkeys(n for n, _, _ in occ) if spec.spaces_of(n) == {stream}]
    names = [n for n in spec.axes if n not in solo]
    tensor_rank = dict.fromkeys(names, 0)
    for u in prob.units:
        for n in prob.term_names(u):
            if n in tensor_rank:
                tensor_rank[n] = unit_rank[u]
    counts: dict[str, int] = defaultdict(int)
    for n, _, _ in occ:
        if n in tensor_rank:
            counts[n] += 1
    fresh = sorted(n for n in names if n in prob.bundled or counts.get(n, 0) > 1)
    direct_names = {n for n in fresh if n in counts}
    cached = list(dict.fromkeys(n for n, _, _ in occ if counts.get(n) == 1 and n not in fresh))
    direct = [(n, axis) for n, axis, _ in occ if n in direct_names]
    return Plan(world, unit_rank, tensor_rank, names, solo, fresh, cached, direct, costs)


def local_tensors(a: CanonicalModel, b: CanonicalModel,
                  opts: WeightMatchingOptions) -> set[str] | None:
    """The tensors this rank works on (:meth:`Plan.local`), from the pair's structure and
    shapes alone (``a`` and ``b`` may be placeholders: ``load_model(..., only=())``); None
    when every rank needs every tensor (chained units, or a B of other shapes than A's)."""
    if fitted(a, b) is not b:
        return None
    prob = Problem(a, b, opts, only=set())  # (the structure: no tensor is read)
    if not (prob.independent and prob.units):
        return None
    shapes = {n: tuple(t.shape) for n, t in a.state.items()}
    world = torch.distributed.get_world_size() if distributed.spread() else 1
    return plan(prob, shapes, world).local(distributed.rank())


def load_pair(a: str | Path, b: str | Path, opts: WeightMatchingOptions,
              allow_pickle: bool = False, half: bool = False) -> tuple[LoadedModel, LoadedModel]:
    """Model folders A and B with only this rank's tensors read (:func:`local_tensors`; the
    others are placeholders of their shapes, ``load_model``'s ``only``), for weight
    matching across the ranks: a rank holds about its share of the pair (``half``: in
    bfloat16, ``load_model``'s). Its reading errors, like the matching's, stop every rank
    (rank 0 saying it)."""
    held: dict = {}

    def load() -> None:
        names = local_tensors(load_model(a, allow_pickle=allow_pickle, only=()).canonical,
                              load_model(b, allow_pickle=allow_pickle, only=()).canonical,
                              opts)
        held["pair"] = tuple(load_model(m, allow_pickle=allow_pickle, only=names, half=half)
                             for m in (a, b))

    distributed.exchange(load)  # (the models stay on their ranks: only errors are shared)
    return held["pair"]


def _fingerprint(a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions) -> tuple:
    """What every rank must agree on before matching: the pair's tensors (names, shapes,
    dtypes) and the options."""
    def tensors(m: CanonicalModel) -> tuple:
        return tuple((n, tuple(t.shape), str(t.dtype)) for n, t in m.state.items())

    options = tuple((f.name, getattr(opts, f.name)) for f in fields(opts)
                    if f.name != "row_masks")
    masks = tuple((n, axis, int(mask.sum())) for n, (axis, mask) in opts.row_masks.items())
    return tensors(a), tensors(b), options, masks


def start(a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions,
          where: str = "") -> Descent:
    """The descent of :func:`~glmc.matching.weight.weight_matching` on this rank: spread
    (:class:`SpreadDescent`) when the units are independent, else the single-process one.
    Its checks first (``check_pair``; every rank holds the same pair and options), their
    errors, like every step's, raised on every rank at once (rank 0 saying it)."""
    held: dict = {}

    def checked() -> tuple:
        check_pair(a, b, where)
        # (each rank sees its own tensors' writers: the stream is centred when all are)
        return _fingerprint(a, b, opts), opts.fix_ones is None and fixes_ones(a, b)

    checks = distributed.exchange(checked)
    prints = [p for p, _ in checks]
    held["opts"] = opts if opts.fix_ones is not None else replace(
        opts, fix_ones=all(f for _, f in checks))
    differ = [r for r, p in enumerate(prints) if p != prints[0]]
    if differ:
        error = GlmcError(f"weight matching across ranks: rank {differ[0]} holds another "
                          "pair of models or other options than rank 0 (every rank must load "
                          "the same A and B and take the same options)")
        if not distributed.is_main():
            error.reported_elsewhere = True  # type: ignore[attr-defined]
        raise error
    workspace.release_freed()  # (what the caller freed before: loading, say)
    shapes = {n: tuple(t.shape) for n, t in a.state.items()}
    me, world = distributed.rank(), torch.distributed.get_world_size()
    made: list[Plan] = []

    def local(prob: Problem) -> list[str]:
        if not (prob.independent and prob.units):
            return prob.names
        made.append(plan(prob, shapes, world))
        return sorted(made[0].local(me))

    def problem() -> None:
        held["prob"] = prob = Problem(a, b, held["opts"], local=local)
        if not made:  # (chained units: every rank descends alone)
            held["descent"] = Descent.start(prob, prob.dtype)

    distributed.exchange(problem)
    d = held["descent"] if not made else SpreadDescent.begin(held["prob"], made[0],
                                                             held["prob"].dtype)
    workspace.release_freed()
    return d


def _grams(prob: Problem, plan: Plan) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The spectral start's Gram sums (``residual.grams``), each occurrence's Gram made on
    the rank holding its tensor and added in the single process's order: on rank 0 (None,
    None elsewhere)."""
    space = prob.stream
    assert space is not None
    order = [(key, plan.tensor_rank.get(key[0], 0)) for key in gram_occurrences(prob, space)]
    d = prob.spec.spaces[space].size
    return tuple(distributed.ordered_sum(order, lambda key, s=s: gram(s, key), (d, d),
                                         prob.dtype)
                 for s in (prob.A, prob.B))  # type: ignore[return-value]


def _occurrence_cross(prob: Problem, bt_all: StateDict, key: tuple[str, int]) -> torch.Tensor:
    """One occurrence's part of the residual cache's direct term (``residual_cross``)."""
    n, axis = key
    return (axis_first(prob.A[n], axis) @ axis_first(bt_all[n], axis).T).double()


@dataclass
class SpreadDescent(Descent):
    """:class:`~glmc.matching.descent.Descent` on one rank of several: ``bt_all`` and the
    residual cache hold this rank's tensors, ``solo`` is rank 0's; the elements and the
    terms are every unit's, as in one process."""

    plan: Plan | None = None
    rank: int = 0

    @classmethod
    def begin(cls, prob: Problem, plan: Plan, dtype: torch.dtype) -> SpreadDescent:
        """:meth:`Descent.start` across the ranks: rank 0 makes the residual map's start,
        each rank moves its tensors to it, and the terms and norms are pooled."""
        me = distributed.rank()
        el = {s: g.identity(dtype) for s, g in prob.spec.spaces.items()}
        solo: list[Solo] = []  # (rank 0's)
        if prob.stream is not None:
            summed = _grams(prob, plan) if prob.opts.init == "spectral" else None

            def root():
                solo.append(Solo.of(prob, prob.stream))
                return residual_start(prob, solo[0], dtype, summed)

            el[prob.stream] = distributed.from_root(root)
        prob.release(plan.solo)  # (their term is ⟨T, const⟩ from here on: rank 0's)
        mine = [n for n in plan.names if plan.tensor_rank[n] == me]
        held: dict = {}

        def local():
            held["bt"] = bt_all = prob.apply(el, set(), mine)
            held["cache"] = cache = (None if prob.stream is None else
                                     ResidualCache(prob, prob.stream, el[prob.stream], bt_all))
            if cache is not None:  # (the plan's orders are the cache's, restricted)
                assert cache.fresh == [n for n in plan.fresh if n in bt_all]
                assert list(cache.axis) == [n for n in plan.cached if n in bt_all]
                assert set(cache.direct) == {n for n, _ in plan.direct if n in bt_all}
            terms = prob.terms(bt_all)
            if solo:
                terms["<solo>"] = solo[0].term(el[prob.stream])
            return terms, prob.sq_a, prob.sq_b

        parts = distributed.exchange(local)
        pooled = [{k: v for p in parts for k, v in p[i].items()} for i in range(3)]
        terms = {n: pooled[0][n] for n in plan.names}
        if prob.stream is not None:
            terms["<solo>"] = pooled[0]["<solo>"]
        prob.sq_a = {n: pooled[1][n] for n in prob.names}  # (in the order they are summed)
        prob.sq_b = {n: pooled[2][n] for n in prob.names}
        if prob.opts.hand_over:  # (the models handed over: this rank reads no other tensor)
            keep = plan.local(me)
            for n in prob.names:
                if n not in keep:
                    prob.A.drop(n)
                    prob.B.drop(n)
        d = cls(prob, el, held["bt"], terms, held["cache"], solo[0] if solo else None,
                scale=prob.scale(), plan=plan, rank=me)
        d.init_distance = d.distance()
        return d


class Ranks:
    """The :class:`~glmc.matching.executors.Executor` of a descent spread across the ranks:
    each rank solves its share of the units on its own executor (``local``), and the ranks
    exchange their steps and make the residual map's sums together (see the module's
    docstring)."""

    def __init__(self, d: SpreadDescent, local: Serial) -> None:
        assert d.plan is not None
        self.plan, self.rank, self.local = d.plan, d.rank, local

    def __enter__(self) -> Ranks:
        self.local.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.local.__exit__(*exc)

    def solve(self, due: list[str], d: Descent, step: UnitSolver) -> Iterator[UnitStep]:
        """Every due unit's step, in order: this rank's solved and taken here (their tensors
        replace the old ones at once), every other's as its rank hands it on (its elements
        and terms: the tensors stay there)."""
        mine: dict[str, UnitStep] = {}

        def local() -> list[UnitStep]:
            for s in self.local.solve([u for u in due if self.plan.unit_rank[u] == self.rank],
                                      d, step):
                d.take(s)
                mine[s.unit] = s.shared()
            return list(mine.values())

        theirs = {s.unit: s for part in distributed.exchange(local) for s in part}
        for unit in due:
            yield mine[unit] if unit in mine else theirs[unit]

    def residual(self, d: Descent) -> ResidualProposal:
        """:meth:`Serial.residual` across the ranks: the sums added in the single
        process's order, the Procrustes on rank 0, each rank's terms pooled in order."""
        assert d.cache is not None
        prob, cache, plan, el = d.prob, d.cache, self.plan, d.el
        space = prob.stream
        assert space is not None
        t = el[space]
        size = prob.spec.spaces[space].size
        distributed.exchange(lambda: cache.refresh(cache.fresh, el))
        const = d.solo.const if d.solo is not None else None
        m = distributed.ordered_sum(
            [("<const>", 0)] + [(n, plan.tensor_rank[n]) for n in plan.cached],
            lambda k: const if k == "<const>" else cache.cross[k], (size, size))  # type: ignore
        c = distributed.ordered_sum(
            [(key, plan.tensor_rank[key[0]]) for key in plan.direct],
            lambda key: _occurrence_cross(prob, cache.bt_all, key), (size, size))  # type: ignore

        def root():
            total = m
            if plan.direct:  # (quadratic terms are linearised at T)
                total = total + c @ t.matrix(torch.float64)
            return prob.solve_stream(total, t)

        new = distributed.from_root(root)
        held: dict = {}

        def local() -> dict[str, float]:
            terms, held["moved"] = cache.terms(new, el)
            if d.solo is not None:
                terms["<solo>"] = d.solo.term(new)
            return terms

        pooled = {k: v for part in distributed.exchange(local) for k, v in part.items()}
        return new, {n: pooled[n] for n in [*plan.fresh, *plan.cached, "<solo>"]}, held["moved"]
