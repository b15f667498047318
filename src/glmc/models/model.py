"""CanonicalModel: a canonical config plus its state dict, the value matchers work on."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from glmc.models.canonical import CanonicalConfig, CanonicalTransformer, build
from glmc.models.canonical_spec import canonical_spec
from glmc.models.rewrite import max_mean_along
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import StateDict, Transform


@dataclass
class CanonicalModel:
    """A canonical config, its state dict, and the files that travel with the model.

    ``files`` (name -> text: ``glmc_tokenizer.json``, ``generation_config.json``) are read
    beside the weights, kept by every rewrite and written into every output folder.
    """

    config: CanonicalConfig
    state: StateDict
    files: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def spec(self) -> SymmetrySpec:
        spec = canonical_spec(self.config)
        spec.validate({k: tuple(v.shape) for k, v in self.state.items()})
        return spec

    def module(self, dtype: torch.dtype | None = None) -> CanonicalTransformer:
        state = self.state if dtype is None else {k: v.to(dtype) for k, v in self.state.items()}
        return build(self.config, state)

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
        """The first residual writer that is not mean-zero, with its relative mean, or None.

        When there is none the stream never leaves the ones-complement, so every norm acts as
        a LayerNorm would. (The final norm's bias is added after the last norm: not a writer.)
        """
        spec = self.spec
        for s in (s for s, role in spec.roles.items() if role == "residual"):
            for n, axis, var in spec.occurrences(s):
                if var == "out" and n != "norm_f.bias":
                    dev = max_mean_along(self.state[n], axis)
                    if dev > tol:
                        return n, dev
        return None

    def n_params(self) -> int:
        return sum(v.numel() for v in self.state.values())
