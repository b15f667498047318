"""The learning-rate schedule that training and learned matching share."""

from __future__ import annotations

import math


def lr_factor(update: int, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate for update ``update`` (0-based).

    Linear warm-up ``1/warmup, 2/warmup, ..., 1``, then a half cosine from 1 towards 0 over the
    remaining ``total - warmup`` updates (the last update still has a small positive rate).
    """
    if update < warmup:
        return (update + 1) / warmup
    progress = (update - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
