"""CanonicalModel: a family's canonical config plus its state dict, the value matchers work on.

The config's class names its family (``glmc.families``), which builds the module and gives
the symmetry spec; its ``task`` (``glmc.tasks``) says what the model reads and predicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import nn

from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import StateDict, Transform


@dataclass
class CanonicalModel:
    """A canonical config, its state dict, and the files that travel with the model.

    ``state`` holds every tensor of the module's state dict: parameters and the buffers that
    describe the function (a BatchNorm's running statistics). ``files`` (name -> text:
    ``glmc_tokenizer.json``, ``generation_config.json``) are read beside the weights, kept by
    every rewrite and written into every output folder.
    """

    config: Any
    state: StateDict
    files: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def family(self):  # -> glmc.families.Family (imported late: families import this module)
        from glmc.families import family_of

        return family_of(self.config)

    @property
    def task(self):  # -> glmc.tasks.Task
        from glmc.tasks import task_of

        return task_of(self.config)

    @cached_property
    def spec(self) -> SymmetrySpec:
        spec = self.family.spec(self.config)
        spec.validate({k: tuple(v.shape) for k, v in self.state.items()})
        return spec

    def module(self, dtype: torch.dtype | None = None) -> nn.Module:
        state = self.state if dtype is None else {k: v.to(dtype) for k, v in self.state.items()}
        return self.family.build(self.config, state)

    def with_state(self, state: StateDict) -> CanonicalModel:
        return CanonicalModel(self.config, state, self.files)

    def with_files(self, files: dict[str, str]) -> CanonicalModel:
        """The same model carrying ``files`` as well (they win over its own of that name)."""
        return CanonicalModel(self.config, self.state, {**self.files, **files})

    def transformed(self, transform: Transform) -> CanonicalModel:
        return self.with_state(transform.apply(self.spec, self.state))

    def to(self, dtype: torch.dtype) -> CanonicalModel:
        return self.with_state({k: v.to(dtype) for k, v in self.state.items()})

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.state.values())).dtype

    def uncentred_writer(self, tol: float = 1e-5) -> tuple[str, float] | None:
        """The first residual writer that is not mean-zero, with its relative mean, or None
        (None also for a family without a residual stream to centre)."""
        return self.family.uncentred_writer(self, tol)

    def n_params(self) -> int:
        return sum(v.numel() for v in self.state.values())
