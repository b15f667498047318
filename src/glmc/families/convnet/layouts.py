"""Plain PyTorch state dicts of convnets, read by tensor name (no torchvision needed).

glmc's own names (see :mod:`.modules`) are read as they are; these layouts are mapped:

- ResNet, torchvision's names (as most CIFAR ResNet repositories use them): ``conv1``/``bn1``
  (stem), ``layer{1,2,3}.{b}.conv{1,2}`` / ``bn{1,2}``, ``layer{k}.0.downsample.{0,1}`` or
  ``.shortcut.{0,1}`` (projection shortcut: 1x1 conv, norm), ``fc`` or ``linear`` (head);
- VGG, torchvision's ``features`` Sequential (its indices count ReLUs and pools too): in
  index order, a 4-D weight is the next conv, the 1-D tensors after it are its norm; one
  linear head: ``classifier`` (or ``classifier.0``), ``fc`` or ``linear``;
- MLP: any chain of linear layers, in natural name order (``fc1, fc2, ...``,
  ``layers.0, ...``), each reading the previous one's outputs; the last is the head.

A ``module.`` prefix (DataParallel) is dropped and ``num_batches_tracked`` ignored. A conv bias
in front of a BatchNorm is folded into its running mean (exact in eval mode). Width and base
follow from the shapes; the norm from the tensors (running statistics: BatchNorm; a norm
without them needs ``norm="layer"`` said explicitly); the image side, which a convnet's
weights do not fix, is given. Anything else is refused, naming the checkpoint's tensor.

:func:`to_torchvision` goes back: a model's tensors under torchvision's names (an MLP's as
``fc1 .. fcN``), with BatchNorm's ``num_batches_tracked``, for a module that uses them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable

import torch

from glmc.errors import GlmcError
from glmc.families.base import check_shapes, module_shapes
from glmc.families.convnet.config import DEFAULT_BASE, ConvNetConfig
from glmc.families.convnet.modules import build, vgg_layers
from glmc.tensors import StateDict

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]

HEAD = re.compile(r"(?:fc|linear|head|classifier|classifier\.0)\.(weight|bias)")
BN_STATS = ("running_mean", "running_var")


def _stage(m: re.Match[str], part: str) -> str:
    """``layer{k}.{b}.…`` -> ``stages.{k-1}.{b}.{part}``."""
    return f"stages.{int(m[1]) - 1}.{m[2]}.{part}"


RESNET_RULES: tuple[Rule, ...] = (
    (re.compile(r"(?:stem|stages\.\d+\.\d+)\.\w+(?:\.\w+)?\.\w+"), lambda m: m[0]),  # glmc's
    (re.compile(r"conv1\.(\w+)"), lambda m: f"stem.conv.{m[1]}"),
    (re.compile(r"bn1\.(\w+)"), lambda m: f"stem.norm.{m[1]}"),
    (re.compile(r"layer(\d+)\.(\d+)\.conv([12])\.(\w+)"),
     lambda m: _stage(m, f"conv{m[3]}.{m[4]}")),
    (re.compile(r"layer(\d+)\.(\d+)\.bn([12])\.(\w+)"),
     lambda m: _stage(m, f"norm{m[3]}.{m[4]}")),
    (re.compile(r"layer(\d+)\.(\d+)\.(?:downsample|shortcut)\.0\.(\w+)"),
     lambda m: _stage(m, f"shortcut.conv.{m[3]}")),
    (re.compile(r"layer(\d+)\.(\d+)\.(?:downsample|shortcut)\.1\.(\w+)"),
     lambda m: _stage(m, f"shortcut.norm.{m[3]}")),
    (HEAD, lambda m: f"head.{m[1]}"),
)


def _describe(name: str, t: torch.Tensor) -> str:
    return f"{name} (shape {list(t.shape)})"


def _put(names: dict[str, str], target: str, src: str, where: str) -> None:
    """names[target] = src, refusing a second checkpoint tensor for the same place."""
    if target in names:
        raise GlmcError(f"{where}: tensors {names[target]} and {src} would both be {target}; "
                        "keep one of them")
    names[target] = src


def _by_rules(state: StateDict, rules: tuple[Rule, ...], arch: str,
              where: str) -> dict[str, str]:
    """canonical name -> checkpoint name, by the first rule whose pattern matches whole."""
    names: dict[str, str] = {}
    for src in state:
        for pattern, target in rules:
            m = pattern.fullmatch(src)
            if m:
                _put(names, target(m), src, where)
                break
        else:
            raise GlmcError(f"{where}: tensor {_describe(src, state[src])} has no place in "
                            f"a {arch} state dict")
    return names


def _natural(name: str) -> list[int | str]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _vgg_names(state: StateDict, where: str) -> dict[str, str]:
    """``features.{j}.*`` in index order: a module with a 4-D weight is the next conv, one
    with a 1-D weight its norm; glmc's ``features.{i}.conv|norm.*`` as they are."""
    names: dict[str, str] = {}
    modules: dict[int, list[str]] = {}
    for src in state:
        if re.fullmatch(r"features\.\d+\.(?:conv|norm)\.\w+", src):
            _put(names, src, src, where)
        elif m := re.fullmatch(r"features\.(\d+)\.\w+", src):
            modules.setdefault(int(m[1]), []).append(src)
        elif m := HEAD.fullmatch(src):
            _put(names, f"head.{m[1]}", src, where)
        else:
            raise GlmcError(f"{where}: tensor {_describe(src, state[src])} has no place in a "
                            "VGG state dict (features.J.*, then one linear head: classifier, "
                            "fc or linear; glmc's VGG pools globally into a single linear "
                            "layer)")
    conv = -1
    for j in sorted(modules):
        weight = state.get(f"features.{j}.weight")
        is_conv = weight is not None and weight.ndim == 4
        conv += is_conv
        if conv < 0:
            src = modules[j][0]
            raise GlmcError(f"{where}: tensor {_describe(src, state[src])} comes before any "
                            "conv")
        for src in modules[j]:
            part = "conv" if is_conv else "norm"
            _put(names, f"features.{conv}.{part}.{src.rsplit('.', 1)[1]}", src, where)
    return names


