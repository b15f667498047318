"""Text as a masked-language model reads it: BERT's masking of a token stream.

Each token of a window is chosen with probability ``rate`` (15%); a chosen token becomes the
mask token 80% of the time, a uniformly random token 10% and stays as it is 10% (the 80/10/10
rule); the targets are the chosen tokens' ids and ``IGNORE`` (-100, what ``cross_entropy``
skips) everywhere else. Evaluation masks with a generator seeded by ``seed``, restarted at
every pass, so every model and every point of a path is scored on the same masked tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch

from glmc.data.text import TextDataset

#: The target of a position that is not scored (torch's ``cross_entropy`` default).
IGNORE = -100
MASK_RATE = 0.15


def mask_tokens(x: torch.Tensor, mask_id: int, n_random: int, generator: torch.Generator,
                rate: float = MASK_RATE) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of token ids ``x`` (B, T): the 80/10/10 rule on a ``rate`` share.

    ``n_random``: random replacements are drawn from ids [0, n_random) (the tokenizer's, so
    never the mask token itself). At least one token of the batch is chosen."""
    chosen = torch.rand(x.shape, generator=generator) < rate
    if not chosen.any():
        chosen.view(-1)[0] = True
    action = torch.rand(x.shape, generator=generator)
    random = torch.randint(n_random, x.shape, generator=generator)
    inputs = torch.where(chosen & (action < 0.8), mask_id, x)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random, inputs)
    return inputs, torch.where(chosen, x, IGNORE)


@dataclass
class MaskedText(TextDataset):
    """A text dataset whose batches are masked for a masked-language model (its tokens and
    splits are the text's own; only :meth:`batches` and :meth:`eval_batches` differ)."""

    mask_id: int = 0
    seed: int = 0

    @classmethod
    def of(cls, text: TextDataset, mask_id: int, seed: int = 0) -> MaskedText:
        if isinstance(text, MaskedText):
            text = text.text()
        own = {f.name: getattr(text, f.name) for f in fields(TextDataset)}
        return cls(**own, mask_id=mask_id, seed=seed)

    def text(self) -> TextDataset:
        """The unmasked dataset."""
        return TextDataset(**{f.name: getattr(self, f.name) for f in fields(TextDataset)})

    def batches(self, split: str, batch_size: int, context: int | None = None,
                generator: torch.Generator | None = None,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless random windows of ``split``, masked with ``generator``'s draws (so a
        stream restored to a generator state replays the same masks)."""
        g = generator if generator is not None else torch.Generator().manual_seed(self.seed)
        for x, _ in super().batches(split, batch_size, context, g):
            yield mask_tokens(x, self.mask_id, self.vocab_size, g)

    def eval_batches(self, split: str, batch_size: int, context: int | None = None,
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The ordered windows of ``split``, masked with a generator seeded by ``seed``."""
        g = torch.Generator().manual_seed(self.seed)
        for x, _ in super().eval_batches(split, batch_size, context):
            yield mask_tokens(x, self.mask_id, self.vocab_size, g)
