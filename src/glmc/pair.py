"""A pair of models: both in canonical form and checked to match (:func:`prepare_pair`),
and the stock weights of Hugging Face folders, the path of vanilla averaging (:class:`StockSet`
of N, :class:`StockPair` of two)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from glmc.data import HF_TOKENIZER_FILE, TOKENIZER_FILE
from glmc.errors import GlmcError
from glmc.families.importers import Importer
from glmc.io.folders import (
    LoadedModel,
    ModelLike,
    StoredState,
    canonical,
    load_model,
    name_of,
)
from glmc.matching.many import weighted_mean
from glmc.model import CanonicalModel, check_pair, fitted
from glmc.tensors import StateDict, interpolate


def _same_json(x: str, y: str) -> bool:
    try:
        return json.loads(x) == json.loads(y)
    except ValueError:
        return x == y


def shared_tokenizer(a: CanonicalModel, b: CanonicalModel,
                     where: str = "A vs B") -> dict[str, str]:
    """The tokenizer files both models were trained with (``glmc_tokenizer.json``, a
    checkpoint's ``tokenizer.json``; one of them may lack one), by name; a GlmcError when
    they hold different ones."""
    shared = {}
    for name in (TOKENIZER_FILE, HF_TOKENIZER_FILE):
        ta, tb = a.files.get(name), b.files.get(name)
        if ta is not None and tb is not None and not _same_json(ta, tb):
            raise GlmcError(f"{where}: the models hold different tokenizers ({name}); they "
                            "were not trained on the same token ids, so they are not "
                            "comparable")
        if ta is not None or tb is not None:
            shared[name] = ta if ta is not None else tb
    return shared


def prepare_pair(model_a: ModelLike, model_b: ModelLike,
                 heads: str = "inner") -> tuple[CanonicalModel, CanonicalModel]:
    """Both models in canonical form (attention as circuits for ``heads="circuit"``), checked
    to have the same parameters and shapes, all finite."""
    if heads not in ("inner", "circuit"):
        raise GlmcError(f"unknown heads mode {heads!r} (inner or circuit)")
    a, b = canonical(model_a), canonical(model_b)
    tokenizers = shared_tokenizer(a, b, f"{name_of(model_a, 'A')} vs {name_of(model_b, 'B')}")
    if tokenizers:  # (an output of either carries them)
        a, b = (m.with_files(tokenizers) for m in (a, b))
    b = fitted(a, b, f"{name_of(model_a, 'A')} vs {name_of(model_b, 'B')}")
    if heads == "circuit":
        a, b = (m.family.circuit_form(m) for m in (a, b))
    check_pair(a, b)
    return a, b


def stock_average(states: Sequence[Mapping[str, torch.Tensor]],
                  weights: Sequence[float]) -> StateDict:
    """Σ_k w_k θ_k tensor by tensor: two states as :func:`~glmc.tensors.interpolate` averages
    a pair (so that the N-model average of two is the pair's, bit for bit), more in float64
    sums (:func:`~glmc.matching.many.weighted_mean`; uniform weights: Σ_k θ_k / n, the mean
    rounded once)."""
    if len(states) == 2:
        return interpolate(states[0], states[1], weights[0])
    if len(set(weights)) == 1:
        return weighted_mean(states, [1.0] * len(states), total=len(states))
    return weighted_mean(states, weights)


@dataclass(frozen=True)
class StockSet:
    """Hugging Face models as loaded, before the canonical rewrite: the paper's vanilla
    average Σ_k w_k·stock_k (LayerNorm γ and β averaged as they are).

    Not linear in canonical coordinates (γ and β are folded into the readers after them), so
    an average is made in stock form and brought to canonical form by the importer, an
    exact rewrite: canonical(θ) computes θ's function.

    Attributes:
        importer, hf_config: the first model's; the averaged model's class and config.
        states: the stock state dicts (same names and shapes; a folder's read from its files
            as they are needed, see :class:`glmc.io.folders.StoredState`).
        files: what the averaged model carries (the first model's tokenizer and generation
            config).
        dtype: the name of the dtype the first model is stored in (an average is written in
            it); None: as its tensors are.
    """

    importer: Importer
    hf_config: Any
    states: list[Mapping[str, torch.Tensor]]
    files: dict[str, str] = field(default_factory=dict)
    dtype: str | None = None

    def state_at(self, weights: Sequence[float]) -> StateDict:
        """The stock state dict Σ_k w_k·stock_k (:func:`stock_average`)."""
        return stock_average(self.states, weights)

    def model_at(self, weights: Sequence[float]) -> CanonicalModel:
        """:meth:`state_at` in canonical form (same function), stored as the first model is."""
        model = self.importer.to_canonical(self.hf_config, self.state_at(weights))
        if self.dtype is not None:  # (read in float32, written in the first model's dtype)
            model.config.source["dtype"] = self.dtype
        return model.with_files(self.files)

    def pair(self, i: int, j: int) -> StockPair:
        """Models i and j (0-based): the line between them, model i at α = 1."""
        return StockPair(StockSet(self.importer, self.hf_config,
                                  [self.states[i], self.states[j]], self.files, self.dtype))


@dataclass(frozen=True)
class StockPair:
    """Two Hugging Face models as loaded: the path of the paper's vanilla average θ(α) =
    α·stock_A + (1 − α)·stock_B (α = 1 is A), an :class:`~glmc.evaluate.InterpolationPath`
    (see :class:`StockSet`, of the two)."""

    stock: StockSet

    @property
    def importer(self) -> Importer:
        return self.stock.importer

    @property
    def hf_config(self) -> Any:
        return self.stock.hf_config

    @property
    def a(self) -> Mapping[str, torch.Tensor]:
        return self.stock.states[0]

    @property
    def b(self) -> Mapping[str, torch.Tensor]:
        return self.stock.states[1]

    def state_at(self, alpha: float) -> StateDict:
        """The stock state dict α·stock_A + (1 − α)·stock_B."""
        return self.stock.state_at((alpha, 1.0 - alpha))

    def model_at(self, alpha: float) -> CanonicalModel:
        """:meth:`state_at` in canonical form (same function), stored as A is."""
        return self.stock.model_at((alpha, 1.0 - alpha))


#: Why ``none`` cannot average a model: it holds no stock weights.
_NO_STOCK = ("align method none averages the stock weights as loaded, but {what}; use "
             "canonical instead (averaging in canonical coordinates, after the exact RMSNorm "
             "rewrite)")


def stock_pair(model_a: ModelLike, model_b: ModelLike) -> StockPair:
    """The stock weights of two Hugging Face model folders (or LoadedModels of them), for the
    vanilla average (method ``none``); see :func:`stock_set`."""
    return StockPair(stock_set((model_a, model_b), ("A", "B")))


def stock_set(models: Sequence[ModelLike], who: Sequence[str] | None = None) -> StockSet:
    """The stock weights of Hugging Face model folders (or LoadedModels of them), for the
    vanilla average (method ``none``); ``who``: how messages name them (A and B: "model A",
    "in A"; default: model 1, model 2, ...).

    A set where some models tie their LM head to the embedding and others do not is
    averaged untied (a tied head made an explicit copy: the same model).

    Raises:
        GlmcError: an input that holds no stock weights (a glmc folder, a model in memory),
            naming it and pointing to ``canonical``; models of different architectures, or
            whose stock tensors differ in names or shapes (each against the first).
    """
    model_names = [f"model {w}" for w in who] if who is not None else None
    who = list(who) if who is not None else [f"model {i + 1}" for i in range(len(models))]
    loaded = []
    for model, name in zip(models, model_names or who, strict=True):
        if isinstance(model, (str, Path)):
            model = load_model(model)
        if not isinstance(model, LoadedModel):
            raise GlmcError(_NO_STOCK.format(what=f"{name} is a model in memory, in "
                                             "canonical form only"))
        if model.importer is None:
            raise GlmcError(_NO_STOCK.format(what=f"{model.path} is a glmc folder (canonical "
                                             "weights only)"))
        if model.stock_state is None:
            raise GlmcError(_NO_STOCK.format(what=f"{model.path} was loaded without its stock "
                                             "weights"))
        loaded.append(model)
    first = loaded[0]
    for m in loaded[1:]:
        if m.importer is not first.importer:
            raise GlmcError(f"{first.path} vs {m.path}: the models are of different "
                            f"architectures ({first.importer.name}, {m.importer.name})")
    stock = [(m.hf_config, m.stock_state) for m in loaded]
    tied = {getattr(c, "tie_word_embeddings", None) for c, _ in stock}
    if len(tied) > 1 or any(set(s) != set(stock[0][1]) for _, s in stock):
        stock = [m.importer.untied(c, s) for m, (c, s) in zip(loaded, stock, strict=True)]
    (c1, s1), w1 = stock[0], who[0]
    for m, (_, s), w in zip(loaded[1:], stock[1:], who[1:], strict=True):
        where = f"{first.path} vs {m.path}"
        only = sorted(set(s1) ^ set(s))
        if only:
            raise GlmcError(f"{where}: tensor {only[0]} is stored in "
                            f"{w1 if only[0] in s1 else w} only; the stock weights cannot be "
                            "averaged")
        for name in s1:
            shape_1, shape = _shape(s1, name), _shape(s, name)
            if shape_1 != shape:
                raise GlmcError(f"{where}: tensor {name}: shape {list(shape_1)} in {w1}, "
                                f"{list(shape)} in {w}")
    return StockSet(first.importer, c1, [s for _, s in stock], dict(first.canonical.files),
                    first.canonical.config.source.get("dtype"))


def _shape(state: Mapping[str, torch.Tensor], name: str) -> torch.Size:
    """A tensor's shape, from the headers when ``state`` reads its files on demand."""
    return (state.meta[name] if isinstance(state, StoredState) else state[name]).shape
