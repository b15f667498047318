"""The Python API: align, merge and interpolate models in a notebook.

>>> import glmc
>>> a, b = glmc.load("runs/gpt-a"), glmc.load("runs/gpt-b")
>>> result = glmc.align(a, b)                      # weight matching, orthogonal residual
>>> merged, alignment = glmc.merge(a, b, alpha=0.5, align_method="weight")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from glmc.errors import GlmcError
from glmc.io.folders import LoadedModel, load_model
from glmc.matching.learned import LearnedMatchingOptions, LearnedResult, learned_matching
from glmc.matching.weight import (
    MatchResult,
    WeightMatchingOptions,
    centred_pair,
    check_pair,
    weight_matching,
)
from glmc.models.circuit import to_circuit
from glmc.models.model import CanonicalModel
from glmc.symmetry.transform import StateDict, Transform

ModelLike = CanonicalModel | LoadedModel | str | Path

METHODS = ("weight", "learned")


def load(path: str | Path, *, allow_pickle: bool = False) -> LoadedModel:
    """Read a model folder (Hugging Face or glmc) into canonical form."""
    return load_model(path, allow_pickle=allow_pickle)


def canonical(model: ModelLike) -> CanonicalModel:
    if isinstance(model, (str, Path)):
        model = load_model(model)
    return model.canonical if isinstance(model, LoadedModel) else model


def read_token_counts(path: str | Path, vocab_size: int) -> torch.Tensor:
    """Token counts (vocab_size,) from .json (list, or {id: count}), .npy or whitespace text."""
    p = Path(path)
    if not p.is_file():
        raise GlmcError(f"{p}: no such token-count file")
    try:
        if p.suffix == ".json":
            raw = json.loads(p.read_text())
            if isinstance(raw, dict):
                counts = np.zeros(vocab_size)
                for k, v in raw.items():
                    if not 0 <= int(k) < vocab_size:
                        raise ValueError(f"token id {k} outside the vocabulary")
                    counts[int(k)] = float(v)
            else:
                counts = np.asarray(raw, dtype=np.float64)
        elif p.suffix == ".npy":
            counts = np.load(p, allow_pickle=False).astype(np.float64)
        else:
            counts = np.asarray(p.read_text().split(), dtype=np.float64)
    except (ValueError, TypeError, IndexError, json.JSONDecodeError) as e:
        raise GlmcError(f"{p}: cannot read token counts ({e})") from None
    if counts.shape != (vocab_size,):
        raise GlmcError(f"{p}: {counts.size} token counts, the vocabulary has {vocab_size}")
    return torch.from_numpy(counts)


def prepare_pair(model_a: ModelLike, model_b: ModelLike,
                 heads: str = "inner") -> tuple[CanonicalModel, CanonicalModel]:
    """Both models in canonical form (attention as circuits for ``heads="circuit"``), checked
    to have the same parameters and shapes, all finite."""
    if heads not in ("inner", "circuit"):
        raise GlmcError(f"unknown heads mode {heads!r} (inner or circuit)")
    a, b = canonical(model_a), canonical(model_b)
    if heads == "circuit":
        a, b = to_circuit(a), to_circuit(b)
    check_pair(a, b)
    return a, b


@dataclass
class Alignment:
    """B aligned to A: ``aligned`` = transform applied to ``b`` (same function as ``b``)."""

    a: CanonicalModel
    b: CanonicalModel
    aligned: CanonicalModel
    transform: Transform
    match: MatchResult | None
    learned: LearnedResult | None = None


def align(
    model_a: ModelLike,
    model_b: ModelLike,
    *,
    method: str = "weight",
    residual: str = "orthogonal",
    heads: str = "inner",
    max_iter: int = 15,
    tol: float = 1e-5,
    weighting: str = "sqrt",
    token_counts: torch.Tensor | None = None,
    data=None,
    learned: LearnedMatchingOptions | None = None,
    progress=None,
    learned_progress=None,
) -> Alignment:
    """Align B to A modulo the symmetries of their spec.

    heads: "inner" keeps head_dim (heads assigned by circuit similarity, inner bases aligned);
    "circuit" rewrites both models with attention in circuit form first (exact; the result
    is no longer the stock architecture).
    token_counts: (vocab,) counts; vocabulary rows of unseen tokens do not count.
    method "learned": weight matching, then learned matching on ``data`` (a glmc.data
    dataset that fits the models) with options ``learned``; its residual group follows
    ``residual`` (permutation: the paper's permutation-only ablation).
    """
    if method not in METHODS:
        raise GlmcError(f"unknown alignment method {method!r} (available: {', '.join(METHODS)})")
    a, b = prepare_pair(model_a, model_b, heads)
    row_masks = {}
    if token_counts is not None:
        if a.config.task != "causal_lm":
            raise GlmcError("token counts apply to language models only")
        if token_counts.numel() != a.config.vocab_size:
            raise GlmcError(f"{token_counts.numel()} token counts for a vocabulary of "
                            f"{a.config.vocab_size}")
        mask = token_counts > 0
        row_masks = {"embed.tok": (0, mask), "head.weight": (0, mask)}
    opts = WeightMatchingOptions(residual=residual, max_iter=max_iter, tol=tol,
                                 weighting=weighting, row_masks=row_masks)
    match = weight_matching(a, b, opts, progress=progress)
    if method == "weight":
        return Alignment(a, b, b.transformed(match.transform), match.transform, match)
    if data is None:
        raise GlmcError("learned matching needs training data (--data)")
    options = replace(learned or LearnedMatchingOptions(), residual=residual)
    result = learned_matching(a, b, data, match.transform, options,
                              fix_ones=centred_pair(a, b), progress=learned_progress)
    return Alignment(a, b, b.transformed(result.transform), result.transform, match, result)


def interpolate(a: StateDict, b: StateDict, alpha: float) -> StateDict:
    """alpha·a + (1 − alpha)·b (alpha = 1 is a)."""
    return {k: torch.lerp(b[k], a[k], alpha) for k in a}


def merge(
    model_a: ModelLike,
    model_b: ModelLike,
    *,
    alpha: float = 0.5,
    align_method: str = "weight",
    **align_options,
) -> tuple[CanonicalModel, Alignment | None]:
    """The model alpha·A + (1 − alpha)·π(B); π from ``align_method`` ("none", "weight" or
    "learned", the last with ``data=``)."""
    if not 0.0 <= alpha <= 1.0:
        raise GlmcError(f"alpha must lie in [0, 1], got {alpha}")
    if align_method == "none":
        a, b = prepare_pair(model_a, model_b, align_options.get("heads", "inner"))
        return a.with_state(interpolate(a.state, b.state, alpha)), None
    al = align(model_a, model_b, method=align_method, **align_options)
    return al.a.with_state(interpolate(al.a.state, al.aligned.state, alpha)), al