def _mlp_names(state: StateDict, where: str) -> dict[str, str]:
    """A chain of linear layers: ``layers.{i}`` for the hidden ones, ``head`` for the last.

    The order is the layers' index (``fc1 .. fcN``, ``layers.0 ..``, ``classifier.0 ..``);
    a head-named layer outside the indexed ones (``fc``, ``head``) comes last. Names without
    an index (``input``, ``hidden``) say no order, and are refused."""
    weights = [k for k in state if k.endswith("weight")]
    family = {k: re.sub(r"\d+", "#", k) for k in weights}  # (the name with its index blanked)
    count = Counter(family.values())
    heads = [k for k in weights if HEAD.fullmatch(k) and count[family[k]] == 1]
    hidden = sorted((k for k in weights if k not in heads), key=_natural)
    if len(heads) > 1 or (len(hidden) > 1 and (len({family[k] for k in hidden}) > 1
                                               or "#" not in family[hidden[0]])):
        raise GlmcError(f"{where}: cannot tell the order of the linear layers from their names "
                        f"({', '.join(sorted(weights, key=_natural))}); name them with an "
                        "index (fc1 .. fcN, or layers.0 .. and a head)")
    weights = hidden + heads
    if len(weights) < 2:
        raise GlmcError(f"{where}: an MLP state dict needs at least two linear layers, found "
                        f"{len(weights)}")
    names: dict[str, str] = {}
    for i, src in enumerate(weights):
        t = state[src]
        if t.ndim != 2:
            raise GlmcError(f"{where}: tensor {_describe(src, t)} is not a linear layer's "
                            "weight; an MLP state dict holds only (out, in) weights and biases")
        if i and t.shape[1] != state[weights[i - 1]].shape[0]:
            raise GlmcError(f"{where}: tensor {_describe(src, t)} does not read the "
                            f"{state[weights[i - 1]].shape[0]} outputs of {weights[i - 1]}")
        layer = "head" if i == len(weights) - 1 else f"layers.{i}"
        names[f"{layer}.weight"] = src
        bias = src.removesuffix("weight") + "bias"
        if bias in state:
            names[f"{layer}.bias"] = bias
    rest = sorted(set(state) - set(names.values()))
    if rest:
        raise GlmcError(f"{where}: tensor {_describe(rest[0], state[rest[0]])} belongs to no "
                        "linear layer of the MLP")
    return names


def guess_arch(state: StateDict, where: str) -> str:
    """The architecture a state dict's names say (``mlp``, ``vgg11``, ``vgg16``, ``resnet20``)."""
    if any(k.startswith(("layer1.", "stages.")) for k in state):
        return "resnet20"
    if any(k.startswith("features.") for k in state):
        convs = sum(1 for k, t in state.items() if k.startswith("features.") and t.ndim == 4
                    and k.endswith("weight"))
        arch = {8: "vgg11", 13: "vgg16"}.get(convs)
        if arch is None:
            raise GlmcError(f"{where}: features holds {convs} conv layers; VGG-11 has 8 and "
                            "VGG-16 has 13")
        return arch
    if state and all(t.ndim <= 2 for t in state.values()):
        return "mlp"
    first = next(iter(state), None)
    raise GlmcError(f"{where}: cannot tell the architecture from the tensor names"
                    + (f" (first: {_describe(first, state[first])})" if first else " (empty)")
                    + "; pass the arch (mlp, vgg11, vgg16, resnet20)")


