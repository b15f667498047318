"""The convnets ``glmc train`` trains: ``mlp``, ``vgg11``, ``vgg16``, ``resnet20``.

Image size, channels and classes come from the data; ``--width``, ``--norm`` and ``--base``
from the training options. They are saved as glmc folders (``config.json`` with the
canonical config, ``model.safetensors``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from glmc.families.base import Arch
from glmc.families.convnet.config import ConvNetConfig
from glmc.families.convnet.modules import build
from glmc.io.files import write_glmc
from glmc.model import CanonicalModel

if TYPE_CHECKING:
    from glmc.data import Dataset
    from glmc.training.options import TrainConfig


class ConvNetArch(Arch):
    """A convnet-family architecture (its declared ``name`` is its ``arch``)."""

    def shape(self, cfg: TrainConfig) -> dict[str, Any]:
        """The config fields this architecture takes from the training options."""
        return {"width": cfg.width, "norm": cfg.norm, "base": cfg.base}

    def describe(self, cfg: TrainConfig) -> str:
        shape = self.shape(cfg)
        base = shape.get("hidden", shape.get("base"))
        return (f"{self.name}: width {cfg.width}x" + (f", base {base}" if base else "")
                + f", norm {shape['norm']}")

    def model_config(self, cfg: TrainConfig, ds: Dataset) -> ConvNetConfig:
        return ConvNetConfig(arch=self.name, image_size=ds.image_size,
                             num_channels=ds.num_channels, num_labels=ds.num_classes,
                             **self.shape(cfg))

    def config_from_json(self, raw: dict) -> ConvNetConfig:
        return ConvNetConfig.from_json(raw)

    def build(self, config: ConvNetConfig) -> nn.Module:
        return build(config)

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x)

    def save(self, model: nn.Module, config: ConvNetConfig, folder: Any) -> None:

        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        write_glmc(Path(folder), CanonicalModel(config, state))


class MLPArch(ConvNetArch):
    """Git Re-Basin's MNIST MLP: 3 hidden ReLU layers of ``--base`` (512) × ``--width``
    units, no norms (``--norm`` does not apply)."""

    def shape(self, cfg: TrainConfig) -> dict[str, Any]:
        return {"width": cfg.width, "norm": "none", "hidden": cfg.base or 512}


class VGG11Arch(ConvNetArch):
    """VGG-11 (CIFAR-style, global pooling and one linear head)."""


class VGG16Arch(ConvNetArch):
    """VGG-16 (CIFAR-style, global pooling and one linear head)."""


class ResNet20Arch(ConvNetArch):
    """ResNet-20 with projection shortcuts."""
