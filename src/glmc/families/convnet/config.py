"""The config of a convnet-family model: Git Re-Basin's MLP, VGG-11/16 and ResNet-20.

``width`` multiplies every hidden width (Git Re-Basin's width sweeps). ``base`` is the channel
count of the first stage at width 1 (VGG: 64, stages ``base * [1, 2, 4, 8, 8]``; ResNet-20:
16, stages ``base * [1, 2, 4]``); small values give CPU-sized models. ``hidden`` and
``depth`` shape the MLP only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from glmc.families.base import ModelConfig
from glmc.families.convnet import ARCHS, NORMS

#: First-stage channels at width 1 when ``base`` is not given.
DEFAULT_BASE: dict[str, int] = {"vgg11": 64, "vgg16": 64, "resnet20": 16}



@dataclass
class ConvNetConfig(ModelConfig):
    family: ClassVar[str] = "convnet"

    arch: str  # "mlp" | "vgg11" | "vgg16" | "resnet20"
    image_size: int
    num_channels: int
    num_labels: int
    width: int = 1
    #: "batch" | "layer" (over channels at every position) | "none"; None: "none" for the
    #: MLP (which has no norms), "batch" otherwise.
    norm: str | None = None
    #: First-stage channels of VGG / ResNet at width 1; None: the paper's (64 / 16).
    base: int | None = None
    hidden: int = 512
    depth: int = 3
    task: str = "image_classifier"
    norm_eps: float = 1e-5
    #: Where the model came from, for messages and exporters.
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown convnet arch {self.arch!r} (one of {', '.join(ARCHS)})")
        if self.norm is None:
            self.norm = "none" if self.arch == "mlp" else "batch"
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r} (one of {', '.join(NORMS)})")
        if self.arch == "mlp" and self.norm != "none":
            raise ValueError(f"the mlp has no norms: norm must be 'none', got {self.norm!r}")
        if self.arch == "mlp" and self.base is not None:
            raise ValueError(f"base applies to vgg and resnet20, not the mlp (got {self.base})")
        if self.base is None and self.arch != "mlp":
            self.base = DEFAULT_BASE[self.arch]
        if self.task != "image_classifier":
            raise ValueError(f"a convnet is an image classifier, got task {self.task!r}")
        for name in ("image_size", "num_channels", "num_labels", "width", "hidden", "depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.base is not None and (
            isinstance(self.base, bool) or not isinstance(self.base, int) or self.base < 1
        ):
            raise ValueError(f"base must be a positive integer, got {self.base!r}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps!r}")

    @property
    def n_outputs(self) -> int:
        return self.num_labels

    def describe(self) -> str:
        shape = (f"{self.depth} x {self.hidden * self.width} units" if self.arch == "mlp"
                 else f"width {self.width}x (base {self.base}), norm {self.norm}")
        return (f"{self.arch}: {shape}, {self.num_channels}x{self.image_size}x{self.image_size} "
                f"images, {self.num_labels} classes")
