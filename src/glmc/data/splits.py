"""Seeded, reproducible train/val/test splits shared by all loaders."""

from __future__ import annotations

import numpy as np

from glmc.errors import GlmcError

SPLITS: tuple[str, ...] = ("train", "val", "test")


def check_split(split: str) -> str:
    """Return ``split`` if it is ``train``, ``val`` or ``test``; raise GlmcError otherwise."""
    if split not in SPLITS:
        raise GlmcError(f"unknown split '{split}': choose one of {', '.join(SPLITS)}")
    return split


def contiguous_sizes(n: int, train: float = 0.9, val: float = 0.05) -> tuple[int, int, int]:
    """Sizes of a contiguous train/val/test cut of ``n`` items; the test split takes the rest.

    ``train = int(train * n)`` and ``val = int(val * n)``, as in nanoGPT's 90% cut.
    """
    n_train = int(train * n)
    n_val = int(val * n)
    return n_train, n_val, n - n_train - n_val


def shuffled_split(
    n: int, seed: int, val: float = 0.1, test: float = 0.1, source: str = "dataset"
) -> list[np.ndarray]:
    """Shuffle ``range(n)`` with ``seed`` and cut it into train/val/test index arrays.

    ``val`` and ``test`` are fractions of ``n`` (rounded, at least 1 each); train takes the rest.
    ``source`` names the data in errors.

    Returns:
        three int64 index arrays ``[train, val, test]``, shapes ``(n_train,)``, ``(n_val,)``,
        ``(n_test,)``.
    """
    n_val = max(1, round(val * n))
    n_test = max(1, round(test * n))
    if n - n_val - n_test < 1:
        raise GlmcError(f"{source}: {n} examples are too few for a train/val/test split")
    order = np.random.default_rng(seed).permutation(n)
    return [order[n_val + n_test :], order[:n_val], order[n_val : n_val + n_test]]


def carve_validation(
    n: int, seed: int, fraction: float = 1 / 12, source: str = "dataset"
) -> tuple[np.ndarray, np.ndarray]:
    """Split an official training set of ``n`` examples into train and validation indices.

    The validation part is ``max(1, n * fraction)`` examples (5,000 of Fashion-MNIST's 60,000),
    chosen with ``seed``.

    Returns:
        ``(train_indices, val_indices)``, int64 arrays of shapes ``(n - n_val,)`` and ``(n_val,)``.
    """
    n_val = max(1, int(n * fraction))
    if n - n_val < 1:
        raise GlmcError(
            f"{source}: {n} training examples are too few to carve out a validation split"
        )
    order = np.random.default_rng(seed).permutation(n)
    return order[n_val:], order[:n_val]
