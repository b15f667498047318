"""A narrower convnet embedded exactly into a wider one's shapes.

B's hidden widths (the MLP's units, VGG's and ResNet-20's channels: ``hidden·width`` or
``base·width``) may be at most A's; everything else (architecture, depth, norm, images,
classes) must agree. Every axis that carries a space is padded to A's size, B's units first:

- an extra unit or channel has zero weights and bias, so it outputs zero, ReLU(0) = 0, and
  its readers' zero columns add nothing;
- under BatchNorm its scale and shift are zero (the output is zero whatever the statistics),
  its running mean 0 and variance 1;
- a ResNet's extra stream channels are zero in every writer, so they stay zero.

A channel LayerNorm cannot be padded (its mean and variance over the channels would see the
zeros). Aligning the embedded B to A then assigns B's units to a subset of A's: a partial
assignment, with A's other units matched to B's zero ones.

Only the padding that reaches an output must be zero. An extra unit of a space written once
(an MLP layer, a VGG conv, a ResNet block's inner channels) is read by zero columns only, so
what makes it (its weight rows, bias, norm scale, shift and statistics) is *free*
(``CanonicalModel.free``); a ResNet stream's extra channels are zero, so its readers' columns
there are free, while its writers, which add up, stay zero.
"""

from __future__ import annotations

from collections import Counter

import torch

from glmc.errors import GlmcError
from glmc.families.convnet.config import ConvNetConfig
from glmc.families.convnet.spec import convnet_spec
from glmc.model import CanonicalModel
from glmc.tensors import StateDict, pad_to

#: The fields that may differ: the widths.
WIDTHS = ("width", "hidden", "base")


def check_narrower(a: ConvNetConfig, b: ConvNetConfig, where: str = "") -> None:
    """Raise GlmcError unless B fits into A's shapes (see the module's docstring)."""
    at = f"{where}: " if where else ""
    other = [f"{k} ({getattr(a, k)} in A, {getattr(b, k)} in B)"
             for k in ("arch", "depth", "norm", "image_size", "num_channels", "num_labels",
                       "task", "norm_eps") if getattr(a, k) != getattr(b, k)]
    if other:
        raise GlmcError(f"{at}the models differ in {', '.join(other[:3])}: only their widths "
                        "may differ")
    sa, sb = convnet_spec(a).spaces, convnet_spec(b).spaces
    wider = [s for s in sa if sb[s].size > sa[s].size]
    if wider:
        widths = ", ".join(f"{k} {getattr(a, k)} in A, {getattr(b, k)} in B"
                           for k in WIDTHS if getattr(a, k) != getattr(b, k))
        raise GlmcError(f"{at}B is wider than A ({widths}): give the wider model as A (swap "
                        "A and B)")
    if a.norm == "layer":
        raise GlmcError(f"{at}a channel-LayerNorm convnet cannot be embedded into a wider one "
                        "(its LayerNorms would see the padding)")


def embed_into(model: CanonicalModel, a: ConvNetConfig, where: str = "") -> CanonicalModel:
    """``model`` (B) as a model of A's config ``a`` that computes B's function."""
    check_narrower(a, model.config, where)
    spec_a, spec_b = convnet_spec(a), model.spec
    out: StateDict = {}
    free: StateDict = {}
    # (the layers that write each space: weights of two axes or more, norms aside)
    writers = Counter(tags[0][0][0] for tags in spec_a.axes.values()
                      if len(tags) > 1 and tags[0])
    for name, x in model.state.items():
        tags = spec_b.axes.get(name, ())
        shape = tuple(spec_a.spaces[tag[0][0]].size if tag else n
                      for tag, n in zip(tags, x.shape, strict=False)) + x.shape[len(tags):]
        out[name] = pad_to(x, shape, 1.0 if name.endswith(".running_var") else 0.0)
        mask = torch.zeros(shape, dtype=torch.bool)
        for axis, tag in enumerate(tags):
            if not tag:
                continue
            space, variance = tag[0]
            # (a space written once: what makes its extra units; a stream: its readers)
            if (variance == "out") == (writers[space] == 1):
                mask.narrow(axis, x.shape[axis], shape[axis] - x.shape[axis]).fill_(True)
        if mask.any():
            free[name] = mask
    return CanonicalModel(a, out, model.files, free)
