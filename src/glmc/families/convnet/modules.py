"""The convnet modules: Git Re-Basin's MLP, VGG-11/16 and ResNet-20, in plain PyTorch.

Parameter names (L = config.depth, s = stage, b = block, i = conv layer)::

    layers.{i}.weight, .bias              MLP hidden layer i (hidden*width, fan_in)
    features.{i}.conv.weight (, .bias)    VGG conv i (c_out, c_in, 3, 3); bias when norm none
    features.{i}.norm.weight, .bias       its norm (c_out,); BatchNorm adds .running_mean/var
    stem.conv.weight, stem.norm.*         ResNet stem
    stages.{s}.{b}.conv1/norm1/conv2/norm2.*  BasicBlock
    stages.{s}.0.shortcut.conv/norm.*     1x1 projection where the block changes shape
    head.weight, head.bias                (classes, features)

Every module maps images (B, C, H, W) to logits (B, classes). Every norm acts on each
channel alone (or, for the channel LayerNorm, on all channels symmetrically), so permuting a
layer's channels and the next layer's inputs alike keeps the function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glmc.families.convnet.config import ConvNetConfig

# VGG stages in units of ``base`` channels; "M" is a 2x2 max-pool.
VGG_LAYOUTS: dict[str, list[int | str]] = {
    "vgg11": [1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"],
    "vgg16": [1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M"],
}
RESNET_STAGES = (1, 2, 4)  # stage channels in units of base * width
RESNET_BLOCKS = 3  # BasicBlocks per stage: 6 * 3 + 2 = 20 layers


class BatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose state dict holds only float tensors (no ``num_batches_tracked``:
    it only matters when ``momentum`` is None, which glmc never uses)."""

    def __init__(self, channels: int, eps: float) -> None:
        super().__init__(channels, eps=eps)
        self.register_buffer("num_batches_tracked", None)

    # _NormBase's loader re-inserts num_batches_tracked into state dicts that lack version
    # metadata (safetensors), which a strict load then rejects: load as a plain module.
    _load_from_state_dict = nn.Module._load_from_state_dict


class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channels at every position (Git Re-Basin's width sweep):
    (B, C, H, W) -> (B, C, H, W), with a per-channel weight and bias."""

    def __init__(self, channels: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.movedim(1, -1), self.weight.shape, self.weight, self.bias, self.eps)
        return y.movedim(-1, 1)


def make_norm(config: ConvNetConfig, channels: int) -> nn.Module:
    if config.norm == "batch":
        return BatchNorm(channels, config.norm_eps)
    if config.norm == "layer":
        return ChannelLayerNorm(channels, config.norm_eps)
    return nn.Identity()  # holds no tensors: the conv before it keeps its bias


def make_conv(config: ConvNetConfig, c_in: int, c_out: int, kernel: int = 3,
              stride: int = 1) -> nn.Conv2d:
    """A conv with "same" padding; without bias when a norm follows (the norm's bias
    would absorb it)."""
    return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2,
                     bias=config.norm == "none")


# --------------------------------------------------------------------------------------------
# MLP
# --------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Flatten, ``depth`` ReLU layers of ``hidden * width`` units, a linear head."""

    def __init__(self, config: ConvNetConfig) -> None:
        super().__init__()
        n_in = config.num_channels * config.image_size**2
        n = config.hidden * config.width
        self.layers = nn.ModuleList(
            nn.Linear(n_in if i == 0 else n, n) for i in range(config.depth)
        )
        self.head = nn.Linear(n, config.num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, classes)
        x = x.flatten(1)
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


# --------------------------------------------------------------------------------------------
# VGG
# --------------------------------------------------------------------------------------------


class ConvBlock(nn.Module):
    """conv 3x3 -> norm -> ReLU, then a 2x2 max-pool when ``pool``."""

    def __init__(self, config: ConvNetConfig, c_in: int, c_out: int, pool: bool) -> None:
        super().__init__()
        self.conv = make_conv(config, c_in, c_out)
        self.norm = make_norm(config, c_out)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.norm(self.conv(x)))
        return F.max_pool2d(x, 2) if self.pool else x


