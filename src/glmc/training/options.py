"""What a training run is: :class:`TrainConfig` and its checks.

Torch-free, so that the command line takes its defaults from here without importing torch;
:mod:`glmc.training.config` adds the data and the Hugging Face config a run implies.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmc.errors import GlmcError
from glmc.families import ARCHS as _DECLARED_ARCHS
from glmc.families.options import TRAIN_OPTIONS, FamilyOptions, declared_names, options_of

#: The names of the architectures ``glmc train`` trains: those the families declare
#: (``glmc.families.ARCHS``, torch-free).
ARCHS: tuple[str, ...] = tuple(_DECLARED_ARCHS)

# Fields that change neither the weights nor the log's contents: a run may be resumed with other
# values (more threads, another checkpoint interval).
RUNTIME_FIELDS: frozenset[str] = frozenset({"threads", "device", "checkpoint_every"})


@dataclass(frozen=True, init=False)
class TrainConfig:
    """Everything that defines a training run (same config and seed: same weights): the
    options every run has, below, and those of the architecture's family, which declares them
    (:mod:`glmc.families.options`: the transformers' ``n_layer``, ``n_embd``, ``n_head``,
    ``n_inner``, ``n_kv_head``, ``patch_size``; the convnets' ``width``, ``norm``, ``base``),
    read as attributes (``cfg.n_layer``) and given as keywords::

        TrainConfig(arch="gpt2", data="shakespeare", n_layer=2, n_embd=64, steps=500)

    Another family's option is not the run's (it changes nothing of its weights): given, it
    is dropped, so that records written when every run held every option still read.
    Vocabulary, image size, channels and classes come from the data.

    Attributes:
        arch: an architecture name (:data:`ARCHS`): ``"gpt2"``, ``"llama"``, ``"gpt-neox"``
            (causal LMs on text), ``"bert"`` (BertForMaskedLM on text, 15% of tokens
            masked), ``"vit"`` (ViTForImageClassification), ``"mlp"``, ``"vgg11"``,
            ``"vgg16"``, ``"resnet20"`` (the convnet family) on images.
        data: a dataset name (see :data:`glmc.data.DATASETS`) or a path.
        seed: initialisation, batch order and dropout.
        data_seed: the train/val/test split of image datasets (text splits are contiguous). Keep
            it fixed across models that will be compared, so they share their test set.
        context: the window length ``T`` of text (a text model's ``n_positions``); ignored
            for images.
        tokenizer: ``"char"`` or ``"gpt2"`` (BPE), text only.
        dropout: every dropout probability of the model (0 keeps runs deterministic).
        steps, batch_size: optimiser steps and examples (windows or images) per step.
        lr, weight_decay: AdamW peak learning rate and decoupled weight decay (matrices,
            embeddings and patch projection only; biases and norms are not decayed).
        warmup: linear warm-up steps before the cosine decay to 0; ``None``: 5% of ``steps``.
        grad_clip: maximum global gradient norm (0 disables clipping).
        eval_every: validate every this many steps and at the end (0: only at the end).
        eval_batches: validation batches (of ``batch_size``) per validation, in a fixed order.
        log_every: record the mean training loss every this many steps.
        checkpoint_every: write a resumable checkpoint every this many steps (0: never).
        threads: ``torch.set_num_threads``; ``None``: ``os.cpu_count()``.
        device: ``"cpu"`` or ``"cuda"`` (bit-identical resumption is only promised on CPU).
        family_options: the family's options, (name, value) in their declared order.
    """

    arch: str
    data: str
    seed: int = 0
    data_seed: int = 0
    context: int = 64
    tokenizer: str = "char"
    dropout: float = 0.0
    steps: int = 500
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int | None = None
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 10
    checkpoint_every: int = 100
    threads: int | None = None
    device: str = "cpu"
    family_options: tuple[tuple[str, Any], ...] = ()

    def __init__(self, arch: str, data: str, family_options: tuple[tuple[str, Any], ...] = (),
                 **options: Any) -> None:
        family = _family_of(arch)
        common = _common_names()
        mine = {**family.defaults, **dict(family_options)}
        others = declared_names()
        for name, value in options.items():
            if name in common:
                object.__setattr__(self, name, value)
            elif name in mine or (name in others and not family.family):
                mine[name] = value  # (an unknown arch keeps them: validate refuses it)
            elif name not in others:
                raise TypeError(f"TrainConfig got an unexpected keyword argument {name!r}")
        object.__setattr__(self, "arch", arch)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "family_options", tuple(mine.items()))

    def __getattr__(self, name: str) -> Any:
        # (only called for names that are not fields: the family's options)
        for key, value in self.__dict__.get("family_options", ()):
            if key == name:
                return value
        raise AttributeError(f"--arch {self.__dict__.get('arch')} has no training option "
                             f"{name!r}")

    @property
    def warmup_steps(self) -> int:
        """The warm-up length actually used."""
        return self.warmup if self.warmup is not None else self.steps // 20

    @property
    def num_threads(self) -> int:
        """The thread count actually used."""
        return self.threads if self.threads is not None else (os.cpu_count() or 1)

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict, the family's options among them (flat)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        family = dict(out.pop("family_options"))
        return out | family

    def flat(self) -> dict[str, Any]:
        """:meth:`to_json` with every family's options, others' at their defaults (the form
        of the records written when every run held every option)."""
        every = {k: v for f in TRAIN_OPTIONS.values() for k, v in f.defaults.items()}
        return {**every, **self.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "training config") -> TrainConfig:
        """Rebuild from :meth:`to_json` output (unknown keys are an error; another family's
        options, which older records hold, are dropped)."""
        unknown = sorted(set(data) - cls.option_names())
        if unknown:
            raise GlmcError(f"{source}: unknown training option {unknown[0]!r}")
        try:
            return cls(**data)
        except TypeError as e:
            raise GlmcError(f"{source}: invalid training config ({e})") from None

    @staticmethod
    def option_names() -> set[str]:
        """Every option a config may be given: the common ones and every family's."""
        return _common_names() | declared_names() | {"arch", "data"}

    def identity(self) -> dict[str, Any]:
        """The fields that must agree for a checkpoint to be resumed (all but runtime ones)."""
        return {k: v for k, v in self.to_json().items() if k not in RUNTIME_FIELDS}

    def validate(self) -> None:
        """Raise GlmcError on an impossible option (checked before any data is read)."""
        if self.arch not in ARCHS:
            raise GlmcError(f"unknown architecture {self.arch!r}: choose one of {', '.join(ARCHS)}")
        family = _family_of(self.arch)
        values = dict(self.family_options)
        for option in family.options:
            option.check(values[option.name])
        positive = {
            "context": self.context, "steps": self.steps, "batch_size": self.batch_size,
            "eval_batches": self.eval_batches, "log_every": self.log_every,
        }
        if self.threads is not None:
            positive["threads"] = self.threads
        for name, value in positive.items():
            if value < 1:
                raise GlmcError(f"{name} must be at least 1, got {value}")
        non_negative = {
            "eval_every": self.eval_every, "checkpoint_every": self.checkpoint_every,
            "weight_decay": self.weight_decay, "grad_clip": self.grad_clip,
            "warmup": self.warmup_steps,
        }
        for name, value in non_negative.items():
            if value < 0:
                raise GlmcError(f"{name} must be >= 0, got {value}")
        if family.check is not None:
            family.check(values)
        if not self.lr > 0:
            raise GlmcError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.dropout < 1:
            raise GlmcError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.warmup_steps > self.steps:
            raise GlmcError(f"warmup {self.warmup_steps} exceeds steps {self.steps}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise GlmcError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


def _common_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig)} - {"arch", "data", "family_options"}


def _family_of(arch: str) -> FamilyOptions:
    """The options of ``arch``'s family (none for an unknown arch: ``validate`` refuses it)."""
    return options_of(arch) or FamilyOptions("", ())


def check_train_output(out: str | Path, cfg: TrainConfig, force: bool) -> None:
    """``out`` can take the model folder (a non-empty one needs ``force``) and is not the
    data (torch-free: the command line checks it before loading torch)."""
    from glmc.data.catalog import DATASETS
    from glmc.io.outputs import check_output

    named = cfg.data.lower() in DATASETS  # (a name, not a path, even where a file has it)
    check_output(out, force=force, inputs=() if named else (cfg.data,))
