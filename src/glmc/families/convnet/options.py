"""The training options of the convnet family (torch-free): the widths and norm of an MLP,
VGG or ResNet-20 that ``glmc train`` trains (image size, channels and classes come from the
data)."""

from __future__ import annotations

from glmc.families.options import TrainOption

#: The convnets' norms (``ConvNetConfig.norm``, ``glmc train --norm``).
NORMS: tuple[str, ...] = ("batch", "layer", "none")

OPTIONS = (
    TrainOption("width", int, 1, "multiplier of every hidden width", minimum=1),
    TrainOption("norm", str, "batch", "vgg, resnet20: BatchNorm, LayerNorm over channels, or "
                "none", choices=NORMS),
    TrainOption("base", int, None, "first-stage width before --width (unset: the "
                "architecture's own: 512 units, 64 or 16 channels)", minimum=1),
)
