"""The paper's two findings about the methods, measured on one pair (the demo reports both).

1. :func:`wm_iterations`: the barrier after k weight-matching iterations, k = 0 (the start)
   to the last, with an orthogonal and with a permutation-only residual map. The paper finds
   that the orthogonal map keeps lowering it while permutations saturate early.
2. :func:`learned_moves`: how far learned matching moves from weight matching's solution:
   the fraction of units (and heads) it reassigns per space and ‖O_learned − O_WM‖_F. The
   paper finds the permutations nearly unchanged and small corrections to O.

Both read a pair in canonical form and an :class:`~glmc.evaluate.Evaluator` over fixed test
batches (the same evaluation as the barrier's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from glmc.evaluate import Evaluator
from glmc.matching.learned import LearnedResult
from glmc.matching.options import WeightMatchingOptions
from glmc.matching.weight import weight_matching
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform
from glmc.tensors import interpolate


@dataclass
class IterationStudy:
    """Weight matching of one residual group, iteration by iteration.

    ``midpoint_barrier[k]``: L(θ(0.5)) − (L(A) + L(B)) / 2 after k iterations (k = 0: the
    start), on the evaluator's batches; ``relative_distance[k]``: the matching's distance D
    relative to the models' scale after k ≥ 1 iterations (NaN at k = 0).
    """

    residual: str
    iterations: list[int] = field(default_factory=list)
    midpoint_barrier: list[float] = field(default_factory=list)
    relative_distance: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"residual": self.residual, "iterations": self.iterations,
                "midpoint_barrier": self.midpoint_barrier,
                "relative_distance": [None if math.isnan(x) else x
                                      for x in self.relative_distance]}


def wm_iterations(a: CanonicalModel, b: CanonicalModel, evaluator: Evaluator,
                  residuals: tuple[str, ...] = ("orthogonal", "permutation"),
                  max_iter: int = WeightMatchingOptions.max_iter) -> dict[str, IterationStudy]:
    """The midpoint barrier after every iteration of weight matching, per residual group
    (each run for exactly ``max_iter`` iterations: no early stop)."""
    ends = (evaluator.evaluate(a.state).loss + evaluator.evaluate(b.state).loss) / 2
    out = {}
    for residual in residuals:
        study = IterationStudy(residual)
        snapshots: list[tuple[int, Transform]] = []
        opts = WeightMatchingOptions(residual=residual, max_iter=max_iter, tol=-math.inf)
        match = weight_matching(a, b, opts, on_iteration=lambda k, t, into=snapshots:
                                into.append((k, t)))
        rel = [math.nan] + [row["relative"] for row in match.trace]
        for (k, t), r in zip(snapshots, rel, strict=True):
            bt = b.transformed(t, like=a).state
            mid = interpolate(a.state, bt, 0.5)
            study.iterations.append(k)
            study.midpoint_barrier.append(evaluator.evaluate(mid).loss - ends)
            study.relative_distance.append(r)
        out[residual] = study
    return out


def learned_moves(result: LearnedResult, spec_roles: dict[str, str]) -> dict[str, Any]:
    """How far learned matching moved from its start, by the roles of the spaces:
    ``{"reassigned": {space: fraction}, "residual_frobenius": ‖O − O₀‖_F,
    "residual_relative": ‖O − O₀‖_F / ‖O₀‖_F, "inner_relative": {space: ‖M − M₀‖/‖M₀‖}}``."""
    moves: dict[str, Any] = {"reassigned": {}, "inner_relative": {}}
    for space, d in result.distance.items():
        role = spec_roles.get(space)
        if "fraction" in d:
            moves["reassigned"][space] = d["fraction"]
        elif role == "residual" and "frobenius" in d:
            size = math.sqrt(len(result.transform.elements[space].matrix()))
            moves["residual_frobenius"] = d["frobenius"]
            moves["residual_relative"] = d["frobenius"] / size
        elif "relative" in d:
            moves["inner_relative"][space] = d["relative"]
    return moves
