"""Tokenizers for text datasets, and saving/loading them beside a model.

Three kinds exist: :class:`CharTokenizer` (one id per character of a fixed vocabulary),
:class:`Gpt2Tokenizer` (GPT-2's byte-level BPE, see :mod:`glmc.data.gpt2_bpe`) and
:class:`HFTokenizer` (a checkpoint's own ``tokenizer.json``, read by the ``tokenizers`` package
that transformers depends on). Each turns text into a 1-D ``torch.long`` tensor and back. The
first two serialise to a small JSON document whose ``"type"`` field says which kind it is
(``glmc_tokenizer.json``); a Hugging Face tokenizer is its own ``tokenizer.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from glmc.errors import GlmcError
from glmc.io.atomic import write_text

TOKENIZER_FILE = "glmc_tokenizer.json"
#: A Hugging Face checkpoint's tokenizer, read when a folder holds no glmc tokenizer.
HF_TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_KINDS: tuple[str, ...] = ("char", "gpt2")


class Tokenizer(Protocol):
    """What models and datasets need from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> torch.Tensor: ...

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str: ...

    def to_json(self) -> str: ...


def fits_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> bool:
    """Whether a model with ``vocab_size`` embedding rows reads this tokenizer's ids as its
    own: the same count, or for a checkpoint's own tokenizer at most as many (checkpoints pad
    their embedding, Pythia's to 50,304 rows for 50,277 tokens)."""
    if getattr(tokenizer, "padded", False):
        return tokenizer.vocab_size <= vocab_size
    return tokenizer.vocab_size == vocab_size


def _id_list(ids: torch.Tensor | Sequence[int], vocab_size: int) -> list[int]:
    """Flatten ``ids`` (any shape) to a list of ints, checking each lies in ``[0, vocab_size)``."""
    values = ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
    bad = [i for i in values if not 0 <= i < vocab_size]
    if bad:
        raise GlmcError(f"token id {bad[0]} is outside the vocabulary of size {vocab_size}")
    return values


@dataclass(frozen=True)
class CharTokenizer:
    """Character-level tokenizer: id ``i`` is the ``i``-th character of ``chars``.

    Attributes:
        chars: the vocabulary, distinct characters in id order (sorted for datasets built here).
    """

    chars: str
    kind: str = field(default="char", init=False)
    _codes: np.ndarray = field(init=False, repr=False, compare=False)
    _ids: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.chars or len(set(self.chars)) != len(self.chars):
            raise GlmcError(
                "a character vocabulary must be a non-empty string of distinct characters"
            )
        codes = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        order = np.argsort(codes)
        object.__setattr__(self, "_codes", codes[order])
        object.__setattr__(self, "_ids", order.astype(np.int64))

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Vocabulary = the sorted set of characters of ``text``."""
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        """Number of distinct characters."""
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """Encode ``text`` to ids, shape ``(len(text),)``, dtype long.

        Raises:
            GlmcError: ``text`` holds a character outside the vocabulary.
        """
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        pos = np.searchsorted(self._codes, codes).clip(max=len(self._codes) - 1)
        unknown = np.flatnonzero(self._codes[pos] != codes)
        if unknown.size:
            char = text[int(unknown[0])]
            raise GlmcError(
                f"character {char!r} (U+{ord(char):04X}) is not in the "
                f"{self.vocab_size}-character vocabulary"
            )
        return torch.from_numpy(self._ids[pos])

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Decode ids (any shape, flattened in order) back to text."""
        return "".join(self.chars[i] for i in _id_list(ids, self.vocab_size))

    def to_json(self) -> str:
        """Serialise as ``{"type": "char", "chars": ...}``."""
        return json.dumps({"type": "char", "chars": self.chars}, ensure_ascii=False)


@dataclass(frozen=True)
class Gpt2Tokenizer:
    """GPT-2 byte-level BPE (tiktoken's ``r50k_base``, 50,257 tokens), built from a local file.

    Attributes:
        encoding: the ``tiktoken.Encoding``, from :func:`glmc.data.gpt2_bpe.gpt2_encoding`.
    """

    encoding: Any
    kind: str = field(default="gpt2", init=False)

    @property
    def vocab_size(self) -> int:
        """50,257 for GPT-2."""
        return int(self.encoding.n_vocab)

    def encode(self, text: str) -> torch.Tensor:
        """Encode ``text`` (special tokens are treated as plain text) to shape ``(n_tokens,)``."""
        return torch.tensor(self.encoding.encode_ordinary(text), dtype=torch.long)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        """Decode ids (any shape, flattened in order) back to text."""
        return self.encoding.decode(_id_list(ids, self.vocab_size))

    def to_json(self) -> str:
        """Serialise as ``{"type": "gpt2", "encoding": "r50k_base"}`` (the BPE file stays out)."""
        return json.dumps({"type": "gpt2", "encoding": "r50k_base"})