def _plain(state: StateDict, where: str) -> StateDict:
    """Without ``module.`` prefixes and ``num_batches_tracked``; every tensor floating point."""
    plain: StateDict = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise GlmcError(f"{where}: entry {name} is a {type(t).__name__}, not a tensor")
        if name.endswith("num_batches_tracked"):
            continue
        if not t.is_floating_point():
            raise GlmcError(f"{where}: tensor {_describe(name, t)} has dtype "
                            f"{str(t.dtype).removeprefix('torch.')}; weights must be floating")
        key = name.removeprefix("module.")
        if key in plain:
            raise GlmcError(f"{where}: tensors {key} and {name} are the same tensor twice; "
                            "keep one of them")
        plain[key] = t
    return plain


def _norm_kind(state: StateDict, names: dict[str, str], norm: str | None, where: str) -> str:
    """"batch" when running statistics are stored, "none" when no norm is; a norm without
    statistics only when said (``norm="layer"``)."""
    found = "batch" if any(n.endswith(BN_STATS) for n in names) else (
        "layer" if any(".norm" in n for n in names) else "none")
    if norm is None and found == "layer":
        src = next(names[n] for n in names if ".norm" in n)
        raise GlmcError(f"{where}: norm tensor {src} comes without running statistics; if the "
                        "norms are LayerNorms over the channels, say so (--norm layer)")
    if norm is not None and norm != found:
        raise GlmcError(f"{where}: the tensors say norm {found!r}, not {norm!r}")
    return found


def _fold_conv_biases(state: StateDict, norm: str, names: dict[str, str],
                      where: str) -> StateDict:
    """A conv bias before a BatchNorm moved into its running mean (BN(conv + c) in eval mode
    is BN with mean - c); refused before a LayerNorm, which does not absorb it."""
    if norm == "none":  # (the conv keeps its bias)
        return state
    out = dict(state)
    for name in [n for n in state if re.search(r"\.conv\d?\.bias$", n)]:
        if norm != "batch":
            raise GlmcError(f"{where}: conv bias {names[name]} comes before a channel "
                            "LayerNorm; glmc's convnets have no bias there")
        mean = re.sub(r"\.conv(\d?)\.bias$", r".norm\1.running_mean", name)
        if mean in out:  # (otherwise the layout check names the stray bias)
            dtype = torch.promote_types(state[mean].dtype, torch.float32)  # (not in fp16)
            out[mean] = (state[mean].double() - out.pop(name).double()).to(dtype)
    return out


def _identity_affine(state: StateDict) -> StateDict:
    """A BatchNorm stored without weight and bias (``affine=False``) is one with weight 1 and
    bias 0: both added, exactly."""
    out = dict(state)
    for name, mean in state.items():
        norm = name.removesuffix("running_mean")
        if norm != name and f"{norm}weight" not in state and f"{norm}bias" not in state:
            out[f"{norm}weight"], out[f"{norm}bias"] = torch.ones_like(mean), torch.zeros_like(mean)
    return out


