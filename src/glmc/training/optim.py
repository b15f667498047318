"""The optimiser of a run: AdamW with decoupled weight decay, linear warm-up and cosine decay."""

from __future__ import annotations

import math

from torch import nn
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from glmc.training.options import TrainConfig


def lr_factor(update: int, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate for update ``update`` (0-based).

    Linear warm-up ``1/warmup, 2/warmup, ..., 1``, then a half cosine from 1 towards 0 over the
    remaining ``total - warmup`` updates (the last update still has a small positive rate).
    """
    if update < warmup:
        return (update + 1) / warmup
    progress = (update - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> tuple[AdamW, LambdaLR]:
    """AdamW (decay on matrices, embeddings and the patch kernel; none on biases and norms)
    and its warm-up + cosine LambdaLR schedule."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    plain = [p for p in model.parameters() if p.ndim < 2]
    opt = AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay},
         {"params": plain, "weight_decay": 0.0}],
        lr=cfg.lr,
    )
    warmup, total = cfg.warmup_steps, cfg.steps
    return opt, LambdaLR(opt, lambda update: lr_factor(update, warmup, total))
