"""The named datasets and :func:`load_dataset`, the single entry point for all of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from glmc.data.catalog import DATASETS, PATH_HELP
from glmc.data.csv_images import load_digits, load_mnist5k
from glmc.data.idx import load_fashion_mnist, load_idx_folder
from glmc.data.images import ImageDataset
from glmc.data.labelled import LabelledText, load_labelled_text
from glmc.data.npz import load_npz
from glmc.data.shakespeare import shakespeare_text
from glmc.data.text import TextDataset, text_dataset
from glmc.data.text_file import load_text_file
from glmc.data.tokenizers import TOKENIZER_KINDS, Tokenizer
from glmc.errors import GlmcError

Dataset = Union[TextDataset, ImageDataset, LabelledText]  # noqa: UP007 - a runtime alias

__all__ = ["DATASETS", "PATH_HELP", "Dataset", "load_dataset"]


def _shakespeare(seed: int, context: int | None, tokenizer: str | Tokenizer) -> TextDataset:
    del seed  # the split is contiguous, hence the same for every seed
    return text_dataset("shakespeare", shakespeare_text(), tokenizer, context)


@dataclass(frozen=True)
class _Entry:
    load: Callable[[int, int | None, str | Tokenizer], Dataset]
    is_text: bool = False


# The loaders of the datasets that glmc.data.catalog names and describes.
_ENTRIES: dict[str, _Entry] = {
    "shakespeare": _Entry(_shakespeare, is_text=True),
    "mnist5k": _Entry(lambda seed, context, tokenizer: load_mnist5k(seed)),
    "digits": _Entry(lambda seed, context, tokenizer: load_digits(seed)),
    "fashion-mnist": _Entry(lambda seed, context, tokenizer: load_fashion_mnist(seed)),
}


def load_dataset(
    name_or_path: str,
    *,
    seed: int = 0,
    context: int | None = None,
    tokenizer: str | Tokenizer = "char",
) -> Dataset:
    """Load a named dataset (see :data:`DATASETS`) or a dataset file.

    Args:
        name_or_path: a name from :data:`DATASETS` (case-insensitive; names win over files of
            the same name, so write ``./digits`` for such a file), or the path of a text file,
            a ``.tsv`` of labelled text (``LABEL<TAB>TEXT`` lines), an ``.npz`` archive, or a
            folder of IDX files.
        seed: chooses the shuffled splits of image datasets (text splits are contiguous).
        context: for text, the default window length, checked to fit every split.
            Ignored for images.
        tokenizer: ``"char"`` or ``"gpt2"``, or a tokenizer object (the one saved beside a
            model, so that text is encoded as the model was trained); text only.

    Returns:
        a :class:`TextDataset` or an :class:`ImageDataset`; the same arguments give the same data.

    Raises:
        GlmcError: unknown name, missing or malformed file, missing optional package.
    """
    if isinstance(tokenizer, str) and tokenizer not in TOKENIZER_KINDS:
        raise GlmcError(
            f"unknown tokenizer '{tokenizer}': choose one of {', '.join(TOKENIZER_KINDS)}"
        )
    if context is not None and context < 1:
        raise GlmcError(f"context must be at least 1, got {context}")
    entry = _ENTRIES.get(name_or_path.lower())
    if entry is not None:
        _check_tokenizer(name_or_path, tokenizer, entry.is_text)
        return entry.load(seed, context, tokenizer)
    path = _resolve(name_or_path)
    if path.is_dir():
        _check_tokenizer(name_or_path, tokenizer, is_text=False)
        return load_idx_folder(path, str(path), seed)
    if path.suffix.lower() == ".npz":
        _check_tokenizer(name_or_path, tokenizer, is_text=False)
        return load_npz(path, seed)
    if path.suffix.lower() == ".tsv":
        return load_labelled_text(path, tokenizer, context)
    return load_text_file(path, tokenizer, context)


def _resolve(name_or_path: str) -> Path:
    """The existing path ``name_or_path``, or a GlmcError listing the dataset names."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    raise GlmcError(
        f"no dataset named '{name_or_path}' and no such file (names: {', '.join(_ENTRIES)}; "
        f"or give {PATH_HELP})"
    )


def _check_tokenizer(name: str, tokenizer: str | Tokenizer, is_text: bool) -> None:
    """Reject a non-default tokenizer for image data."""
    if not is_text and tokenizer != "char" and isinstance(tokenizer, str):
        raise GlmcError(f"tokenizer '{tokenizer}' applies to text, but '{name}' holds images")
