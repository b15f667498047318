"""Tasks: what a model's inputs and outputs are, whatever its family.

A family's config names its task (``config.task``); the task knows which data fit the model,
how to batch and score them, and which inputs certify that a rewrite kept the function.
Evaluation, the barrier, certificates and training ask the task, never the architecture.

- ``causal_lm``: token ids (B, T) -> logits (B, T, V); loss per predicted token.
- ``image_classifier``: images (B, C, H, W) -> logits (B, classes); loss and top-1 accuracy
  per image.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from glmc.data import Dataset, TextDataset, check_images_fit, check_text_fits
from glmc.defaults import DEFAULT_IMAGE_BATCH, TEXT_LOGITS_BUDGET
from glmc.errors import GlmcError


class Task:
    """The interface a model presents to data. ``config`` is any family's config."""

    name: ClassVar[str]
    #: Reports an accuracy beside the loss.
    classifier: ClassVar[bool] = False
    #: Reads text (its splits are contiguous, no data seed); else images split by a seed.
    text: ClassVar[bool] = False
    #: Config fields two models must share to take the same inputs and give the same logits.
    interface: ClassVar[tuple[str, ...]] = ()

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        """Raise GlmcError unless ``dataset``'s ``split`` fits; the context to use (text)."""
        raise NotImplementedError

    def default_batch_size(self, config: Any, context: int | None) -> int:
        raise NotImplementedError

    def random_inputs(self, config: Any, n: int, seq: int, seed: int,
                      dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def context(self, config: Any) -> int | None:
        """The model's own window length (text), None for images."""
        return None

    def same_interface(self, a: Any, b: Any, where: str) -> None:
        """Raise unless models of configs ``a`` and ``b`` take the same inputs and outputs."""
        if a.task != b.task:
            raise GlmcError(f"{where}: models differ in task ({a.task} vs {b.task})")
        for k in self.interface:
            if getattr(a, k) != getattr(b, k):
                raise GlmcError(f"{where}: models differ in {k} ({getattr(a, k)} vs "
                                f"{getattr(b, k)})")


class CausalLM(Task):
    name = "causal_lm"
    text = True
    interface = ("vocab_size", "n_positions")

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        if not isinstance(dataset, TextDataset):
            raise GlmcError(f"{where} is a language model, but dataset '{dataset.name}' "
                            "holds images")
        context = config.n_positions if context is None else context
        if context < 1:
            raise GlmcError(f"context must be at least 1, got {context}")
        check_text_fits(dataset, config.vocab_size, context, config.n_positions)
        n = dataset.split(split).numel()
        if n < context + 1:
            raise GlmcError(f"dataset '{dataset.name}': the {split} split has {n} tokens, too "
                            f"few for context {context} (give a smaller --context)")
        return context

    def default_batch_size(self, config: Any, context: int | None) -> int:
        """As many windows as keep the logits under 2**25 floats (1 to 64)."""
        return max(1, min(64, TEXT_LOGITS_BUDGET // (max(context or 1, 1) * config.vocab_size)))

    def random_inputs(self, config: Any, n: int, seq: int, seed: int,
                      dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, config.vocab_size, (n, min(seq, config.n_positions)),
                             generator=g)

    def context(self, config: Any) -> int | None:
        return config.n_positions


class ImageClassifier(Task):
    name = "image_classifier"
    classifier = True
    interface = ("image_size", "num_channels", "num_labels")

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        if isinstance(dataset, TextDataset):
            raise GlmcError(f"{where} is an image classifier, but dataset '{dataset.name}' "
                            "holds text")
        check_images_fit(dataset, config.image_size, config.num_channels, config.num_labels)
        if len(dataset.split(split)[1]) == 0:
            raise GlmcError(f"dataset '{dataset.name}': the {split} split is empty")
        return None

    def default_batch_size(self, config: Any, context: int | None) -> int:
        return DEFAULT_IMAGE_BATCH

    def random_inputs(self, config: Any, n: int, seq: int, seed: int,
                      dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        shape = (n, config.num_channels, config.image_size, config.image_size)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


TASKS: dict[str, Task] = {t.name: t for t in (CausalLM(), ImageClassifier())}


def task_of(config: Any) -> Task:
    """The task of a model config (any family's)."""
    try:
        return TASKS[config.task]
    except KeyError:
        raise GlmcError(f"unknown task {config.task!r} (one of {', '.join(TASKS)})") from None
