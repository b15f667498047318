"""Function-preserving rewrites shared by importers: centring writers, folding norms."""

from __future__ import annotations

import torch


def centre(x: torch.Tensor, axis: int) -> torch.Tensor:
    """Project ``axis`` onto the complement of the all-ones direction (x <- C x)."""
    return x - x.mean(axis, keepdim=True)


def fold_norm(
    weight: torch.Tensor, bias: torch.Tensor | None, gamma: torch.Tensor, beta: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold a norm's affine (gamma, beta) into the Linear reader (weight (out, in)) after it.

    W·(γ⊙n + β) + b = (W·diag γ)·n + (b + W·β).
    """
    new_bias = torch.zeros(weight.shape[0], dtype=weight.dtype) if bias is None else bias.clone()
    if beta is not None:
        new_bias = new_bias + weight @ beta
    return weight * gamma[None, :], new_bias


def max_mean_along(x: torch.Tensor, axis: int) -> float:
    """Largest |mean| along ``axis`` relative to the tensor's scale (0 for a centred tensor)."""
    scale = x.abs().max().clamp_min(1e-30)
    return float((x.mean(axis).abs().max() / scale).item()) if x.numel() else 0.0
