"""A pair of models: both in canonical form and checked to match (:func:`prepare_pair`),
and the stock weights of two Hugging Face folders, the path of vanilla averaging
(:class:`StockPair`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
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


@dataclass(frozen=True)
class StockPair:
    """Two Hugging Face models as loaded, before the canonical rewrite: the path of the
    paper's vanilla average θ(α) = α·stock_A + (1 − α)·stock_B (LayerNorm γ and β averaged as
    they are; α = 1 is A). An :class:`~glmc.evaluate.InterpolationPath`.

    Not linear in canonical coordinates (γ and β are folded into the readers after them), so
    every point is averaged in stock form and brought to canonical form by the importer, an
    exact rewrite: canonical(θ(α)) computes θ(α)'s function.

    Attributes:
        importer, hf_config: A's; the averaged model's class and config.
        a, b: the stock state dicts (same names and shapes; a folder's read from its files
            as they are needed, see :class:`glmc.io.folders.StoredState`).
        files: what the averaged model carries (A's tokenizer and generation config).
        dtype: the name of the dtype A is stored in (the average is written in it); None: as
            its tensors are.
    """

    importer: Importer
    hf_config: Any
    a: Mapping[str, torch.Tensor]
    b: Mapping[str, torch.Tensor]
    files: dict[str, str] = field(default_factory=dict)
    dtype: str | None = None

    def state_at(self, alpha: float) -> StateDict:
        """The stock state dict α·stock_A + (1 − α)·stock_B."""
        return interpolate(self.a, self.b, alpha)

    def model_at(self, alpha: float) -> CanonicalModel:
        """:meth:`state_at` in canonical form (same function), stored as A is."""
        model = self.importer.to_canonical(self.hf_config, self.state_at(alpha))
        if self.dtype is not None:  # (read in float32, written in A's dtype)
            model.config.source["dtype"] = self.dtype
        return model.with_files(self.files)


#: Why ``none`` cannot average a model: it holds no stock weights.
_NO_STOCK = ("align method none averages the stock weights as loaded, but {what}; use "
             "canonical instead (averaging in canonical coordinates, after the exact RMSNorm "
             "rewrite)")


def stock_pair(model_a: ModelLike, model_b: ModelLike) -> StockPair:
    """The stock weights of two Hugging Face model folders (or LoadedModels of them), for the
    vanilla average (method ``none``).

    A pair where one model ties its LM head to the embedding and the other does not is
    averaged untied (the tied head made an explicit copy: the same model).

    Raises:
        GlmcError: an input that holds no stock weights (a glmc folder, a model in memory),
            naming it and pointing to ``canonical``; models of different architectures, or
            whose stock tensors differ in names or shapes.
    """
    loaded = []
    for model, who in ((model_a, "A"), (model_b, "B")):
        if isinstance(model, (str, Path)):
            model = load_model(model)
        if not isinstance(model, LoadedModel):
            raise GlmcError(_NO_STOCK.format(what=f"model {who} is a model in memory, in "
                                             "canonical form only"))
        if model.importer is None:
            raise GlmcError(_NO_STOCK.format(what=f"{model.path} is a glmc folder (canonical "
                                             "weights only)"))
        if model.stock_state is None:
            raise GlmcError(_NO_STOCK.format(what=f"{model.path} was loaded without its stock "
                                             "weights"))
        loaded.append(model)
    la, lb = loaded
    where = f"{la.path} vs {lb.path}"
    if la.importer is not lb.importer:
        raise GlmcError(f"{where}: the models are of different architectures "
                        f"({la.importer.name}, {lb.importer.name})")
    (ca, sa), (cb, sb) = ((m.hf_config, m.stock_state) for m in loaded)
    tied = [getattr(c, "tie_word_embeddings", None) for c in (ca, cb)]
    if tied[0] != tied[1] or set(sa) != set(sb):  # (one ties its head, the other not)
        (ca, sa), (cb, sb) = la.importer.untied(ca, sa), lb.importer.untied(cb, sb)
    only = sorted(set(sa) ^ set(sb))
    if only:
        raise GlmcError(f"{where}: tensor {only[0]} is stored in "
                        f"{'A' if only[0] in sa else 'B'} only; the stock weights cannot be "
                        "averaged")
    for name in sa:
        shape_a, shape_b = _shape(sa, name), _shape(sb, name)
        if shape_a != shape_b:
            raise GlmcError(f"{where}: tensor {name}: shape {list(shape_a)} in A, "
                            f"{list(shape_b)} in B")
    return StockPair(la.importer, ca, sa, sb, dict(la.canonical.files),
                     la.canonical.config.source.get("dtype"))


def _shape(state: Mapping[str, torch.Tensor], name: str) -> torch.Size:
    """A tensor's shape, from the headers when ``state`` reads its files on demand."""
    return (state.meta[name] if isinstance(state, StoredState) else state[name]).shape