def _shape_config(arch: str, state: StateDict, norm: str, image_size: int | None,
                  num_channels: int | None, where: str) -> ConvNetConfig:
    """The config the canonical-named tensors imply."""
    head = state.get("head.weight")
    if head is None:
        raise GlmcError(f"{where}: no linear head (fc, linear or classifier)")
    common = {"arch": arch, "num_labels": int(head.shape[0]), "norm": norm}
    if arch == "mlp":
        first = state["layers.0.weight"]
        channels = num_channels or (first.shape[1] // image_size**2 if image_size else 1) or 1
        side = math.isqrt(first.shape[1] // channels)
        if side * side * channels != first.shape[1] or (image_size not in (None, side)):
            raise GlmcError(f"{where}: the first layer reads {first.shape[1]} inputs, not "
                            f"{channels} x {image_size or 'N'} x {image_size or 'N'} pixels")
        depth = sum(1 for k in state if k.startswith("layers.") and k.endswith("weight"))
        return ConvNetConfig(**common, image_size=side, num_channels=channels,
                             hidden=int(first.shape[0]), depth=depth)
    if image_size is None:
        raise GlmcError(f"{where}: a {arch}'s weights do not fix the image side; give it "
                        "(--image-size)")
    stem = state.get("stem.conv.weight" if arch == "resnet20" else "features.0.conv.weight")
    if stem is None:
        raise GlmcError(f"{where}: no first conv layer")
    if num_channels not in (None, stem.shape[1]):
        raise GlmcError(f"{where}: the first conv reads {stem.shape[1]} image channels, not "
                        f"{num_channels}")
    c0, unit = int(stem.shape[0]), DEFAULT_BASE[arch]
    base, width = (unit, c0 // unit) if c0 % unit == 0 else (c0, 1)
    return ConvNetConfig(**common, image_size=image_size, num_channels=int(stem.shape[1]),
                         base=base, width=width)


def _check_layout(config: ConvNetConfig, state: StateDict, names: dict[str, str],
                  where: str) -> None:
    """Every tensor of ``config``'s module present with its shape, nothing else; a mismatch
    names the checkpoint's tensor."""
    expected = module_shapes(lambda: build(config))
    shortcut = next((n for n in expected if n.endswith(".shortcut.conv.weight")
                     and n not in state), None)
    if shortcut is not None:
        raise GlmcError(f"{where}: tensor {shortcut} (shape {list(expected[shortcut])}) is "
                        "missing: glmc's ResNet-20 has projection shortcuts (downsample.0/.1)")
    check_shapes(where, state, expected, shown=names,
                 needs=f"{config.arch} (width {config.width}, norm {config.norm}) needs")


def read_state_dict(state: StateDict, where: str, *, arch: str | None = None,
                    norm: str | None = None, image_size: int | None = None,
                    num_channels: int | None = None) -> tuple[ConvNetConfig, StateDict]:
    """(config, canonical state dict) of a plain state dict in one of the layouts above.

    ``arch``/``norm``: None to read them from the names and tensors; ``image_size``: the
    input side (needed for vgg/resnet20; the MLP's follows from its first layer and
    ``num_channels``, default 1).
    """
    state = _plain(state, where)
    arch = arch or guess_arch(state, where)
    if arch == "resnet20":
        names, layout = _by_rules(state, RESNET_RULES, arch, where), "torchvision"
    elif arch in ("vgg11", "vgg16"):
        names, layout = _vgg_names(state, where), "torchvision"
    elif arch == "mlp":
        names, layout = _mlp_names(state, where), "linear chain"
    else:
        raise GlmcError(f"unknown convnet arch {arch!r} (mlp, vgg11, vgg16, resnet20)")
    kind = _norm_kind(state, names, norm, where)
    canonical = _fold_conv_biases(_identity_affine({n: state[src] for n, src in names.items()}),
                                  kind, names, where)
    config = _shape_config(arch, canonical, kind, image_size, num_channels, where)
    _check_layout(config, canonical, names, where)
    if all(n == src for n, src in names.items()):
        layout = "glmc"
    config.source = {"checkpoint": where, "layout": layout}
    return config, canonical


def _torchvision_name(config: ConvNetConfig, name: str, vgg_index: dict[int, int]) -> str:
    """The torchvision-style name of one canonical tensor name."""
    if config.arch == "mlp":
        m = re.fullmatch(r"layers\.(\d+)\.(\w+)", name)
        return f"fc{int(m[1]) + 1}.{m[2]}" if m else name.replace("head.", f"fc{config.depth + 1}.")
    if m := re.fullmatch(r"features\.(\d+)\.(conv|norm)\.(\w+)", name):
        return f"features.{vgg_index[int(m[1])] + (m[2] == 'norm')}.{m[3]}"
    for pattern, repl in ((r"stem\.conv\.", "conv1."), (r"stem\.norm\.", "bn1."),
                          (r"\.shortcut\.conv\.", ".downsample.0."),
                          (r"\.shortcut\.norm\.", ".downsample.1."),
                          (r"\.norm([12])\.", r".bn\1.")):
        name = re.sub(pattern, repl, name)
    name = re.sub(r"^stages\.(\d+)\.", lambda m: f"layer{int(m[1]) + 1}.", name)
    return re.sub(r"^head\.", "classifier." if config.arch != "resnet20" else "fc.", name)


def to_torchvision(config: ConvNetConfig, state: StateDict) -> StateDict:
    """``state`` under torchvision's names (VGG: the ``features`` Sequential's indices, which
    count the norm, ReLU and pool modules; head ``classifier``; ResNet head ``fc``), every
    BatchNorm with a ``num_batches_tracked`` of 0: what :func:`read_state_dict` reads back
    and a torchvision-style module loads strictly."""
    vgg_index, j = {}, 0
    if config.arch in ("vgg11", "vgg16"):
        for i, (_, pool) in enumerate(vgg_layers(config)):
            vgg_index[i] = j
            j += 2 + (config.norm != "none") + pool  # conv, [norm], ReLU, [pool]
    out: StateDict = {}
    for name, t in state.items():
        out[_torchvision_name(config, name, vgg_index)] = t
        if name.endswith(".running_var"):
            stem = _torchvision_name(config, name, vgg_index).removesuffix("running_var")
            out[stem + "num_batches_tracked"] = torch.zeros((), dtype=torch.long)
    return out
