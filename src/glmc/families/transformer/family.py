"""The transformer family: what the rest of glmc asks of the canonical transformer (its
module, spec, probes, circuit form, token rows and whether its stream is centred)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from glmc.families.base import Family, Probe
from glmc.families.transformer.circuit import to_circuit
from glmc.families.transformer.model import CanonicalConfig, build
from glmc.families.transformer.rewrite import max_mean_along
from glmc.families.transformer.spec import RES, canonical_spec
from glmc.families.transformer.widen import embed_into
from glmc.symmetry.spec import SymmetrySpec
from glmc.tensors import StateDict

if TYPE_CHECKING:
    from torch import nn

    from glmc.model import CanonicalModel


def transformer_probes(cfg: CanonicalConfig) -> list[Probe]:
    """Where each space shows on data, every tensor (B, T, ·) with the units last:

    - ``res``: the stream itself, the embedding's output and every block's (what the next
      block and the head read through their norms);
    - ``mlp.{i}``: the input of the MLP's down projection, the units after the activation
      (a gated MLP's act(gate(x))·fc(x));
    - ``heads.{i}`` (head form): the input of the attention's output projection, every query
      head's value-weighted sum (head_dim coordinates each, query heads of one key/value
      group side by side). Circuit-form heads have no such point: their OV circuit acts
      inside the attention.

    - an encoder's ``head`` (masked LM, untied): the LayerNorm's output the token predictions
      read; ``pool`` (classifier): the pooled units, before their tanh.

    None carries an affine: REPAIR does not apply."""
    probes = [Probe("embed", RES, axis=-1, stream=True)]
    if cfg.task == "masked_lm" and not cfg.tied_head:
        probes.append(Probe("head.norm", "head", axis=-1))
    if cfg.task == "sequence_classifier":
        probes.append(Probe("pool", "pool", activation="tanh", axis=-1))
    for i in range(cfg.n_layer):
        block = f"blocks.{i}"
        if cfg.attention == "heads":
            probes.append(Probe(f"{block}.attn.o", f"heads.{i}", point="input", axis=-1))
        probes.append(Probe(f"{block}.mlp.proj", f"mlp.{i}", point="input", axis=-1))
        probes.append(Probe(block, RES, axis=-1, stream=True))
    return probes


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
        added after the last norm: not a writer.) An encoder's stream is never centred: its
        LayerNorms stay, and its permutations need nothing of it."""
        if model.config.norm_position == "post":
            return None
        spec = model.spec
        for s in (s for s, role in spec.roles.items() if role == "residual"):
            for n, axis, var in spec.occurrences(s):
                # (a placeholder, not read here, is another process's to check)
                if var == "out" and n != "norm_f.bias" and not model.state[n].is_meta:
                    dev = max_mean_along(model.state[n], axis)
                    if dev > tol:
                        return n, dev
        return None

    def probes(self, config: CanonicalConfig) -> list[Probe]:
        return transformer_probes(config)

    def circuit_form(self, model: CanonicalModel) -> CanonicalModel:
        return to_circuit(model)

    def embed_into(self, model: CanonicalModel, config: CanonicalConfig,
                   where: str = "") -> CanonicalModel:
        return embed_into(model, config, where)

    def token_rows(self, config: Any) -> dict[str, int]:
        rows = {"embed.tok": 0} if config.task != "image_classifier" else {}
        return rows | ({"head.weight": 0} if config.task in ("causal_lm", "masked_lm") else {})

