"""State dicts: the one alias every layer uses, and the arithmetic on them that every layer
shares (interpolation, axis views)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: Parameter (and buffer) name -> tensor, as ``nn.Module.state_dict()`` gives them.
StateDict = dict[str, torch.Tensor]


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                alpha: float) -> StateDict:
    """alpha·a + (1 − alpha)·b for every tensor of ``a`` (alpha = 1 is a)."""
    return {k: torch.lerp(b[k], a[k], alpha) for k in a}


def axis_first(t: torch.Tensor, axis: int) -> torch.Tensor:
    """(t.shape[axis], rest): a view where the layout allows (a 2-D tensor's transpose)."""
    return t.movedim(axis, 0).reshape(t.shape[axis], -1)


def pad_to(x: torch.Tensor, shape: tuple[int, ...], value: float = 0.0) -> torch.Tensor:
    """``x`` in the leading corner of a tensor of ``shape`` filled with ``value``."""
    out = x.new_full(shape, value)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out
