"""The alignment methods: one registry, read by the Python API and by every command.

A method takes two checked canonical models A and B (see :func:`glmc.api.prepare_pair`) and
the :class:`AlignOptions`, and returns B in A's coordinates: an :class:`Alignment` (B moved by
a transform, with the matching's details), B itself (``canonical``: no alignment), or a path
between the two (``none``: the stock weights averaged as loaded). The path is the straight
line λ·A + (1 − λ)·π(B) unless the method returns a path of its own.

    weight, weight-perm          weight matching (orthogonal / permutation residual map)
    activation                   activation matching (permutation symmetries only; data)
    learned, learned-perm        weight matching, then learned matching (data)
    none, canonical              no alignment (merge and barrier only)

A new method is a function and one :func:`register_method` line. Options are defined once, in
:class:`AlignOptions`, with the matchers' own defaults, and checked when it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from glmc.data import Dataset, Tokenizer
from glmc.defaults import CORRECTIONS
from glmc.errors import GlmcError
from glmc.evaluate import fixed_batches
from glmc.matching.activation import activation_matching
from glmc.matching.learned import LearnedMatchingOptions, LearnedResult, learned_matching
from glmc.matching.weight import (
    MatchResult,
    WeightMatchingOptions,
    centred_pair,
    weight_matching,
)
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform

_WM = WeightMatchingOptions()  # (the matchers' defaults, defined once there)

#: Training examples the data-driven steps read (activation matching, BatchNorm reset,
#: REPAIR): enough for stable per-unit statistics, in fixed batches of the train split.
STATISTICS_EXAMPLES = 2000

HEADS = ("inner", "circuit")
RESIDUALS = ("orthogonal", "permutation", "none")


@dataclass
class AlignOptions:
    """Every option an alignment method reads (each method uses what applies to it).

    Attributes:
        residual: group of the residual-stream map: ``"orthogonal"``, ``"permutation"`` (the
            paper's ablation) or ``"none"``; the ``-perm`` methods fix it to permutation.
        heads: ``"inner"`` (keep head_dim; heads assigned after aligning their inner bases)
            or ``"circuit"`` (both models rewritten with attention as QK/OV circuits first).
        max_iter, tol, weighting, bias_weight, unit_cost, inner, init: weight matching's
            options (see :class:`glmc.matching.options.WeightMatchingOptions`).
        token_counts: (vocab,) counts; vocabulary rows of unseen tokens do not count.
        data: the training data of data-driven methods (a loaded dataset, or a name or path
            that :func:`glmc.api.align` loads with the models' tokenizer and split seed).
        tokenizer, data_seed: how ``data`` is read (see :func:`glmc.api.learning_data`).
        learned: learned matching's options (its residual group follows ``residual``).
        seed: when set, learned matching's seed (data order and λ draws), over ``learned``'s.
        progress: callback(iteration, relative distance) of weight matching.
        learned_progress: callback(step, loss, midpoint barrier or None) of learned matching.
        stock: both models' stock weights as loaded (:class:`glmc.api.StockPair`), for
            ``none``; :func:`glmc.barrier.run_barrier` fills it in for Hugging Face folders.
        dtype: precision the models are aligned in by the barrier (evaluation is float32).
        correction: applied after interpolating (merge, barrier; see
            :mod:`glmc.correction`): ``"none"``, ``"reset"`` or ``"repair"``.
    """

    residual: str = "orthogonal"
    heads: str = "inner"
    max_iter: int = _WM.max_iter
    tol: float = _WM.tol
    weighting: str = _WM.weighting
    bias_weight: float = _WM.bias_weight
    unit_cost: str = _WM.unit_cost
    inner: str | None = None
    init: str = _WM.init
    token_counts: torch.Tensor | None = None
    data: str | Path | Dataset | None = None
    tokenizer: str | Tokenizer | None = None
    data_seed: int | None = None
    learned: LearnedMatchingOptions | None = None
    seed: int | None = None
    progress: Callable[[int, float], None] | None = None
    learned_progress: Callable[[int, float, float | None], None] | None = None
    stock: Any = None
    dtype: torch.dtype = torch.float32
    correction: str = "none"

    def __post_init__(self) -> None:
        for name, value, allowed in (("heads mode", self.heads, HEADS),
                                     ("residual group", self.residual, RESIDUALS),
                                     ("correction", self.correction, CORRECTIONS)):
            if value not in allowed:
                raise GlmcError(f"unknown {name} {value!r} ({' or '.join(allowed)})")

    def weight_matching(self, row_masks: dict | None = None) -> WeightMatchingOptions:
        return WeightMatchingOptions(
            residual=self.residual, max_iter=self.max_iter, tol=self.tol,
            weighting=self.weighting, bias_weight=self.bias_weight, unit_cost=self.unit_cost,
            inner=self.inner, init=self.init, row_masks=row_masks or {})

    def learned_matching(self) -> LearnedMatchingOptions:
        opts = replace(self.learned or LearnedMatchingOptions(), residual=self.residual)
        return opts if self.seed is None else replace(opts, seed=self.seed)


@dataclass
class Alignment:
    """B aligned to A: ``aligned`` = transform applied to ``b`` (same function as ``b``).

    ``settings``: what produced it (inputs, method, residual, heads), for the report.
    """

    a: CanonicalModel
    b: CanonicalModel
    aligned: CanonicalModel
    transform: Transform
    match: MatchResult | None
    learned: LearnedResult | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        """The report ``glmc align`` writes (without the certificate and timing)."""
        return {"command": "align", **self.settings,
                "matching": self.match.to_json() if self.match else None,
                "learned": self.learned.to_json() if self.learned else None}

    def save(self, path: str | Path, *, force: bool = False, stock: bool = True) -> dict:
        """Write B aligned as ``glmc align`` does (see :func:`glmc.api.save_alignment`)."""
        from glmc.api import save_alignment

        return save_alignment(self, path, force=force, stock=stock)


MethodFn = Callable[[CanonicalModel, CanonicalModel, AlignOptions], Any]


@dataclass(frozen=True)
class Method:
    """An alignment method (see the module's docstring).

    ``transform``: it moves B by a transform (``glmc align`` takes it); ``data``: it reads
    training data (``options.data``); ``stock``: it reads the models' stock weights
    (``options.stock``, Hugging Face folders); ``residual``: the residual group it fixes.
    """

    name: str
    fn: MethodFn
    description: str
    transform: bool = True
    data: bool = False
    stock: bool = False
    residual: str | None = None

    def __call__(self, a: CanonicalModel, b: CanonicalModel, options: AlignOptions) -> Any:
        if self.residual is not None:
            options = replace(options, residual=self.residual)
        return self.fn(a, b, options)


_METHODS: dict[str, Method] = {}
METHODS = MappingProxyType(_METHODS)
"""Name -> :class:`Method` of every alignment method."""


def register_method(name: str, fn: MethodFn, description: str, *, replace: bool = False,
                    **flags: Any) -> None:
    """Add an alignment method ``fn(a, b, options)`` under ``name`` (``flags``: see
    :class:`Method`)."""
    if name in _METHODS and not replace:
        raise ValueError(f"alignment method {name!r} is already registered")
    _METHODS[name] = Method(name, fn, description, **flags)


def get_method(name: str) -> Method:
    """The method called ``name``; GlmcError listing the available ones otherwise."""
    if name not in _METHODS:
        raise GlmcError(f"unknown alignment method {name!r} (available: "
                        f"{', '.join(_METHODS)})")
    return _METHODS[name]


# -- what the methods share ----------------------------------------------------------------


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
    return Alignment(a, b, b.transformed(t), t, match, learned)


@dataclass(frozen=True)
class CircuitPath:
    """``path`` with attention rewritten in circuit form at every point (exact)."""

    path: Any

    def model_at(self, lam: float) -> CanonicalModel:
        m = self.path.model_at(lam)
        return m.family.circuit_form(m)


# -- the methods ----------------------------------------------------------------------------


def _none(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Any:
    if a.family.canonical_is_stock:  # (the weights as loaded are the canonical ones)
        return b
    if o.stock is None:  # (run_barrier and merge refuse such inputs before any work)
        raise GlmcError("method none averages the stock weights as loaded: give Hugging Face "
                        "folders, or use canonical")
    return o.stock if o.heads == "inner" else CircuitPath(o.stock)


def _canonical(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> CanonicalModel:
    return b


def _weight(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Alignment:
    match = weight_matching(a, b, o.weight_matching(token_masks(a, o.token_counts)),
                            progress=o.progress)
    return _moved(a, b, match.transform, match)


def _activation(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Alignment:
    return _moved(a, b, activation_matching(a, b, statistics_batches(a, o.data)), None)


def _learned(a: CanonicalModel, b: CanonicalModel, o: AlignOptions) -> Alignment:
    wm = o.weight_matching(token_masks(a, o.token_counts))
    match = weight_matching(a, b, wm, progress=o.progress)
    result = learned_matching(a, b, o.data, match.transform, o.learned_matching(),
                              fix_ones=centred_pair(a, b), progress=o.learned_progress,
                              inner=wm.inner)
    return _moved(a, b, result.transform, match, result)


register_method("none", _none, "no alignment: vanilla averaging of the stock weights as "
                "loaded (LayerNorm γ and β averaged as they are; Hugging Face folders)",
                transform=False, stock=True)
register_method("canonical", _canonical, "averaging in canonical coordinates (after the exact "
                "RMSNorm rewrite), no alignment", transform=False)
register_method("weight", _weight, "weight matching, orthogonal residual map (data-free)")
register_method("weight-perm", _weight, "weight matching, permutation-only residual map (the "
                "paper's ablation)", residual="permutation")
register_method("activation", _activation,
                "activation matching: units paired by the correlation of their activations on "
                "the training split (permutation symmetries only)", data=True)
register_method("learned", _learned,
                "learned matching on the training split, from weight matching's solution",
                data=True)
register_method("learned-perm", _learned, "learned matching with a permutation-only residual "
                "map (the paper's ablation)", data=True, residual="permutation")