@dataclass(frozen=True)
class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (a checkpoint's own tokenizer), used as it is: text is
    encoded without special tokens (the model reads the text's own tokens).

    Attributes:
        text: the file's contents (written into output folders unchanged).
    """

    text: str
    kind: str = field(default="hf", init=False)
    #: The model's embedding may have more rows than the tokenizer has tokens.
    padded: bool = field(default=True, init=False)
    _tokenizer: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        try:
            tok = _Tokenizer.from_str(self.text)
        except Exception as error:  # noqa: BLE001 - the user's file
            raise GlmcError(f"not a valid tokenizers file ({error})") from None
        object.__setattr__(self, "_tokenizer", tok)

    @property
    def vocab_size(self) -> int:
        """Tokens, added ones included."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self._tokenizer.encode(text, add_special_tokens=False).ids,
                            dtype=torch.long)

    def token_id(self, token: str) -> int | None:
        """The id of a (special) token such as ``[MASK]``, None when it has none."""
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        return self._tokenizer.decode(_id_list(ids, self.vocab_size), skip_special_tokens=False)

    def to_json(self) -> str:
        return self.text


def make_tokenizer(kind: str | Tokenizer, text: str) -> Tokenizer:
    """Build the tokenizer named ``kind`` (``"char"`` or ``"gpt2"``) for a corpus ``text``.

    A tokenizer object (e.g. the one saved beside a model) is used as it is.
    """
    if not isinstance(kind, str):
        return kind
    if kind == "char":
        return CharTokenizer.from_text(text)
    if kind == "gpt2":
        from glmc.data.gpt2_bpe import gpt2_encoding

        return Gpt2Tokenizer(gpt2_encoding())
    raise GlmcError(f"unknown tokenizer '{kind}': choose one of {', '.join(TOKENIZER_KINDS)}")


def tokenizer_from_json(text: str, source: str = "tokenizer JSON") -> Tokenizer:
    """Rebuild a tokenizer from :meth:`to_json` output, or a Hugging Face ``tokenizer.json``;
    ``source`` names the file in errors."""
    try:
        data = json.loads(text)
        if isinstance(data, dict) and "model" in data and "type" not in data:
            try:
                return HFTokenizer(text)
            except GlmcError as error:
                raise GlmcError(f"{source}: {error}") from None
        kind = data["type"]
        if kind == "char":
            return CharTokenizer(str(data["chars"]))
    except (ValueError, KeyError, TypeError, GlmcError) as error:
        raise GlmcError(f"{source} is not a valid glmc tokenizer file ({error})") from error
    if kind == "gpt2":
        return make_tokenizer("gpt2", "")
    raise GlmcError(f"{source} has unknown tokenizer type {kind!r}")


def save_tokenizer(folder: str | Path, tokenizer: Tokenizer) -> Path:
    """Write ``folder/glmc_tokenizer.json`` atomically (temp file + rename, with the ordinary
    permissions of :func:`glmc.io.atomic.atomic_path`); return its path."""
    target = Path(folder) / TOKENIZER_FILE
    write_text(target, tokenizer.to_json())
    return target


def tokenizer_file(folder: str | Path) -> Path | None:
    """The tokenizer file a model folder holds: its ``glmc_tokenizer.json``, else a Hugging
    Face checkpoint's ``tokenizer.json``; None for neither."""
    for name in (TOKENIZER_FILE, HF_TOKENIZER_FILE):
        if (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def load_tokenizer(folder: str | Path) -> Tokenizer | None:
    """Load the tokenizer a model folder holds (see :func:`tokenizer_file`); ``None`` if it
    holds none.

    Raises:
        GlmcError: the file exists but is not a valid tokenizer file.
    """
    path = tokenizer_file(folder)
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise GlmcError(f"cannot read {path}: {error}") from error
    return tokenizer_from_json(text, source=str(path))
