"""The convnet family: what the rest of glmc asks of Git Re-Basin's MLP, VGG-11/16 and
ResNet-20 (their module, spec, probes and plain state-dict layouts)."""

from __future__ import annotations

from typing import Any

from torch import nn

from glmc.families.base import Family, Probe
from glmc.families.convnet import ARCHS
from glmc.families.convnet.config import ConvNetConfig
from glmc.families.convnet.layouts import read_state_dict, to_torchvision
from glmc.families.convnet.modules import RESNET_BLOCKS, build, resnet_channels
from glmc.families.convnet.spec import convnet_spec
from glmc.model import CanonicalModel
from glmc.symmetry.spec import SymmetrySpec
from glmc.tensors import StateDict


def _probe(config: ConvNetConfig, conv: str, norm: str, space: str,
           activation: str | None = "relu") -> Probe:
    """Observe ``space`` after the norm, or after the conv/linear where there is none;
    the affine is whichever of them writes the observed output last; ``activation``: the
    ReLU that follows it (None where the output is first added to a residual stream)."""
    at = conv if config.norm == "none" else norm
    return Probe(at, space, (f"{at}.weight", f"{at}.bias"), activation)


def convnet_probes(config: ConvNetConfig) -> list[Probe]:
    """Where each space's units show: every layer's output (after its norm), and a ResNet
    stage's tied stream at every writer (the summands added to it: the stem, each block's
    second norm, the projection shortcut) and where it is the stream itself (the stem's and
    every block's output, after the addition and its ReLU: what the next block reads)."""
    if config.arch == "mlp":
        return [Probe(f"layers.{i}", f"layers.{i}", (f"layers.{i}.weight", f"layers.{i}.bias"),
                      "relu") for i in range(config.depth)]
    spec = convnet_spec(config)
    if config.arch != "resnet20":
        return [_probe(config, f"{s}.conv", f"{s}.norm", s) for s in spec.spaces]
    probes = [_probe(config, "stem.conv", "stem.norm", "stages.0")]
    streams = [Probe("stem", "stages.0", stream=True)]
    for s in range(len(resnet_channels(config))):
        stream = f"stages.{s}"
        for b in range(RESNET_BLOCKS):
            blk = f"{stream}.{b}"
            probes.append(_probe(config, f"{blk}.conv1", f"{blk}.norm1", f"{blk}.conv1"))
            probes.append(_probe(config, f"{blk}.conv2", f"{blk}.norm2", stream, None))
            if s > 0 and b == 0:
                probes.append(_probe(config, f"{blk}.shortcut.conv", f"{blk}.shortcut.norm",
                                     stream, None))
            streams.append(Probe(blk, stream, stream=True))
    return probes + streams


class ConvNetFamily(Family):
    name = "convnet"
    canonical_is_stock = True  # (trained, saved and loaded in canonical form)
    config_class = ConvNetConfig
    state_dict_archs = ARCHS
    export_layouts = ("torchvision",)

    def build(self, config: ConvNetConfig, state: StateDict | None = None) -> nn.Module:
        return build(config, state)

    def spec(self, config: ConvNetConfig) -> SymmetrySpec:
        return convnet_spec(config)

    def probes(self, config: ConvNetConfig) -> list[Probe]:
        return convnet_probes(config)

    def read_state_dict(self, state: StateDict, where: str, **hints: Any) -> CanonicalModel:
        """torchvision-style names or glmc's (see :mod:`.layouts`); hints: ``arch``,
        ``norm``, ``image_size``, ``num_channels``."""
        config, canonical = read_state_dict(state, where, **hints)
        return CanonicalModel(config, {k: v.float() for k, v in canonical.items()})

    def embed_into(self, model: CanonicalModel, config: ConvNetConfig,
                   where: str = "") -> CanonicalModel:
        from glmc.families.convnet.widen import embed_into

        return embed_into(model, config, where)

    def export_state_dict(self, model: CanonicalModel, layout: str) -> StateDict:
        if layout != "torchvision":
            return super().export_state_dict(model, layout)
        return to_torchvision(model.config, model.state)

