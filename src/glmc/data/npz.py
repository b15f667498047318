"""Image datasets stored as a NumPy ``.npz`` archive."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from glmc.data.images import ImageDataset, image_dataset, to_labels, to_nchw, to_unit_float
from glmc.data.splits import carve_validation, shuffled_split
from glmc.errors import GlmcError

IMAGE_KEYS = ("x", "images")
LABEL_KEYS = ("y", "labels")
PRESPLIT_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _pick(archive: np.lib.npyio.NpzFile, keys: tuple[str, ...], path: Path) -> np.ndarray:
    """The array stored under the first of ``keys`` present in the archive."""
    for key in keys:
        if key in archive.files:
            return archive[key]
    raise GlmcError(
        f"{path} has arrays {sorted(archive.files)}; expected one of {', '.join(keys)} "
        f"(or {', '.join(PRESPLIT_KEYS)})"
    )


def _images_and_labels(images: np.ndarray, labels: np.ndarray, source: str):
    """Normalise layout and dtype; returns ``(N, C, H, W)`` float32 and ``(N,)`` int64."""
    images = to_unit_float(to_nchw(images, source), source)
    return images, to_labels(labels, len(images), source)


def load_npz(path: Path, seed: int = 0) -> ImageDataset:
    """Load images and labels from ``path``.

    Accepted contents: ``x``/``images`` with ``y``/``labels`` (shuffled with ``seed`` and split
    80/10/10), or Keras-style ``x_train``, ``y_train``, ``x_test``, ``y_test`` (1/12 of train
    becomes validation). Images may be ``(N, H, W)``, ``(N, H, W, C)`` or ``(N, C, H, W)``;
    uint8 pixels are scaled to ``[0, 1]``.

    Raises:
        GlmcError: the file is not a readable npz or its arrays do not fit this description.
    """
    source = str(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            if all(key in archive.files for key in PRESPLIT_KEYS):
                train = _images_and_labels(archive["x_train"], archive["y_train"], source)
                test = _images_and_labels(archive["x_test"], archive["y_test"], source)
                keep, val = carve_validation(len(train[1]), seed, source=source)
                images = [train[0][keep], train[0][val], test[0]]
                labels = [train[1][keep], train[1][val], test[1]]
            else:
                x, y = _images_and_labels(
                    _pick(archive, IMAGE_KEYS, path), _pick(archive, LABEL_KEYS, path), source
                )
                parts = shuffled_split(len(y), seed, source=source)
                images, labels = [x[p] for p in parts], [y[p] for p in parts]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise GlmcError(f"{path} is not a readable .npz archive: {error}") from error
    if images[0].shape[1:] != images[2].shape[1:]:
        raise GlmcError(
            f"{path}: train images {images[0].shape[1:]} and test images {images[2].shape[1:]} "
            "differ in shape"
        )
    return image_dataset(source, images, labels)
