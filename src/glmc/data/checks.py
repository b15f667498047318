"""Checks that a dataset fits a model, run before training or evaluation."""

from __future__ import annotations

from glmc.data.images import ImageDataset
from glmc.data.text import TextDataset
from glmc.errors import GlmcError


def check_text_fits(
    dataset: TextDataset,
    vocab_size: int,
    context: int | None = None,
    max_positions: int | None = None,
) -> None:
    """Raise GlmcError unless a model with ``vocab_size`` tokens (and ``max_positions``) fits.

    Args:
        dataset: a text dataset.
        vocab_size: the model's vocabulary (embedding rows); must cover the tokenizer's ids.
        context: the window length to be used (defaults to ``dataset.context``).
        max_positions: the model's longest supported sequence, if it has one.
    """
    if not isinstance(dataset, TextDataset):
        raise GlmcError(f"dataset '{dataset.name}' holds images, but the model expects text")
    if dataset.vocab_size > vocab_size:
        raise GlmcError(
            f"dataset '{dataset.name}' uses {dataset.vocab_size} token ids "
            f"({dataset.tokenizer.kind} tokenizer) but the model's vocabulary has {vocab_size}"
        )
    context = dataset.context if context is None else context
    if context is not None and max_positions is not None and context > max_positions:
        raise GlmcError(
            f"context {context} for dataset '{dataset.name}' exceeds the model's "
            f"{max_positions} positions"
        )


def check_images_fit(
    dataset: ImageDataset,
    image_size: int,
    num_channels: int,
    num_classes: int | None = None,
) -> None:
    """Raise GlmcError unless the images are ``num_channels x image_size x image_size``.

    Args:
        dataset: an image dataset.
        image_size: the side length the model expects.
        num_channels: the channels the model expects.
        num_classes: the model's number of outputs, if it should be checked too; it must be at
            least the dataset's number of classes.
    """
    if not isinstance(dataset, ImageDataset):
        raise GlmcError(f"dataset '{dataset.name}' holds text, but the model expects images")
    have = (dataset.num_channels, dataset.image_size, dataset.image_size)
    want = (num_channels, image_size, image_size)
    if have != want:
        raise GlmcError(
            f"dataset '{dataset.name}' has {'x'.join(map(str, have))} images but the model "
            f"expects {'x'.join(map(str, want))}"
        )
    if num_classes is not None and dataset.num_classes > num_classes:
        raise GlmcError(
            f"dataset '{dataset.name}' has {dataset.num_classes} classes but the model "
            f"outputs {num_classes}"
        )
