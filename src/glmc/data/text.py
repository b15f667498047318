"""Token-stream datasets for language models: :class:`TextDataset` and its batching."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from glmc.data.splits import SPLITS, check_split, contiguous_sizes
from glmc.data.tokenizers import Tokenizer, make_tokenizer
from glmc.errors import GlmcError


@dataclass
class TextDataset:
    """A tokenised corpus cut into contiguous train/val/test token streams.

    Attributes:
        name: the dataset name or path it was loaded from.
        train: token ids, shape ``(n_train,)``, dtype long.
        val: token ids, shape ``(n_val,)``, dtype long.
        test: token ids, shape ``(n_test,)``, dtype long.
        tokenizer: turns text into ids and back; save it with
            :func:`glmc.data.save_tokenizer`.
        context: default window length ``T`` for :meth:`batches` and :meth:`eval_batches`
            (``None``: callers must pass one).
    """

    name: str
    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    tokenizer: Tokenizer
    context: int | None = None

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can produce."""
        return self.tokenizer.vocab_size

    def split(self, split: str) -> torch.Tensor:
        """The token stream of ``split`` (``train``, ``val`` or ``test``), shape ``(n,)``."""
        return getattr(self, check_split(split))

    def _window(self, split: str, context: int | None) -> tuple[torch.Tensor, int]:
        """Return the stream and the window length, checking the stream holds one window + 1."""
        context = self.context if context is None else context
        if context is None or context < 1:
            raise GlmcError(f"dataset '{self.name}': give a context length of at least 1")
        data = self.split(split)
        if data.numel() < context + 1:
            raise GlmcError(
                f"dataset '{self.name}': the {split} split has {data.numel()} tokens, too few "
                f"for context {context} (needs at least {context + 1})"
            )
        return data, context

    def batches(
        self,
        split: str,
        batch_size: int,
        context: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless random next-token batches from ``split``.

        Each row is a window starting at a uniformly random offset; ``y`` is ``x`` shifted by one
        token. Pass a seeded ``generator`` for reproducible batches.

        Yields:
            ``(x, y)``, both shape ``(batch_size, context)``, dtype long.
        """
        data, context = self._window(split, context)
        steps = torch.arange(context)
        while True:
            starts = torch.randint(data.numel() - context, (batch_size,), generator=generator)
            index = starts[:, None] + steps
            yield data[index], data[index + 1]

    def eval_batches(
        self, split: str, batch_size: int, context: int | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One ordered pass over ``split`` in non-overlapping windows, for evaluation.

        Window ``k`` covers tokens ``[k*T, (k+1)*T)`` and its targets ``[k*T+1, (k+1)*T+1)``;
        the final tokens that do not fill a whole window are left out.

        Yields:
            ``(x, y)``, both shape ``(b, context)`` with ``b <= batch_size`` (only the last
            batch may be smaller), dtype long.
        """
        data, context = self._window(split, context)
        n_windows = (data.numel() - 1) // context
        x = data[: n_windows * context].view(n_windows, context)
        y = data[1 : n_windows * context + 1].view(n_windows, context)
        for start in range(0, n_windows, batch_size):
            yield x[start : start + batch_size], y[start : start + batch_size]


def text_dataset(
    name: str, text: str, tokenizer: str | Tokenizer = "char", context: int | None = None
) -> TextDataset:
    """Tokenise ``text`` and cut the ids contiguously 90/5/5 into train/val/test.

    Args:
        name: dataset name or source path, also used in error messages.
        text: the whole corpus.
        tokenizer: ``"char"`` (vocabulary = sorted characters of ``text``) or ``"gpt2"``.
        context: default window length; every split must hold at least ``context + 1`` tokens.

    Raises:
        GlmcError: the text is empty, or a split is too short for ``context``.
    """
    if not text:
        raise GlmcError(f"{name} is empty")
    tokens = make_tokenizer(tokenizer, text)
    ids = tokens.encode(text)
    n_train, n_val, _ = contiguous_sizes(ids.numel())
    train, val, test = ids[:n_train], ids[n_train : n_train + n_val], ids[n_train + n_val :]
    dataset = TextDataset(name, train, val, test, tokens, context)
    for split in SPLITS:
        dataset._window(split, context if context is not None else 1)
    return dataset
