"""What a training run is: :class:`TrainConfig` and its checks (defined, torch-free, in
:mod:`glmc.training.options`), the data it loads and the model config it implies (asked of the
architecture's family, :data:`glmc.families.ARCHS`)."""

from __future__ import annotations

from typing import Any

from glmc.data import Dataset, ImageDataset, TextDataset
from glmc.errors import GlmcError
from glmc.families.base import Arch
from glmc.families.registry import arch_named
from glmc.tasks import TASKS
from glmc.training.options import ARCHS, RUNTIME_FIELDS, TrainConfig

__all__ = ["ARCHS", "RUNTIME_FIELDS", "TrainConfig", "data_summary", "load_training_data",
           "model_config"]


def load_training_data(cfg: TrainConfig) -> Dataset:
    """Load ``cfg.data`` and check it suits ``cfg.arch``'s task (text or images).

    Raises:
        GlmcError: unreadable data, images for a language model or text for a classifier, a
            context longer than a split, a batch larger than the training images.
    """
    from glmc.data import load_dataset

    arch = arch_named(cfg.arch)
    text = TASKS[arch.task].text
    if not text and cfg.tokenizer != "char":
        raise GlmcError(f"--tokenizer {cfg.tokenizer} applies to text, but --arch {cfg.arch} "
                        "trains on images")
    ds = load_dataset(cfg.data, seed=cfg.data_seed, context=cfg.context if text else None,
                      tokenizer=cfg.tokenizer if text else "char")
    if text and not isinstance(ds, TextDataset):
        raise GlmcError(f"dataset '{ds.name}' holds images, but --arch {cfg.arch} trains on "
                        f"text (use an image architecture: {_others(text=False)})")
    if not text:
        if not isinstance(ds, ImageDataset):
            raise GlmcError(f"dataset '{ds.name}' holds text, but --arch {cfg.arch} trains on "
                            f"images (use {_others(text=True)})")
        n_train = int(ds.split("train")[1].numel())
        if cfg.batch_size > n_train:
            raise GlmcError(f"batch size {cfg.batch_size} exceeds the {n_train} training images "
                            f"of '{ds.name}'")
    return ds


def _others(text: bool) -> str:
    from glmc.families.registry import ARCHS as REGISTERED

    return ", ".join(f"--arch {a.name}" for a in REGISTERED.values() if TASKS[a.task].text == text)


def model_config(cfg: TrainConfig, ds: Dataset) -> tuple[Arch, Any]:
    """The architecture of ``cfg`` and the model config it trains on ``ds`` (sizes from the
    data)."""
    arch = arch_named(cfg.arch)
    return arch, arch.model_config(cfg, ds)


def check_fits(arch: Arch, config: Any, ds: Dataset, cfg: TrainConfig) -> None:
    """Raise GlmcError unless ``ds`` fits a model of ``config`` (e.g. a checkpoint's; a stock
    config names its sizes as the task reads them)."""
    task = TASKS[arch.task]
    task.check_fits(config, ds, "train", cfg.context if task.text else None,
                    f"--arch {arch.name}")


def data_summary(ds: Dataset) -> dict[str, Any]:
    """What the model saw of the data: sizes, and the tokenizer for text (JSON-ready)."""
    if isinstance(ds, TextDataset):
        return {
            "kind": "text", "name": ds.name, "tokenizer": ds.tokenizer.to_json(),
            "vocab_size": ds.vocab_size,
            "tokens": {s: int(ds.split(s).numel()) for s in ("train", "val", "test")},
        }
    return {
        "kind": "images", "name": ds.name, "image_size": ds.image_size,
        "num_channels": ds.num_channels, "num_classes": ds.num_classes,
        "images": {s: int(ds.split(s)[1].numel()) for s in ("train", "val", "test")},
    }
