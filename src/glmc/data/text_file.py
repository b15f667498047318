"""Any UTF-8 text file as a character-level (or GPT-2 BPE) :class:`TextDataset`."""

from __future__ import annotations

from pathlib import Path

from glmc.data._files import read_bytes
from glmc.data.text import TextDataset, text_dataset
from glmc.data.tokenizers import Tokenizer
from glmc.errors import GlmcError


def load_text_file(
    path: Path, tokenizer: str | Tokenizer = "char", context: int | None = None
) -> TextDataset:
    """Read ``path`` as UTF-8, tokenise it, and cut it contiguously 90/5/5.

    With ``tokenizer="char"`` the vocabulary is the sorted set of the file's characters.

    Raises:
        GlmcError: the file is unreadable, not UTF-8, empty, or too short for ``context``.
    """
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as error:
        raise GlmcError(
            f"{path} is not UTF-8 text (byte {error.start}); use .npz for image data"
        ) from error
    return text_dataset(str(path), text, tokenizer, context)
