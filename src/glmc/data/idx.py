"""IDX files (the MNIST / Fashion-MNIST format) and folders of them.

An IDX file is: two zero bytes, a type byte (``0x08`` = unsigned byte), the number of dimensions
``d``, then ``d`` big-endian uint32 sizes, then the values in C order. Files may be gzipped.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np

from glmc.data._files import FASHION_MNIST_INSTALL, read_bytes
from glmc.data.images import ImageDataset, image_dataset, to_labels, to_nchw, to_unit_float
from glmc.data.splits import carve_validation
from glmc.errors import GlmcError

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_NAME = re.compile(
    r"^(?P<split>train|t10k|test)[-_.](?P<kind>images|labels)[-_.]idx[13][-_.]ubyte(\.gz)?$"
)


def read_idx(path: Path) -> np.ndarray:
    """Read an unsigned-byte IDX file (gzipped or not) into a uint8 array of its stored shape.

    Raises:
        GlmcError: the file is not a well-formed unsigned-byte IDX file.
    """
    data = read_bytes(path)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as error:
            raise GlmcError(f"{path} is a corrupt gzip file: {error}") from error
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise GlmcError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise GlmcError(f"{path} is not an IDX file (truncated header)")
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(shape))
    if len(data) - header != expected:
        raise GlmcError(
            f"{path} holds {len(data) - header} values but its header says {shape} ({expected})"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def find_idx_files(folder: Path) -> dict[tuple[str, str], Path]:
    """Map ``(split, kind)`` to the IDX files in ``folder``.

    ``split`` is ``train`` or ``test`` and ``kind`` is ``images`` or ``labels``.

    Accepts the usual names, e.g. ``train-images-idx3-ubyte.gz`` or ``t10k-labels.idx1-ubyte``.

    Raises:
        GlmcError: one of the four files is missing.
    """
    found: dict[tuple[str, str], Path] = {}
    for path in sorted(folder.iterdir()):
        if match := IDX_NAME.match(path.name):
            split = "train" if match["split"] == "train" else "test"
            found.setdefault((split, match["kind"]), path)
    missing = [
        f"{s}-{k}" for s in ("train", "test") for k in ("images", "labels") if (s, k) not in found
    ]
    if missing:
        raise GlmcError(
            f"{folder} lacks IDX files for {', '.join(missing)} (expected names like "
            "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
            "t10k-labels-idx1-ubyte.gz)"
        )
    return found


def load_idx_folder(folder: Path, name: str, seed: int = 0) -> ImageDataset:
    """Load a folder of train/test IDX files; carve 1/12 of train (seeded) as validation.

    For Fashion-MNIST that gives 55,000/5,000/10,000 images of shape ``(1, 28, 28)``.
    """
    files = find_idx_files(folder)
    arrays = {}
    for split in ("train", "test"):
        images_path, labels_path = files[(split, "images")], files[(split, "labels")]
        images = to_unit_float(to_nchw(read_idx(images_path), str(images_path)), str(images_path))
        labels = to_labels(read_idx(labels_path), len(images), str(labels_path))
        arrays[split] = (images, labels)
    (train_x, train_y), (test_x, test_y) = arrays["train"], arrays["test"]
    keep, val = carve_validation(len(train_y), seed, source=str(folder))
    return image_dataset(
        name, [train_x[keep], train_x[val], test_x], [train_y[keep], train_y[val], test_y]
    )


def load_fashion_mnist(seed: int = 0) -> ImageDataset:
    """Fashion-MNIST (60k train + 10k test) from Debian's ``dataset-fashion-mnist`` package.

    Raises:
        GlmcError: the package's folder is absent; the message says how to install it.
    """
    if not FASHION_MNIST_DIR.is_dir():
        raise GlmcError(
            f"Fashion-MNIST not found in {FASHION_MNIST_DIR}: run `{FASHION_MNIST_INSTALL}` "
            "or pass a folder of IDX files as the dataset path"
        )
    return load_idx_folder(FASHION_MNIST_DIR, "fashion-mnist", seed)
