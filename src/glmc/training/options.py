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
from glmc.families.convnet import NORMS

#: The names of the architectures ``glmc train`` trains: those the families declare
#: (``glmc.families.ARCHS``, torch-free).
ARCHS: tuple[str, ...] = tuple(_DECLARED_ARCHS)

# Fields that change neither the weights nor the log's contents: a run may be resumed with other
# values (more threads, another checkpoint interval).
RUNTIME_FIELDS: frozenset[str] = frozenset({"threads", "device", "checkpoint_every"})


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (same config and seed: same weights).

    Each architecture (:data:`glmc.families.ARCHS`) reads the shape options that apply to it:
    the transformers ``n_layer``/``n_embd``/``n_head``/``n_inner`` (for ViT
    ``num_hidden_layers``/``hidden_size``/``num_attention_heads``/``intermediate_size``), the
    convnets ``width``/``norm``/``base``. Vocabulary, image size, channels and classes come
    from the data.

    Attributes:
        arch: an architecture name (:data:`ARCHS`): ``"gpt2"``, ``"llama"``, ``"gpt-neox"``
            (causal LMs on text), ``"bert"`` (BertForMaskedLM on text, 15% of tokens
            masked), ``"vit"`` (ViTForImageClassification), ``"mlp"``, ``"vgg11"``,
            ``"vgg16"``, ``"resnet20"`` (the convnet family) on images.
        data: a dataset name (see :data:`glmc.data.DATASETS`) or a path.
        seed: initialisation, batch order and dropout.
        data_seed: the train/val/test split of image datasets (text splits are contiguous). Keep
            it fixed across models that will be compared, so they share their test set.
        n_layer, n_embd, n_head: depth, residual width ``d``, attention heads (must divide ``d``).
        n_inner: MLP hidden width; ``None`` means ``4 * n_embd`` (Llama: 8/3 of it).
        n_kv_head: Llama's key/value heads (grouped-query attention; must divide ``n_head``);
            ``None``: one per two query heads.
        context: GPT-2 window length ``T`` (also its ``n_positions``); ignored for ViT.
        patch_size: ViT patch side; must divide the image side. Ignored for GPT-2.
        width: channel (or unit) multiplier of the convnets (mlp, vgg, resnet20).
        norm: the convnets' norm: ``"batch"``, ``"layer"`` (over channels, as Git Re-Basin's
            width sweep) or ``"none"`` (the MLP has none).
        base: the convnets' first-stage channels (VGG 64, ResNet-20 16, MLP 512 units) before
            ``width``; ``None``: the architecture's own.
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
    """

    arch: str
    data: str
    seed: int = 0
    data_seed: int = 0
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_inner: int | None = None
    n_kv_head: int | None = None
    context: int = 64
    patch_size: int = 4
    width: int = 1
    norm: str = "batch"
    base: int | None = None
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

    @property
    def mlp_width(self) -> int:
        """The MLP hidden width actually used."""
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @property
    def warmup_steps(self) -> int:
        """The warm-up length actually used."""
        return self.warmup if self.warmup is not None else self.steps // 20

    @property
    def num_threads(self) -> int:
        """The thread count actually used."""
        return self.threads if self.threads is not None else (os.cpu_count() or 1)

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "training config") -> TrainConfig:
        """Rebuild from :meth:`to_json` output (unknown keys are an error)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise GlmcError(f"{source}: unknown training option {unknown[0]!r}")
        try:
            return cls(**data)
        except TypeError as e:
            raise GlmcError(f"{source}: invalid training config ({e})") from None

    def identity(self) -> dict[str, Any]:
        """The fields that must agree for a checkpoint to be resumed (all but runtime ones)."""
        return {k: v for k, v in self.to_json().items() if k not in RUNTIME_FIELDS}

    def validate(self) -> None:
        """Raise GlmcError on an impossible option (checked before any data is read)."""
        if self.arch not in ARCHS:
            raise GlmcError(f"unknown architecture {self.arch!r}: choose one of {', '.join(ARCHS)}")
        positive = {
            "n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head,
            "context": self.context, "patch_size": self.patch_size, "steps": self.steps,
            "batch_size": self.batch_size, "eval_batches": self.eval_batches,
            "log_every": self.log_every,
        }
        if self.n_inner is not None:
            positive["n_inner"] = self.n_inner
        if self.n_kv_head is not None:
            positive["n_kv_head"] = self.n_kv_head
        positive["width"] = self.width
        if self.base is not None:
            positive["base"] = self.base
        if self.norm not in NORMS:
            raise GlmcError(f"norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
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
        if self.n_embd % self.n_head:
            raise GlmcError(
                f"n_head {self.n_head} does not divide n_embd {self.n_embd} (head width must be "
                "an integer)"
            )
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise GlmcError(f"n_kv_head {self.n_kv_head} does not divide n_head {self.n_head} "
                            "(each key/value head serves a whole group of query heads)")
        if not self.lr > 0:
            raise GlmcError(f"lr must be positive, got {self.lr}")
        if not 0 <= self.dropout < 1:
            raise GlmcError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.warmup_steps > self.steps:
            raise GlmcError(f"warmup {self.warmup_steps} exceeds steps {self.steps}")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise GlmcError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


def check_train_output(out: str | Path, cfg: TrainConfig, force: bool) -> None:
    """``out`` can take the model folder (a non-empty one needs ``force``) and is not the
    data (torch-free: the command line checks it before loading torch)."""
    from glmc.data.catalog import DATASETS
    from glmc.io.outputs import check_output

    named = cfg.data.lower() in DATASETS  # (a name, not a path, even where a file has it)
    check_output(out, force=force, inputs=() if named else (cfg.data,))
