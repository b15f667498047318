"""The importer interface and registry."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from glmc.errors import GlmcError
from glmc.model import CanonicalModel

StateDict = dict[str, torch.Tensor]


class NotRepresentable(Exception):
    """The canonical model has no exact equivalent in the stock architecture."""


class Importer:
    """Converts one stock architecture (a transformers class) to and from canonical form.

    Subclasses set ``model_types`` (transformers' ``config.model_type`` values) and implement
    ``stock_model``, ``to_canonical`` and ``to_stock``.
    """

    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]]

    def config_class(self) -> type:
        raise NotImplementedError

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


IMPORTERS: dict[str, Importer] = {}


def register(cls: type[Importer]) -> type[Importer]:
    inst = cls()
    for t in cls.model_types:
        IMPORTERS[t] = inst
    return cls


def importer_for(model_type: str, where: str = "") -> Importer:
    if model_type not in IMPORTERS:
        supported = ", ".join(sorted(IMPORTERS))
        raise GlmcError(
            f"{where}: unsupported architecture {model_type!r} (supported: {supported})"
        )
    return IMPORTERS[model_type]
