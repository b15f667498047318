"""Corrections of a merged model's statistics: BatchNorm reset and REPAIR.

Averaging two aligned networks shrinks the spread of every unit's activations (the units of A
and π(B) are correlated, not equal), and a BatchNorm's running statistics, interpolated like
weights, no longer describe the merged model's activations. Two corrections, each computed
on training batches after the interpolation:

- **reset** (``"reset"``): every BatchNorm's running mean and variance recomputed on the
  merged model (train-mode forward passes, the statistics averaged over the batches);
- **REPAIR** (``"repair"``, Jordan et al. 2023): every unit's output at the family's probes
  that carry an affine (``Family.probes``, ``Probe.affine``) rescaled so that its mean and
  standard deviation are the interpolation of A's and B's, λ·μ_A + (1 − λ)·μ_B and
  λ·σ_A + (1 − λ)·σ_B; the affine correction is folded into the probe's weight and bias, so
  the result is a plain model of the same shape.

Both work on any family that names its probes and uses torch's BatchNorm layers; neither
names an architecture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from glmc.defaults import CORRECTIONS
from glmc.errors import GlmcError
from glmc.families.base import Probe
from glmc.model import CanonicalModel

Batch = tuple[torch.Tensor, torch.Tensor]


def has_batchnorm(model: CanonicalModel) -> bool:
    """Whether the model keeps running statistics (its spec's buffers)."""
    return bool(model.spec.buffers)


def check_correction(model: CanonicalModel, how: str, where: str = "the model") -> None:
    """Raise GlmcError unless ``how`` applies to models like ``model`` (before any work)."""
    if how not in CORRECTIONS:
        raise GlmcError(f"unknown correction {how!r} (one of {', '.join(CORRECTIONS)})")
    if how == "reset" and not has_batchnorm(model):
        raise GlmcError(f"{where} has no BatchNorm layer: there are no statistics to reset "
                        "(REPAIR, --correction repair, rescales any model with probes)")
    if how == "repair" and not repair_probes(model):
        raise GlmcError(f"REPAIR needs the units' outputs, which the {model.family.name} "
                        f"family does not expose ({where})")


def statistics_note(model: CanonicalModel, how: str) -> str | None:
    """What a report says of the merged statistics: a BatchNorm model merged without a
    correction keeps interpolated running statistics, not recomputed ones."""
    if how == "none" and has_batchnorm(model):
        return ("BatchNorm running statistics are interpolated, not recomputed: the merged "
                "model's activations no longer have them (use --correction reset or repair)")
    return None


def _inputs(batches: Sequence[Batch], dtype: torch.dtype) -> list[torch.Tensor]:
    return [x.to(dtype) if x.is_floating_point() else x for x, _ in batches]


def repair_probes(model: CanonicalModel) -> list[Probe]:
    """The probes REPAIR rescales: those with an affine to fold the correction into (a probe
    of a residual stream after its addition, or of a layer's input, has none)."""
    return [p for p in model.family.probes(model.config) if p.affine is not None]


def units_first(y: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """A probe's tensor y with its C units on ``axis`` (N, C, ... by default) as (C, ·) in
    float64: each unit's every value."""
    return y.movedim(axis, 0).reshape(y.shape[axis], -1).double()


def _channel_stats(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-unit sums of y and y² over every axis but 1, and the count; y (N, C, ...)."""
    flat = units_first(y)
    return flat.sum(1), flat.pow(2).sum(1), flat.shape[1]


class _Moments:
    """Running sums of one unit vector's first two moments."""

    def __init__(self) -> None:
        self.s1: torch.Tensor | float = 0.0
        self.s2: torch.Tensor | float = 0.0
        self.n = 0

    def add(self, y: torch.Tensor) -> None:
        s1, s2, n = _channel_stats(y)
        self.s1, self.s2, self.n = self.s1 + s1, self.s2 + s2, self.n + n

    def mean_var(self, unbiased: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.s1 / self.n
        var = (self.s2 / self.n - mean**2).clamp_min(0)
        if unbiased and self.n > 1:
            var = var * self.n / (self.n - 1)
        return mean, var


@contextmanager
def hooks(module: nn.Module, names: Sequence[str],
          fn: Callable[[str, torch.Tensor], torch.Tensor | None],
          pre: bool = False) -> Iterator[None]:
    """While open, every forward pass of ``module`` calls ``fn(name, y)`` for each submodule
    ``name``: y its output (what fn returns, unless None, replaces it) or, with ``pre``, its
    first input."""
    handles = []
    for name in names:
        sub = module.get_submodule(name)
        handles.append(sub.register_forward_pre_hook(lambda m, args, n=name: fn(n, args[0]))
                       if pre else sub.register_forward_hook(lambda m, a, y, n=name: fn(n, y)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def probe_hooks(module: nn.Module, probes: Sequence[Probe],
                fn: Callable[[Probe, torch.Tensor], torch.Tensor | None]) -> Iterator[None]:
    """:func:`hooks` at the probes' points: ``fn(probe, y)`` with y the tensor each probe
    observes (its module's output or first input, ``Probe.point``), once per forward pass."""
    with ExitStack() as stack:
        for pre in (False, True):
            at = {p.module: p for p in probes if (p.point == "input") == pre}
            if len(at) < sum((p.point == "input") == pre for p in probes):
                raise ValueError("two probes observe the same point")
            stack.enter_context(hooks(module, list(at), lambda n, y, at=at: fn(at[n], y), pre))
        yield


@torch.no_grad()
def reset_batchnorm(model: CanonicalModel, batches: Sequence[Batch]) -> CanonicalModel:
    """``model`` with every BatchNorm's running statistics recomputed on ``batches``.

    The forward passes run in train mode, where each BatchNorm normalises by its batch's
    statistics, so every layer sees inputs normalised as the reset model will normalise them;
    the mean and (unbiased) variance of each BatchNorm's input over all batches replace the
    running ones. A model without BatchNorm is returned as is.
    """
    module = model.module()
    norms = [n for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    moments = {n: _Moments() for n in norms}
    module.train()
    with hooks(module, norms, lambda n, x: moments[n].add(x), pre=True):
        for x in _inputs(batches, model.dtype):
            module(x)
    state = dict(model.state)
    for n in norms:
        mean, var = moments[n].mean_var(unbiased=True)
        state[f"{n}.running_mean"] = mean.to(model.dtype)
        state[f"{n}.running_var"] = var.to(model.dtype)
    return model.with_state(state)


@torch.no_grad()
def probe_moments(model: CanonicalModel, batches: Sequence[Batch],
                  corrections: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Mean and standard deviation (C,) of every probe's output on ``batches`` (eval mode).

    ``corrections``: probe module -> (target mean, target std): each probe's output is
    renormalised to its target as the pass goes (by the statistics of the batch), so a later
    probe sees what the corrected model will give it; the statistics returned are those
    before each probe's own correction.
    """
    probes = [p.module for p in repair_probes(model)]
    if not probes:
        raise GlmcError(f"REPAIR needs probes: the {model.family.name} family names none")
    module = model.module()
    moments = {n: _Moments() for n in probes}

    def observe(name: str, y: torch.Tensor) -> torch.Tensor:
        moments[name].add(y)
        if corrections is None:
            return y
        mu, sd = (t.to(y.dtype) for t in corrections[name])
        axes = [d for d in range(y.dim()) if d != 1]
        shape = [1, -1] + [1] * (y.dim() - 2)
        bmu = y.mean(axes, keepdim=True)
        bsd = y.var(axes, keepdim=True, unbiased=False).clamp_min(1e-30).sqrt()
        return (y - bmu) / bsd * sd.view(shape) + mu.view(shape)

    with hooks(module, probes, observe):
        for x in _inputs(batches, model.dtype):
            module(x)
    out = {}
    for n, m in moments.items():
        mean, var = m.mean_var()
        out[n] = (mean, var.sqrt())
    return out


def repair(merged: CanonicalModel, a: CanonicalModel, b: CanonicalModel, lam: float,
           batches: Sequence[Batch]) -> CanonicalModel:
    """REPAIR: ``merged`` (= λ·a + (1 − λ)·b, b aligned to a) with every probe's units
    rescaled to the interpolated endpoints' statistics, measured on ``batches`` (see
    :func:`repair_many`). At λ = 1 (or 0) the model is A (or B) and is returned unchanged.
    """
    if lam in (0.0, 1.0):
        return merged
    return repair_many(merged, [a, b], [lam, 1 - lam], batches)


def repair_many(merged: CanonicalModel, models: Sequence[CanonicalModel],
                weights: Sequence[float], batches: Sequence[Batch]) -> CanonicalModel:
    """REPAIR toward N models: ``merged`` (= Σ w_i·θ_i, the models in one frame) with every
    probe's units rescaled to the weighted models' statistics, measured on ``batches``.

    The correction y -> s·y + t per unit (s = σ_target/σ, t = μ_target − s·μ) is folded into
    the probe's (weight, bias): a plain model of the same shape.
    """
    probes = repair_probes(merged)
    stats = [probe_moments(m, batches) for m in models]
    target = {p.module: tuple(sum(w * st[p.module][k] for w, st in zip(weights, stats,
                                                                         strict=True))
                              for k in (0, 1)) for p in probes}
    seen = probe_moments(merged, batches, target)
    state = dict(merged.state)
    for p in probes:
        if p.affine is None:
            continue
        mu, sd = seen[p.module]
        mu_t, sd_t = target[p.module]
        scale = sd_t / sd.clamp_min(1e-12)
        shift = mu_t - scale * mu
        w, bias = p.affine
        shape = [-1] + [1] * (state[w].dim() - 1)
        state[w] = (state[w].double() * scale.view(shape)).to(merged.dtype)
        state[bias] = (state[bias].double() * scale + shift).to(merged.dtype)
    return merged.with_state(state)


def correct(merged: CanonicalModel, a: CanonicalModel, b: CanonicalModel, lam: float,
            batches: Sequence[Batch], how: str) -> CanonicalModel:
    """Apply the correction ``how`` ("none", "reset" or "repair") to ``merged`` = λ·a +
    (1 − λ)·b (the model itself at λ = 1 or 0)."""
    if lam in (0.0, 1.0) and how == "repair":
        return merged
    return correct_many(merged, [a, b], [lam, 1 - lam], batches, how)


def correct_many(merged: CanonicalModel, models: Sequence[CanonicalModel],
                 weights: Sequence[float], batches: Sequence[Batch],
                 how: str) -> CanonicalModel:
    """Apply the correction ``how`` to ``merged`` = Σ w_i·θ_i: a BatchNorm reset (the
    merged model's own statistics) or REPAIR toward the weighted models' statistics."""
    if how == "none":
        return merged
    if how == "reset":
        return reset_batchnorm(merged, batches)
    if how == "repair":
        return repair_many(merged, models, weights, batches)
    raise GlmcError(f"unknown correction {how!r} (one of {', '.join(CORRECTIONS)})")
