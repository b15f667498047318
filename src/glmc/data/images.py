"""Labelled image datasets: :class:`ImageDataset`, normalisation, and batching."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from glmc.data.splits import check_split
from glmc.errors import GlmcError


@dataclass
class ImageDataset:
    """Images normalised per channel with the training mean and std, plus integer labels.

    Attributes:
        name: the dataset name or path it was loaded from.
        train, val, test: images, shape ``(n, C, H, W)`` with ``H == W``, dtype float32.
        train_labels, val_labels, test_labels: class ids, shape ``(n,)``, dtype long.
        num_classes: labels lie in ``[0, num_classes)``.
        mean, std: per-channel statistics of the raw training images (pixels in ``[0, 1]``),
            shape ``(C,)``; ``raw = image * std[:, None, None] + mean[:, None, None]``.
    """

    name: str
    train: torch.Tensor
    train_labels: torch.Tensor
    val: torch.Tensor
    val_labels: torch.Tensor
    test: torch.Tensor
    test_labels: torch.Tensor
    num_classes: int
    mean: torch.Tensor
    std: torch.Tensor

    @property
    def num_channels(self) -> int:
        """``C``."""
        return int(self.train.shape[1])

    @property
    def image_size(self) -> int:
        """Side length ``H == W`` in pixels."""
        return int(self.train.shape[2])

    def split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(images, labels)`` of ``split`` (``train``, ``val`` or ``test``)."""
        split = check_split(split)
        return getattr(self, split), getattr(self, f"{split}_labels")

    def batches(
        self,
        split: str,
        batch_size: int,
        context: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless shuffled batches from ``split``: epoch after epoch, reshuffled each epoch.

        Incomplete final batches are dropped so every batch has the same shape. ``context`` is
        accepted for symmetry with :class:`~glmc.data.TextDataset` and ignored.

        Yields:
            ``(x, y)``: images ``(batch_size, C, H, W)`` float32, labels ``(batch_size,)`` long.
        """
        del context
        images, labels = self.split(split)
        if not 1 <= batch_size <= len(labels):
            raise GlmcError(
                f"dataset '{self.name}': batch size {batch_size} does not fit the {split} split "
                f"of {len(labels)} images"
            )
        while True:
            order = torch.randperm(len(labels), generator=generator)
            for start in range(0, len(labels) - batch_size + 1, batch_size):
                index = order[start : start + batch_size]
                yield images[index], labels[index]

    def eval_batches(
        self, split: str, batch_size: int, context: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One ordered pass over ``split`` for evaluation; ``context`` is ignored.

        Yields:
            ``(x, y)`` with ``b <= batch_size`` rows (only the last batch may be smaller).
        """
        del context
        images, labels = self.split(split)
        for start in range(0, len(labels), batch_size):
            yield images[start : start + batch_size], labels[start : start + batch_size]


def to_nchw(images: np.ndarray, source: str) -> np.ndarray:
    """Return images as ``(N, C, H, W)`` from ``(N, H, W)``, ``(N, H, W, C)`` or ``(N, C, H, W)``.

    A 4-D array is read as channels-last when its last axis has 1, 3 or 4 entries and the middle
    axes are square, otherwise as channels-first.

    Raises:
        GlmcError: the layout is none of these or the images are not square.
    """
    if images.ndim == 3:
        images = images[:, None]
    elif images.ndim == 4:
        channels_last = images.shape[-1] in (1, 3, 4) and images.shape[1] == images.shape[2]
        if channels_last:
            images = images.transpose(0, 3, 1, 2)
    else:
        raise GlmcError(
            f"{source}: images have shape {images.shape}; expected (N, H, W), (N, H, W, C) "
            "or (N, C, H, W)"
        )
    if images.shape[2] != images.shape[3]:
        raise GlmcError(f"{source}: images of shape {images.shape[1:]} are not square")
    return images


def to_unit_float(images: np.ndarray, source: str) -> np.ndarray:
    """Pixels as float32: uint8 is divided by 255, floats are kept as they are.

    Raises:
        GlmcError: any other dtype.
    """
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if np.issubdtype(images.dtype, np.floating):
        return images.astype(np.float32)
    raise GlmcError(f"{source}: images have dtype {images.dtype}; expected uint8 or float")


def to_labels(labels: np.ndarray, n: int, source: str) -> np.ndarray:
    """Check labels are ``n`` non-negative integers, shape ``(n,)``; return them as int64."""
    labels = np.asarray(labels)
    integral = np.issubdtype(labels.dtype, np.integer) or (
        np.issubdtype(labels.dtype, np.floating) and np.array_equal(labels, np.round(labels))
    )
    if labels.shape != (n,) or not integral:
        raise GlmcError(
            f"{source}: labels have shape {labels.shape} and dtype {labels.dtype}; expected "
            f"({n},) integers, one per image"
        )
    labels = labels.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise GlmcError(f"{source}: labels must be >= 0, found {labels.min()}")
    return labels


def image_dataset(
    name: str,
    images: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    num_classes: int | None = None,
) -> ImageDataset:
    """Build an :class:`ImageDataset` from train/val/test arrays, normalising with train stats.

    Args:
        name: dataset name or source path.
        images: three float32 arrays ``(n, C, H, W)`` with pixels in ``[0, 1]`` (train, val, test).
        labels: three int64 arrays ``(n,)``.
        num_classes: defaults to ``max(label) + 1`` over all splits.
    """
    train = torch.from_numpy(np.ascontiguousarray(images[0]))
    mean = train.mean(dim=(0, 2, 3))
    std = train.std(dim=(0, 2, 3)).clamp_min(1e-6)
    scale = (mean[:, None, None], std[:, None, None])
    tensors = [(torch.from_numpy(np.ascontiguousarray(x)) - scale[0]) / scale[1] for x in images]
    targets = [torch.from_numpy(np.ascontiguousarray(y)) for y in labels]
    if num_classes is None:
        num_classes = int(max(int(y.max()) for y in targets if y.numel())) + 1
    return ImageDataset(
        name,
        tensors[0],
        targets[0],
        tensors[1],
        targets[1],
        tensors[2],
        targets[2],
        num_classes,
        mean,
        std,
    )
