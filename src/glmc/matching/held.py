"""A pair stored in bfloat16 and handed over to weight matching is held in bfloat16.

``glmc align`` hands the pair over (``WeightMatchingOptions.hand_over``): B aligned is made
again from B's files and the certificate compares it with B's own logits, so nothing the
matching holds is ever written. A bfloat16 checkpoint holds no more precision than bfloat16,
so the matching then works on its inputs rounded to it: A's weighted copies and B moved to
the current elements are held in bfloat16 (half of float32's memory), and every tensor is
read into float32 for the products (the cross-correlations, the Procrustes and the terms stay
in float32 and float64). The transform differs from the float32 matching's by the rounding
(the criterion is the barrier, not the bits); B aligned does not (it is made from B's files).
B moved is rounded again each time an orthogonal map moves it, which no later map undoes: a
planted permutation comes back exactly in its permutations but only to that rounding's trace
in its residual map. The distance's terms take B's norms from the start (a tensor rounded
keeps them only to about 2⁻¹⁶): the distance reads about 1e-5 of its scale off, so that a B
brought onto A may read slightly below zero. A float32 pair, or one kept in memory, is
matched as before, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import torch

from glmc.io.files import HELD_HALF, stored_dtype

__all__ = ["HeldState", "held_dtype", "rounded"]


def held_dtype(a: Any, b: Any, hand_over: bool) -> torch.dtype | None:
    """The dtype the matching holds the pair ``a``, ``b`` (CanonicalModels) in when not their
    own: :data:`~glmc.io.files.HELD_HALF` when the pair is handed over and both are stored in
    it (the config's record, or the tensors' dtype), else None."""
    if not hand_over:
        return None
    return HELD_HALF if stored_dtype(a) == stored_dtype(b) == HELD_HALF else None


def rounded(t: torch.Tensor, half: torch.dtype | None) -> torch.Tensor:
    """``t`` as the matching reads it: rounded to ``half`` (None: ``t`` itself), in float32
    at least (a copy)."""
    if half is None:
        return t
    return t.to(half).to(torch.promote_types(t.dtype, torch.float32))


class HeldState(MutableMapping[str, torch.Tensor]):
    """Tensors stored in ``half`` (each rounded as it is set) and read in ``dtype`` (a copy
    per read): B moved, held at half the memory. ``update`` from another HeldState shares
    its tensors (no copy)."""

    def __init__(self, half: torch.dtype, dtype: torch.dtype,
                 items: Iterable[tuple[str, torch.Tensor]] = ()) -> None:
        self.half, self.dtype = half, dtype
        self._data: dict[str, torch.Tensor] = {}
        self.update(items)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._data[name].to(self.dtype)

    def __setitem__(self, name: str, t: torch.Tensor) -> None:
        self._data[name] = t.to(self.half)

    def __delitem__(self, name: str) -> None:
        del self._data[name]

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def update(self, other: Any = (), /, **kw: torch.Tensor) -> None:
        if isinstance(other, HeldState) and other.half == self.half:
            self._data.update(other._data)
            other = ()
        super().update(other, **kw)