def vgg_layers(config: ConvNetConfig) -> list[tuple[int, bool]]:
    """(channels, pool after it) of every conv layer. A pool that would shrink the image
    below 1x1 is dropped (28x28 MNIST allows four halvings, 32x32 CIFAR five)."""
    layers: list[tuple[int, bool]] = []
    side = config.image_size
    for item in VGG_LAYOUTS[config.arch]:
        if item != "M":
            layers.append((int(item) * config.base * config.width, False))
        elif side >= 2:
            layers[-1] = (layers[-1][0], True)
            side //= 2
    return layers


class VGG(nn.Module):
    """VGG for small images: conv blocks, global average pool, a linear head."""

    def __init__(self, config: ConvNetConfig) -> None:
        super().__init__()
        blocks, c_in = [], config.num_channels
        for c_out, pool in vgg_layers(config):
            blocks.append(ConvBlock(config, c_in, c_out, pool))
            c_in = c_out
        self.features = nn.ModuleList(blocks)
        self.head = nn.Linear(c_in, config.num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, classes)
        for block in self.features:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


# --------------------------------------------------------------------------------------------
# ResNet-20
# --------------------------------------------------------------------------------------------


class Stem(nn.Module):
    """conv 3x3 -> norm -> ReLU: the first residual stream."""

    def __init__(self, config: ConvNetConfig, c_out: int) -> None:
        super().__init__()
        self.conv = make_conv(config, config.num_channels, c_out)
        self.norm = make_norm(config, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.conv(x)))


class Shortcut(nn.Module):
    """1x1 conv (with the block's stride) -> norm: the residual stream in the new shape."""

    def __init__(self, config: ConvNetConfig, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = make_conv(config, c_in, c_out, kernel=1, stride=stride)
        self.norm = make_norm(config, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class BasicBlock(nn.Module):
    """relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x)); the shortcut is the
    identity unless the block changes the stride or the channels."""

    def __init__(self, config: ConvNetConfig, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = make_conv(config, c_in, c_out, stride=stride)
        self.norm1 = make_norm(config, c_out)
        self.conv2 = make_conv(config, c_out, c_out)
        self.norm2 = make_norm(config, c_out)
        self.shortcut = (
            Shortcut(config, c_in, c_out, stride) if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(h)) + self.shortcut(x))


def resnet_channels(config: ConvNetConfig) -> list[int]:
    """Channels of each stage's residual stream."""
    return [m * config.base * config.width for m in RESNET_STAGES]


class ResNet(nn.Module):
    """He et al.'s CIFAR ResNet-20 with projection shortcuts (as Git Re-Basin): a stem,
    three stages of three BasicBlocks (stride 2 entering stages 1 and 2), global average
    pool, a linear head."""

    def __init__(self, config: ConvNetConfig) -> None:
        super().__init__()
        channels = resnet_channels(config)
        self.stem = Stem(config, channels[0])
        stages, c_in = [], channels[0]
        for s, c_out in enumerate(channels):
            blocks = []
            for b in range(RESNET_BLOCKS):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(BasicBlock(config, c_in, c_out, stride))
                c_in = c_out
            stages.append(nn.ModuleList(blocks))
        self.stages = nn.ModuleList(stages)
        self.head = nn.Linear(c_in, config.num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, classes)
        x = self.stem(x)
        for stage in self.stages:
            for block in stage:
                x = block(x)
        return self.head(x.mean(dim=(2, 3)))


MODULES: dict[str, type[nn.Module]] = {
    "mlp": MLP, "vgg11": VGG, "vgg16": VGG, "resnet20": ResNet,
}


def build(config: ConvNetConfig, state: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """The module of ``config`` in eval mode; with ``state``: in its dtype, loaded strictly.
    Without it, freshly initialised from torch's global RNG."""
    module = MODULES[config.arch](config)
    if state is not None:
        module.to(next(iter(state.values())).dtype)
        module.load_state_dict(state, strict=True)
    return module.eval()
