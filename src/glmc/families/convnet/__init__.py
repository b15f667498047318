"""The convnet family: Git Re-Basin's MLP, VGG-11/16 and ResNet-20, whose hidden units
and channels carry permutation symmetries (BatchNorm, a channel LayerNorm or no norm).

- ``family``: the family (:class:`ConvNetFamily`: probes, plain state dicts);
- ``config``: :class:`ConvNetConfig`; ``modules``: the modules and ``build``;
- ``spec``: their symmetry spec; ``layouts``: plain state dicts read by name (torchvision's
  names); ``train``: the architectures ``glmc train`` trains; ``options``: the training
  options they take (torch-free).

This module only declares them (torch-free); each loads on first use.
"""

from glmc._lazy import lazy_exports
from glmc.families.convnet.options import NORMS, OPTIONS
from glmc.families.options import declare_train_options
from glmc.families.registry import declare_arch, declare_family

_HERE = "glmc.families.convnet"

_DECLARED = (  # (arch, class in .train, help)
    ("mlp", "MLPArch", "MLP (3 x 512*width ReLU units) on images"),
    ("vgg11", "VGG11Arch", "VGG-11 (channels base*width*[1,2,4,8,8], --norm) on images"),
    ("vgg16", "VGG16Arch", "VGG-16 (channels base*width*[1,2,4,8,8], --norm) on images"),
    ("resnet20", "ResNet20Arch", "ResNet-20 (channels base*width*[1,2,4], --norm) on images"),
)
#: The convnet architectures (``ConvNetConfig.arch``, ``glmc train --arch``).
ARCHS: tuple[str, ...] = tuple(name for name, _, _ in _DECLARED)

declare_family("convnet", f"{_HERE}.family:ConvNetFamily")
declare_train_options("convnet", OPTIONS)
for _name, _class, _help in _DECLARED:
    declare_arch(_name, family="convnet", task="image_classifier", help=_help,
                 impl=f"{_HERE}.train:{_class}")

# The family's code, loaded on first use (it imports torch).
_EXPORTS = {
    **dict.fromkeys(("ConvNetFamily", "convnet_probes"), f"{_HERE}.family"),
    "ConvNetConfig": f"{_HERE}.config",
    "build": f"{_HERE}.modules",
    "convnet_spec": f"{_HERE}.spec",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = ["ARCHS", "NORMS", *_EXPORTS]
