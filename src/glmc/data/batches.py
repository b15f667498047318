"""Fixed batches of a dataset split: materialised once, so that every evaluation (every λ of a
path, every model of a comparison) sees exactly the same data."""

from __future__ import annotations

import math

import torch

from glmc.data.registry import Dataset
from glmc.data.text import TextDataset
from glmc.defaults import DEFAULT_TEXT_TOKENS
from glmc.errors import GlmcError

Batch = tuple[torch.Tensor, torch.Tensor]


def fixed_batches(
    dataset: Dataset,
    split: str,
    *,
    batch_size: int,
    context: int | None = None,
    max_batches: int | None = None,
) -> list[Batch]:
    """The evaluation batches, materialised once so every λ sees exactly the same data.

    Args:
        dataset: a text or image dataset.
        split: ``train``, ``val`` or ``test``.
        batch_size: windows (text) or images per batch.
        context: window length for text (ignored for images).
        max_batches: keep at most this many batches; None: the whole split for images, and
            for text the first ``DEFAULT_TEXT_TOKENS`` tokens (rounded up to whole batches);
            0: the whole split.

    Returns:
        ``[(x, y), ...]``: text ``(b, T)`` ids and ``(b, T)`` targets; images ``(b, C, H, W)``
        and ``(b,)`` labels.
    """
    if batch_size < 1:
        raise GlmcError(f"batch size must be at least 1, got {batch_size}")
    if max_batches is not None and max_batches < 0:
        raise GlmcError(f"max batches must be >= 0, got {max_batches}")
    if max_batches is None and isinstance(dataset, TextDataset):
        max_batches = math.ceil(DEFAULT_TEXT_TOKENS / (batch_size * (context or 1)))
    batches = []
    for batch in dataset.eval_batches(split, batch_size, context):
        if max_batches and len(batches) >= max_batches:
            break
        batches.append(batch)
    if not batches:
        raise GlmcError(f"dataset '{dataset.name}': nothing to evaluate in the {split} split")
    return batches
