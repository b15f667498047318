"""The importer interface: one stock architecture (a transformers class) to and from canonical
form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from glmc.tensors import StateDict

if TYPE_CHECKING:
    from glmc.model import CanonicalModel


class NotRepresentable(Exception):
    """The canonical model has no exact equivalent in the stock architecture."""


class Importer:
    """Converts one stock architecture (a transformers class) to and from canonical form.

    Subclasses implement ``stock_model``, ``to_canonical`` and ``to_stock`` (a Hugging Face
    architecture's names and key handling come from its table, read by
    ``glmc.families.transformer.hf.TableImporter``); a family's package declares which
    transformers ``config.model_type`` values each reads
    (:func:`glmc.families.registry.declare_importer`).
    """

    name: ClassVar[str]

    def config_class(self) -> type:
        raise NotImplementedError

    def check_config(self, raw: dict, where: str) -> None:
        """Refuse a stock config (``raw``, as read from ``where``) whose architecture the
        canonical form does not cover, in one line naming the field; before it is built."""

    def stock_model(self, hf_config: Any) -> nn.Module:
        """An untrained stock model built from ``hf_config`` (no download)."""
        raise NotImplementedError

    def optional_keys(self, hf_config: Any) -> tuple[str, ...]:
        """Tensors a checkpoint may omit (e.g. a head tied to the embedding)."""
        return ()

    def normalize_keys(self, state: StateDict) -> StateDict:
        """Map a checkpoint's keys onto the stock model's (e.g. add a missing prefix)."""
        return state

    def to_canonical(self, hf_config: Any, state: StateDict) -> CanonicalModel:
        raise NotImplementedError

    def untied(self, hf_config: Any, state: StateDict) -> tuple[Any, StateDict]:
        """The same model with every tensor stored on its own (a tied copy made explicit,
        the config saying so), so that it averages with an untied one; as is by default."""
        return hf_config, state

    def to_stock(self, model: CanonicalModel) -> tuple[Any, StateDict]:
        """(hf_config, stock state dict); raises NotRepresentable."""
        raise NotImplementedError

    def stock_logits(self, stock: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

