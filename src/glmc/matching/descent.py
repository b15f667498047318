"""Weight matching's state and bookkeeping: the elements and B moved to them (:class:`Descent`),
one unit's step (:class:`UnitStep`), which units are due (:class:`Sweeps`), the trace's record
of an iteration (:class:`Record`) and the result (:class:`MatchResult`).

The loop that drives them is :func:`glmc.matching.weight.weight_matching`.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from glmc.matching import workspace
from glmc.matching.problem import (
    Problem,
    WeightMatchingOptions,
    check_pair,
    fixes_ones,
    relative,
)
from glmc.matching.residual import ResidualCache, Solo, residual_start
from glmc.model import CanonicalModel
from glmc.symmetry.elements import Element, Permutation
from glmc.symmetry.transform import Transform
from glmc.tensors import StateDict

__all__ = ["Descent", "MatchResult", "Record", "Sweeps", "UnitStep", "same_element", "start"]


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
    #: The iteration (1-based) whose transform this is, when not the last: the one with the
    #: lowest validation loss (weight matching with data), and each iterate's loss.
    chosen: int | None = None
    validation: dict[int, float] | None = None

    @property
    def distance(self) -> float:
        """D of the transform (the chosen iterate's, else the last's)."""
        if not self.trace:
            return self.init_distance
        return self.trace[(self.chosen or len(self.trace)) - 1]["distance"]

    @property
    def relative(self) -> float:
        return relative(self.distance, self.scale)

    def to_json(self) -> dict:
        return {"iterations": len(self.trace), "converged": self.converged,
                "init_distance": self.init_distance,
                "init_relative": relative(self.init_distance, self.scale),
                "distance": self.distance, "relative": self.relative, "scale": self.scale,
                "trace": self.trace} | ({} if self.validation is None else {
                    "chosen_iteration": self.chosen,
                    "validation_loss": {str(k): v for k, v in self.validation.items()}})


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

    def shared(self) -> UnitStep:
        """The step without its tensors (what a rank hands the others: its elements and
        terms; the tensors stay with the rank that holds them)."""
        return replace(self, moved={}, cross={})


def same_element(x: Element, y: Element) -> bool:
    """Whether two elements are equal (permutations: the same order)."""
    if isinstance(x, Permutation) and isinstance(y, Permutation):
        return torch.equal(x.perm, y.perm)
    tx, ty = x.tensors(), y.tensors()
    return tx.keys() == ty.keys() and all(torch.equal(tx[k], ty[k]) for k in tx)


class Sweeps:
    """Which units an iteration solves, and when the descent has converged.

    Permutations settle after a few iterations while the residual map keeps improving: a
    unit whose assignment did not change is solved again only every third iteration. The run
    ends at the first full sweep (every unit solved) that lowers D by less than ``tol``
    (relative; ``stop="objective"``), or (``"fixed-point"``) at the first such sweep that
    changed no assignment either. A small step after a partial sweep asks for a full one.
    """

    def __init__(self, units: list[str], tol: float, stop: str = "objective") -> None:
        self.units, self.tol, self.stop = units, tol, stop
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
            if row["units_solved"] == len(self.units) and (self.stop == "objective"
                                                           or row["units_changed"] == 0):
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
        el: dict[str, Element] = {s: g.identity(dtype).to(device=prob.device)
                                  for s, g in prob.spec.spaces.items()}
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
        """π as it stands, on the host (the elements in the models' dtype)."""
        return Transform(dict(self.el)).to("cpu")

    def role(self, unit: str) -> str:
        """The kind of unit the trace counts it under (the spec's role: "mlp", "heads")."""
        return self.prob.spec.roles.get(unit, "permutation")

    def take(self, step: UnitStep) -> None:
        """Take a unit's step (its inner maps may move when its assignment does not)."""
        self.el.update(step.new)
        self.bt_all.update(step.moved)
        self.terms.update(step.terms)
        if not step.same and self.cache is not None:
            self.cache.cross.update(step.cross)

    def take_residual(self, t: Element, terms: dict[str, float], moved: StateDict) -> None:
        """Take the residual map ``t``: its terms, and the fresh tensors moved to it."""
        assert self.cache is not None and self.prob.stream is not None
        self.el[self.prob.stream] = t
        self.terms.update(terms)
        self.cache.moved(moved, t)


def start(a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions,
          where: str = "") -> Descent:
    """The descent's start in one process: the pair checked (``where`` names it), every
    element at its start and B moved to them (:meth:`Descent.start`)."""
    check_pair(a, b, where)
    if opts.fix_ones is None:
        opts = replace(opts, fix_ones=fixes_ones(a, b))
    workspace.release_freed()  # (what the caller freed before: loading, say)
    prob = Problem(a, b, opts)
    d = Descent.start(prob, prob.dtype)
    workspace.release_freed()
    return d


class Record:
    """The trace's record of one iteration: the units solved (``due``), changed and
    rejected, whether the residual map was kept, and the seconds each phase took."""

    def __init__(self, d: Descent, due: list[str]) -> None:
        self.d, self.due = d, due
        self.changed = self.rejected = 0
        self.cpu: dict[str, float] = defaultdict(float)  # worker seconds per kind of unit
        self.t0 = time.perf_counter()
        self.units_wall = 0.0

    def unit(self, step: UnitStep) -> None:
        self.changed += not step.same
        self.rejected += step.rejected
        self.cpu[self.d.role(step.unit)] += step.seconds

    def units_done(self) -> None:
        now = time.perf_counter()
        self.units_wall, self.t0 = now - self.t0, now

    def row(self, it: int, residual_kept: bool | None) -> dict:
        """The trace's row of iteration ``it`` (0-based); ``residual_kept``: None when the
        spec has no residual map to solve."""
        wall = {"units": self.units_wall}  # wall seconds per phase
        if residual_kept is not None:
            wall["residual"] = time.perf_counter() - self.t0
        workspace.release_freed()
        distance = self.d.distance()
        solves: dict[str, int] = defaultdict(int)
        for unit in self.due:
            solves[self.d.role(unit)] += 1
        return {"iteration": it + 1, "distance": distance,
                "relative": relative(distance, self.d.scale),
                "units_solved": len(self.due), "units_changed": self.changed,
                "units_rejected": self.rejected, "residual_rejected": residual_kept is False,
                "seconds": {k: round(v, 4) for k, v in wall.items()},
                "unit_seconds": {k: round(v, 4) for k, v in self.cpu.items()},
                "unit_solves": dict(solves)}
