"""A run's passes over its data: the resumable stream of training batches, and evaluation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from glmc.data import IGNORE, Dataset, TextDataset
from glmc.errors import GlmcError
from glmc.families.registry import arch_named
from glmc.training.options import TrainConfig


class BatchStream:
    """Training batches from ``ds.batches`` whose position can be saved and restored exactly.

    Image batches are drawn epoch by epoch from one permutation per epoch, so the generator state
    alone does not say where the stream is. The stream keeps the generator state from before the
    current epoch's first draw plus the number of batches served since; restoring replays at most
    one epoch of index arithmetic. Text batches are independent draws (an "epoch" of one batch).
    """

    def __init__(self, ds: Dataset, cfg: TrainConfig, generator: torch.Generator) -> None:
        self.ds, self.cfg, self.generator = ds, cfg, generator
        if isinstance(ds, TextDataset):
            self.per_epoch = 1
        else:
            self.per_epoch = max(1, ds.split("train")[1].numel() // cfg.batch_size)
        self.epoch_state = generator.get_state()
        self.offset = 0
        self._skip = 0
        self._it: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _iterator(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        context = self.cfg.context if isinstance(self.ds, TextDataset) else None
        return self.ds.batches("train", self.cfg.batch_size, context, self.generator)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``(x, y)`` training batch."""
        if self._it is None:
            self._it = self._iterator()
            for _ in range(self._skip):
                next(self._it)
            self._skip = 0
        if self.offset == self.per_epoch:  # the coming draw starts a new epoch
            self.offset = 0
            self.epoch_state = self.generator.get_state()
        batch = next(self._it)
        self.offset += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_state": self.epoch_state.clone(), "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch_state = state["epoch_state"].clone()
        self.offset = self._skip = int(state["offset"])
        self.generator.set_state(self.epoch_state)
        self._it = None


@torch.no_grad()
def evaluate(
    model: nn.Module, ds: Dataset, cfg: TrainConfig, split: str, max_batches: int | None = None
) -> dict[str, float]:
    """Mean cross-entropy and accuracy (next-token accuracy for text) over ``split``.

    Uses the ordered ``ds.eval_batches`` pass with ``cfg.batch_size`` rows per batch, stopping
    after ``max_batches`` batches (``None``: the whole split); means are per token / image.
    """
    arch = arch_named(cfg.arch)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    context = cfg.context if isinstance(ds, TextDataset) else None
    loss_sum, correct, count = 0.0, 0, 0
    for i, (x, y) in enumerate(ds.eval_batches(split, cfg.batch_size, context)):
        if max_batches is not None and i >= max_batches:
            break
        logits = arch.logits(model, x.to(device))
        flat, target = logits.reshape(-1, logits.shape[-1]).float(), y.to(device).reshape(-1)
        loss_sum += float(F.cross_entropy(flat, target, reduction="sum"))
        correct += int((flat.argmax(-1) == target).sum())
        count += int((target != IGNORE).sum())  # (a masked LM scores its masked tokens)
    model.train(was_training)
    if count == 0:
        raise GlmcError(f"dataset '{ds.name}': the {split} split is empty")
    return {"loss": loss_sum / count, "accuracy": correct / count}
