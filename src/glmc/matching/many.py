"""Many models in one frame: weight matching of N models of one spec.

Two ways to a frame, both over the models' whole symmetry group (any family):

- ``star``: every model aligned to the first (N − 1 pairwise matchings);
- ``mergemany`` (Git Re-Basin's MergeMany): from the star alignment, each model in turn
  aligned to the mean of the others, as they stand in the frame, in rounds until the models
  settle (or ``max_rounds``).

The frame is the first model's own coordinates: its transform is the identity, so a merged
model is written back as the first model's stock class would be. Maps between two models
through the frame are consistent by construction (i → frame → j); pairwise matchings are
not, and :func:`cycle_error` measures by how much: the distance between model j moved into
i's coordinates directly and through the frame, relative to j's size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from glmc.errors import GlmcError
from glmc.matching.options import WeightMatchingOptions
from glmc.matching.weight import fixes_ones, weight_matching
from glmc.model import CanonicalModel, check_pair
from glmc.symmetry.transform import Transform
from glmc.tensors import StateDict

#: A round that changes the sum of the models' distances by at most this much of it: settled.
SETTLED = 1e-4


@dataclass
class Frame:
    """One transform per model, from its own coordinates into the frame (the first model's,
    whose transform is the identity), and how it was found.

    ``rounds``: per MergeMany round, each model's relative distance to the mean of the
    others after it moved (star: one round of each model's distance to the first; universe
    matching: at its start and at its end)."""

    method: str
    transforms: list[Transform]
    rounds: list[list[float]] = field(default_factory=list)
    converged: bool = True
    #: Universe matching: the objective after every iteration, over its start's magnitude
    #: (empty when its start was already stationary); None for a frame without a descent.
    trace: list[float] | None = None

    def moved(self, models: Sequence[CanonicalModel]) -> list[CanonicalModel]:
        """The models in the frame (each computes its own function; a narrower one's free
        entries take the first model's values)."""
        return [m.transformed(t, like=models[0])
                for m, t in zip(models, self.transforms, strict=True)]

    def to_json(self) -> dict:
        out = {"method": self.method, "rounds": len(self.rounds),
               "converged": self.converged,
               "relative_distances": [[round(d, 6) for d in r] for r in self.rounds]}
        if self.trace is not None:
            out["iterations"] = len(self.trace)
            out["objective_trace"] = [round(v, 6) for v in self.trace]
        return out


def weighted_mean(states: Sequence[StateDict], weights: Sequence[float],
                  total: float = 1.0) -> StateDict:
    """Σ_k w_k θ_k / ``total``, tensor by tensor (float64 sums, back in the first state's
    dtype; the uniform mean to the last bit as ``weights`` of 1 and ``total`` n)."""
    out = {}
    for name, first in states[0].items():
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for s, w in zip(states, weights, strict=True):
            acc += float(w) * s[name].double()
        out[name] = (acc / total if total != 1.0 else acc).to(first.dtype)
    return out


def mean_of_others(states: Sequence[StateDict], i: int) -> StateDict:
    """The uniform mean of every state but the i-th (what model i is aligned to)."""
    others = [s for j, s in enumerate(states) if j != i]
    return weighted_mean(others, [1.0 / len(others)] * len(others))


def frame_options(models: Sequence[CanonicalModel], opts: WeightMatchingOptions | None,
             ) -> WeightMatchingOptions:
    """``opts`` with ``fix_ones`` settled once for the whole set (so that every map keeps
    the all-ones direction where one pair needs it)."""
    opts = opts or WeightMatchingOptions()
    if opts.fix_ones is None:
        opts = replace(opts, fix_ones=any(fixes_ones(models[0], m) for m in models[1:]))
    return opts


def check_models(models: Sequence[CanonicalModel]) -> None:
    if len(models) < 2:
        raise GlmcError(f"a frame needs at least 2 models, got {len(models)}")
    for i, m in enumerate(models[1:], 2):
        check_pair(models[0], m, f"model 1 vs model {i}")


def star(models: Sequence[CanonicalModel], opts: WeightMatchingOptions | None = None,
         progress: Callable[[int, int], None] | None = None) -> Frame:
    """Every model aligned to the first by weight matching."""
    check_models(models)
    opts = frame_options(models, opts)
    ref = models[0]
    transforms, dists = [Transform.identity(ref.spec)], [0.0]
    for i, m in enumerate(models[1:], 1):
        r = weight_matching(ref, m, opts, where=f"model 1 vs model {i + 1}")
        transforms.append(r.transform)
        dists.append(r.relative)
        if progress is not None:
            progress(i, len(models) - 1)
    return Frame("star", transforms, [dists])


def merge_many(models: Sequence[CanonicalModel], opts: WeightMatchingOptions | None = None,
               max_rounds: int = 10, tol: float = SETTLED, seed: int = 0,
               progress: Callable[[int, int], None] | None = None) -> Frame:
    """MergeMany from the star alignment: in each round, the models in a random order
    (``seed``), each aligned to the mean of the others in the frame as they stand. Stops when
    a round changes the sum of the models' distances to their targets by at most ``tol`` of
    it (the models settled), else after ``max_rounds``."""
    frame = star(models, opts)
    opts = frame_options(models, opts)
    spec, n = models[0].spec, len(models)
    transforms = list(frame.transforms)
    moved = frame.moved(models)
    rounds: list[list[float]] = []
    g = torch.Generator().manual_seed(seed)
    converged = False
    for k in range(max_rounds):
        dists = [0.0] * n
        for i in torch.randperm(n, generator=g).tolist():
            target = models[0].with_state(mean_of_others([m.state for m in moved], i))
            r = weight_matching(target, models[i], opts, where=f"model {i + 1} vs the others")
            transforms[i], moved[i] = r.transform, models[i].transformed(r.transform, like=target)
            dists[i] = r.relative
        rounds.append(dists)
        if progress is not None:
            progress(k + 1, max_rounds)
        if k and abs(sum(rounds[-2]) - sum(dists)) <= tol * sum(rounds[-2]):
            converged = True
            break
    # Back into the first model's coordinates: T_i <- T_1⁻¹ ∘ T_i.
    back = transforms[0].inverse(spec)
    transforms = [Transform.identity(spec), *(back.compose(t, spec) for t in transforms[1:])]
    return Frame("mergemany", transforms, [frame.rounds[0], *rounds], converged)


def cycle_error(models: Sequence[CanonicalModel], maps: dict[tuple[int, int], Transform],
                frame: Frame) -> dict[str, float]:
    """How far pairwise maps are from the frame's: for each pair (i, j) in ``maps`` (the
    map that moves model j into model i's coordinates, e.g. weight matching of the pair),
    ‖W_ij(θ_j) − (T_i⁻¹ ∘ T_j)(θ_j)‖ / ‖θ_j‖ over every tensor; the mean and the largest."""
    spec = models[0].spec
    errors = []
    for (i, j), w in maps.items():
        via = frame.transforms[i].inverse(spec).compose(frame.transforms[j], spec)
        direct, through = models[j].transformed(w).state, models[j].transformed(via).state
        num = sum(float((direct[k].double() - through[k].double()).pow(2).sum())
                  for k in direct)
        den = sum(float(models[j].state[k].double().pow(2).sum()) for k in direct)
        errors.append((num / max(den, 1e-300)) ** 0.5)
    return {"mean": sum(errors) / len(errors), "max": max(errors)} if errors else {}
