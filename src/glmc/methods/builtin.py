"""The built-in alignment methods (registered in :mod:`glmc.methods`) and what they share."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from glmc.data import Dataset, fixed_batches
from glmc.devices import matching_device
from glmc.errors import GlmcError
from glmc.matching.activation import activation_matching
from glmc.matching.learned import LearnedResult, best_by_validation, learned_matching
from glmc.matching.problem import stream_space
from glmc.matching.weight import MatchResult, centred_pair, weight_matching
from glmc.methods.alignment import Alignment
from glmc.methods.options import AlignOptions
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform

#: Training examples the data-driven steps read (activation matching, BatchNorm reset,
#: REPAIR): enough for stable per-unit statistics, in fixed batches of the train split.
STATISTICS_EXAMPLES = 2000


def statistics_batches(a: CanonicalModel, data: Dataset) -> list:
    """Fixed training batches (the first ``STATISTICS_EXAMPLES`` examples, or four batches
    of text windows) for per-unit statistics of models like ``a``."""
    context = a.task.context(a.config)
    size = a.task.default_batch_size(a.config, context)
    n = 4 if context is not None else max(1, -(-STATISTICS_EXAMPLES // size))
    return fixed_batches(data, "train", batch_size=size, context=context, max_batches=n)


def token_masks(a: CanonicalModel, counts: torch.Tensor | None) -> dict:
    """Row masks of the vocabulary-indexed tensors: rows of unseen tokens do not count."""
    if counts is None:
        return {}
    rows = a.family.token_rows(a.config)
    if not rows:
        raise GlmcError("token counts apply to language models only")
    if counts.numel() != a.config.vocab_size:
        raise GlmcError(f"{counts.numel()} token counts for a vocabulary of "
                        f"{a.config.vocab_size}")
    return {name: (axis, counts > 0) for name, axis in rows.items()}


def _moved(a: CanonicalModel, b: CanonicalModel, t: Transform, match: MatchResult | None,
           learned: LearnedResult | None = None) -> Alignment:
    return Alignment(a, b, b.transformed(t, like=a), t, match, learned)


@dataclass(frozen=True)
class CircuitPath:
    """``path`` with attention rewritten in circuit form at every point (exact)."""

    path: Any

    def model_at(self, lam: float) -> CanonicalModel:
        m = self.path.model_at(lam)
        return m.family.circuit_form(m)


# -- the methods ----------------------------------------------------------------------------


def no_alignment(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Any:
    if a.family.canonical_is_stock:  # (the weights as loaded are the canonical ones)
        return b
    if o.stock is None:  # (run_barrier and merge refuse such inputs before any work)
        raise GlmcError("method none averages the stock weights as loaded: give Hugging Face "
                        "folders, or use canonical")
    return o.stock if o.heads == "inner" else CircuitPath(o.stock)


def canonical_coordinates(a: CanonicalModel, b: CanonicalModel,
                          o: AlignOptions) -> CanonicalModel:
    return b


def activation_transform(a: CanonicalModel, b: CanonicalModel, o: AlignOptions,
                         variant: str = "post") -> Transform:
    """Activation matching's transform on the training data's statistics batches."""
    return activation_matching(a, b, statistics_batches(a, o.data), variant=variant,
                               residual=o.residual)


def activation_start(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Transform | None:
    """Activation matching's transform where weight matching starts from its residual map
    (:meth:`AlignOptions.starts_from_data`), else None."""
    return activation_transform(a, b, o) if o.starts_from_data() else None


def stream_of(a: CanonicalModel, t: Transform | None) -> Any:
    """``t``'s residual map (None without ``t`` or a residual stream)."""
    space = stream_space(a.spec)
    return None if t is None or space is None else t.elements[space]


def weight(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Alignment:
    start = stream_of(a, activation_start(a, b, o))
    wm = o.weight_matching(token_masks(a, o.token_counts), hand_over=o.hand_over,
                           stream_start=start)
    iterates: list[Transform] | None = [] if validates(o) else None
    keep = None if iterates is None else lambda k, t: iterates.append(t) if k else None
    match = weight_matching(a, b, wm, progress=o.progress, on_iteration=keep)
    if iterates is not None and len(iterates) > 1:
        match = validated(a, b, o, match, iterates)
    if o.hand_over:  # (what is left of the models: A's weighted copies, nothing of B's)
        a.state.clear()
        b.state.clear()
        return Alignment(a, b, None, match.transform, match)
    return _moved(a, b, match.transform, match)


def validates(o: AlignOptions) -> bool:
    """Whether ``weight`` returns the iterate of lowest validation loss (``o.select``):
    data given and loaded, and the models kept to evaluate."""
    return o.select == "validation" and isinstance(o.data, Dataset) and not o.hand_over


def validated(a: CanonicalModel, b: CanonicalModel, o: AlignOptions, match: MatchResult,
              iterates: list[Transform]) -> MatchResult:
    """``match`` with the iterate (``iterates[k - 1]``: after k iterations) of lowest
    validation loss at learned matching's evaluation λs, on its validation batches (the
    first of equals). D falls at every iteration while the barrier need not: from
    activation matching's start, the first iteration's was the lowest on every validation
    pair of the held-out suite (``benchmarks/wm_criterion.py --screen``)."""
    lo = o.learned_matching()
    chosen, losses = best_by_validation(a, b, o.data, {str(k): t for k, t in
                                                       enumerate(iterates, 1)}, lo,
                                        matching_device(lo.device))
    by_k = {int(k): v for k, v in losses.items()}
    best = next(k for k, t in enumerate(iterates, 1) if t is chosen)
    return replace(match, transform=chosen, chosen=best, validation=by_k)


def activation(a: CanonicalModel, b: CanonicalModel, o: AlignOptions,
               variant: str = "post") -> Alignment:
    return _moved(a, b, activation_transform(a, b, o, variant), None)


def activation_prepost(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Alignment:
    return activation(a, b, o, variant="prepost")


def learned(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Alignment:
    lo = o.learned_matching()
    act = activation_start(a, b, o)
    if act is None and lo.start != "weight":
        act = activation_transform(a, b, o)
    wm = o.weight_matching(token_masks(a, o.token_counts),
                           stream_start=stream_of(a, act) if o.starts_from_data() else None)
    match = weight_matching(a, b, wm, progress=o.progress) if lo.start != "activation" else None
    starts = {} if match is None else {"weight": match.transform}
    if lo.start != "weight":
        starts["activation"] = act
    result = learned_matching(a, b, o.data, starts, lo, fix_ones=centred_pair(a, b),
                              progress=o.learned_progress, inner=wm.inner)
    return _moved(a, b, result.transform, match, result)
