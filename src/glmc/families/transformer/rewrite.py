"""Function-preserving rewrites shared by importers: centring writers, folding norms, and the
attention biases the softmax does not see."""

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


def settle_attention_biases(state: dict[str, torch.Tensor], n_layer: int) -> None:
    """In place: every key bias zero, every value bias moved into the output bias.

    A key bias adds (query)·b_k to every score of a query, the same for all keys: the softmax
    ignores it. A value bias adds O·b_v to the output, as the attention weights sum to one. In
    canonical form neither is a parameter to match or to interpolate (the merge would average
    numbers the function never reads), so both become zero; the stock classes keep the slots.
    """
    for i in range(n_layer):
        a = f"blocks.{i}.attn"
        state[f"{a}.o.bias"] = state[f"{a}.o.bias"] + state[f"{a}.o.weight"] @ state[f"{a}.v.bias"]
        state[f"{a}.k.bias"] = torch.zeros_like(state[f"{a}.k.bias"])
        state[f"{a}.v.bias"] = torch.zeros_like(state[f"{a}.v.bias"])


#: ln_f's β stays a residual vector, ``norm_f.bias = β/γ``, only when every |γ_i| is at least
#: this fraction of rms(γ). A smaller γ_i blows β_i/γ_i up (10⁴ times the rest for
#: γ_i = 10⁻⁴·rms(γ)): one huge, badly conditioned coordinate that matching and interpolation
#: then mix into well-scaled ones. Below it β goes into an LM-head bias instead (exact, but the
#: stock lm_head has no bias, so such a model is exported as a glmc folder).
NORM_F_BIAS_MIN_GAMMA = 1e-2


def norm_f_bias_conditioned(gamma: torch.Tensor) -> bool:
    """Whether β/γ is well conditioned: every |γ_i| >= NORM_F_BIAS_MIN_GAMMA·rms(γ), γ (d,)."""
    rms = gamma.double().square().mean().sqrt()
    return bool(rms > 0) and bool((gamma.double().abs() >= NORM_F_BIAS_MIN_GAMMA * rms).all())


def fold_final_norm(head: torch.Tensor, gamma: torch.Tensor,
                    beta: torch.Tensor) -> dict[str, torch.Tensor]:
    """The final LayerNorm folded into a head without a bias: ``head.weight`` = head·diag γ,
    and β kept as the residual vector ``norm_f.bias`` = β/γ when γ is well conditioned (the
    model stays its stock class), else ``head.bias`` = head·β (exact; no stock equivalent)."""
    out = {"head.weight": head * gamma[None, :]}
    if norm_f_bias_conditioned(gamma):
        out["norm_f.bias"] = beta / gamma
    else:  # γ has (near-)zeros: β's effect lives in the logits
        out["head.bias"] = head @ beta
    return out
