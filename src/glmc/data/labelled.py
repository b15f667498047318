"""Labelled text for sequence classifiers: a ``.tsv`` file, one example per line.

Each line is ``LABEL<TAB>TEXT`` with LABEL a class index (0, 1, ...); the examples are cut
contiguously 90/5/5 into train/val/test, as every text file is. Each text is tokenised with
the model's tokenizer and cut to the context. Batches hold examples of one length only, so
nothing is padded: a classifier reads exactly the tokens of each example, as it would alone,
with no attention mask to agree on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from glmc.data._files import read_bytes
from glmc.data.splits import SPLITS, check_split, contiguous_sizes
from glmc.data.tokenizers import Tokenizer, make_tokenizer
from glmc.errors import GlmcError

Example = tuple[torch.Tensor, int]  # token ids (T,), class


@dataclass
class LabelledText:
    """Labelled token sequences by split.

    Attributes:
        name: the file it was read from.
        examples: split -> [(token ids (T,), class), ...] in the file's order.
        tokenizer: the tokenizer the texts were encoded with.
        num_classes: one more than the largest class index.
        context: the longest sequence kept (longer texts are cut to their first tokens).
    """

    name: str
    examples: dict[str, list[Example]]
    tokenizer: Tokenizer
    num_classes: int
    context: int | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def split(self, split: str) -> list[Example]:
        return self.examples[check_split(split)]

    def _groups(self, split: str, context: int | None) -> list[list[Example]]:
        """The split's examples cut to ``context`` tokens, grouped by length (each group in
        the file's order, groups by length)."""
        context = context or self.context
        by_length: dict[int, list[Example]] = {}
        for ids, label in self.split(split):
            ids = ids[:context] if context else ids
            by_length.setdefault(len(ids), []).append((ids, label))
        return [by_length[n] for n in sorted(by_length)]

    def batches(self, split: str, batch_size: int, context: int | None = None,
                generator: torch.Generator | None = None,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless random batches: a length drawn in proportion to its examples, then
        ``batch_size`` of its examples drawn with replacement. Yields ids (b, T), classes (b,)."""
        groups = self._groups(split, context)
        if not groups:
            raise GlmcError(f"{self.name}: the {split} split is empty")
        sizes = torch.tensor([len(g) for g in groups], dtype=torch.float64)
        while True:
            group = groups[int(torch.multinomial(sizes, 1, generator=generator))]
            pick = torch.randint(len(group), (batch_size,), generator=generator)
            yield _stack([group[int(i)] for i in pick])

    def eval_batches(self, split: str, batch_size: int, context: int | None = None,
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Every example of ``split`` once, in batches of one length (at most
        ``batch_size``). Yields ids (b, T), classes (b,)."""
        for group in self._groups(split, context):
            for start in range(0, len(group), batch_size):
                yield _stack(group[start:start + batch_size])


def _stack(examples: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.stack([ids for ids, _ in examples]),
            torch.tensor([label for _, label in examples], dtype=torch.long))


def load_labelled_text(path: Path, tokenizer: str | Tokenizer = "char",
                       context: int | None = None) -> LabelledText:
    """Read a ``.tsv`` of ``LABEL<TAB>TEXT`` lines (blank lines skipped).

    Raises:
        GlmcError: unreadable or not UTF-8, a line without a tab, a label that is not a
            class index, a text with no tokens, or a split with no example.
    """
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as error:
        raise GlmcError(f"{path} is not UTF-8 text (byte {error.start})") from error
    rows: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        label, sep, body = line.partition("\t")
        if not sep:
            raise GlmcError(f"{path}, line {number}: no tab (each line is LABEL<TAB>TEXT)")
        if not label.strip().isdigit():
            raise GlmcError(f"{path}, line {number}: label {label.strip()!r} is not a class "
                            "index (0, 1, ...)")
        rows.append((int(label), body))
    if not rows:
        raise GlmcError(f"{path} holds no labelled line (LABEL<TAB>TEXT)")
    tok = make_tokenizer(tokenizer, "".join(body for _, body in rows))
    examples = []
    for number, (label, body) in enumerate(rows, 1):
        ids = tok.encode(body)
        if ids.numel() == 0:
            raise GlmcError(f"{path}, example {number}: its text has no tokens")
        examples.append((ids, label))
    n_train, n_val, _ = contiguous_sizes(len(examples))
    cuts = {"train": examples[:n_train], "val": examples[n_train:n_train + n_val],
            "test": examples[n_train + n_val:]}
    for split in SPLITS:
        if not cuts[split]:
            raise GlmcError(f"{path}: {len(examples)} examples leave the {split} split empty "
                            "(the split is 90/5/5; give at least 20 lines)")
    return LabelledText(str(path), cuts, tok, 1 + max(label for label, _ in rows), context)
