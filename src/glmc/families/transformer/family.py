"""The transformer family: what the rest of glmc asks of the canonical transformer (its
module, spec, circuit form, token rows and whether its stream is centred)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glmc.families.base import Family
from glmc.families.transformer.circuit import to_circuit
from glmc.families.transformer.model import CanonicalConfig, build
from glmc.families.transformer.rewrite import max_mean_along
from glmc.families.transformer.spec import canonical_spec
from glmc.symmetry.spec import SymmetrySpec
from glmc.tensors import StateDict

if TYPE_CHECKING:
    from torch import nn

    from glmc.model import CanonicalModel


class TransformerFamily(Family):
    name = "transformer"
    config_class = CanonicalConfig

    def build(self, config: CanonicalConfig, state: StateDict | None = None) -> nn.Module:
        return build(config, state)

    def spec(self, config: CanonicalConfig) -> SymmetrySpec:
        return canonical_spec(config)

    def uncentred_writer(self, model: CanonicalModel, tol: float) -> tuple[str, float] | None:
        """When every residual writer is mean-zero the stream never leaves the
        ones-complement, so every norm acts as a LayerNorm would. (The final norm's bias is
        added after the last norm: not a writer.)"""
        spec = model.spec
        for s in (s for s, role in spec.roles.items() if role == "residual"):
            for n, axis, var in spec.occurrences(s):
                if var == "out" and n != "norm_f.bias":
                    dev = max_mean_along(model.state[n], axis)
                    if dev > tol:
                        return n, dev
        return None

    def circuit_form(self, model: CanonicalModel) -> CanonicalModel:
        return to_circuit(model)

    def token_rows(self, config: Any) -> dict[str, int]:
        return {"embed.tok": 0, "head.weight": 0} if config.task == "causal_lm" else {}

