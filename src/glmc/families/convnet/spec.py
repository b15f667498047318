"""The symmetry spec of a convnet: one permutation space per group of hidden units.

Spaces are named after the module whose output carries them:

- MLP: ``layers.{i}`` (role ``"units"``), the hidden units of layer i;
- VGG: ``features.{i}`` (role ``"channels"``), the channels of conv i;
- ResNet-20: ``stages.{s}`` (``"channels"``), the residual stream of stage s, ONE space tied
  across the stem or shortcut that writes it, every block's conv2/norm2 output and every
  reader (conv1 and shortcut of the next blocks, the head): the skip connections add these
  channels to each other, so they must move together; ``stages.{s}.{b}.conv1``
  (``"channels"``), the inner channels of each block.

A conv weight (out, in, kh, kw) is tagged (out(s_out), inp(s_in), None, None); a norm's
tensors and a bias (out(s),). Image channels and classes are untouched (None).
"""

from __future__ import annotations

from glmc.families.convnet.config import ConvNetConfig
from glmc.families.convnet.modules import RESNET_BLOCKS, resnet_channels, vgg_layers
from glmc.symmetry.groups import Group, PermutationGroup
from glmc.symmetry.spec import AxisTag, SymmetrySpec, inp, out

Axes = dict[str, tuple[AxisTag, ...]]
BN_STATS = ("running_mean", "running_var")


def _in(space: str | None) -> AxisTag:
    return inp(space) if space else None


def conv_axes(config: ConvNetConfig, conv: str, norm: str, s_out: str,
              s_in: str | None) -> Axes:
    """A conv ``conv`` writing ``s_out`` from ``s_in`` (None: the image), then its norm."""
    axes: Axes = {f"{conv}.weight": (out(s_out), _in(s_in), None, None)}
    if config.norm == "none":
        axes[f"{conv}.bias"] = (out(s_out),)
        return axes
    names = ("weight", "bias") + (BN_STATS if config.norm == "batch" else ())
    return axes | {f"{norm}.{t}": (out(s_out),) for t in names}


def head_axes(s_in: str) -> Axes:
    return {"head.weight": (None, inp(s_in)), "head.bias": (None,)}


def mlp_spec(config: ConvNetConfig) -> SymmetrySpec:
    n = config.hidden * config.width
    spaces, axes, prev = {}, {}, None
    for i in range(config.depth):
        s = f"layers.{i}"
        spaces[s] = PermutationGroup(n)
        axes[f"{s}.weight"] = (out(s), _in(prev))
        axes[f"{s}.bias"] = (out(s),)
        prev = s
    return SymmetrySpec(spaces, axes | head_axes(prev), dict.fromkeys(spaces, "units"))


def vgg_spec(config: ConvNetConfig) -> SymmetrySpec:
    spaces, axes, prev = {}, {}, None
    for i, (c, _) in enumerate(vgg_layers(config)):
        s = f"features.{i}"
        spaces[s] = PermutationGroup(c)
        axes |= conv_axes(config, f"{s}.conv", f"{s}.norm", s, prev)
        prev = s
    return _with_buffers(spaces, axes | head_axes(prev))


def resnet_spec(config: ConvNetConfig) -> SymmetrySpec:
    channels = resnet_channels(config)
    spaces = {f"stages.{s}": PermutationGroup(c) for s, c in enumerate(channels)}
    axes = conv_axes(config, "stem.conv", "stem.norm", "stages.0", None)
    res = "stages.0"  # the stream the next block reads
    for s, c in enumerate(channels):
        stream = f"stages.{s}"
        for b in range(RESNET_BLOCKS):
            blk = f"{stream}.{b}"
            inner = f"{blk}.conv1"
            spaces[inner] = PermutationGroup(c)
            axes |= conv_axes(config, f"{blk}.conv1", f"{blk}.norm1", inner, res)
            axes |= conv_axes(config, f"{blk}.conv2", f"{blk}.norm2", stream, inner)
            if res != stream:  # the projection shortcut entering a new stage
                axes |= conv_axes(config, f"{blk}.shortcut.conv", f"{blk}.shortcut.norm",
                                  stream, res)
            res = stream
    return _with_buffers(spaces, axes | head_axes(res))


def _with_buffers(spaces: dict[str, Group], axes: Axes) -> SymmetrySpec:
    buffers = frozenset(k for k in axes if k.rsplit(".", 1)[-1] in BN_STATS)
    return SymmetrySpec(spaces, axes, dict.fromkeys(spaces, "channels"), buffers)


def convnet_spec(config: ConvNetConfig) -> SymmetrySpec:
    if config.arch == "mlp":
        return mlp_spec(config)
    if config.arch == "resnet20":
        return resnet_spec(config)
    return vgg_spec(config)
