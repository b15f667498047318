"""The optimiser of a run: AdamW with decoupled weight decay, linear warm-up and cosine decay."""

from __future__ import annotations

from torch import nn
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from glmc.schedule import lr_factor
from glmc.training.options import TrainConfig


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
