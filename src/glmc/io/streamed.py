"""A model's canonical tensors streamed from its folder: read when asked, never held.

Weight matching of a bfloat16 pair handed over (``glmc align`` without data) holds A's
weighted copies and B moved, each in bfloat16: about the two models. A streamed
(``load_model``'s ``stream``) holds none of A: each canonical tensor is made from the stored
tensors it needs when a step reads it (:func:`glmc.io.folders.canonical_of` with ``only``,
the same tensor bit for bit as a whole conversion's, :mod:`glmc.io.partial`), rounded to the
half dtype the pair is held in, used and freed. The files are memory-mapped only while a
tensor is copied out of them (:class:`~glmc.io.folders.StoredState`), and what the kernel
keeps of them is page cache, not the process's memory: A costs one tensor at a time, so the
pair costs B moved and the matching's working set (:func:`glmc.io.outputs.pair_memory`).
The price is time: every read converts again (a few tensors' worth of work per read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping

import torch

__all__ = ["StreamedState"]


class StreamedState(MutableMapping[str, torch.Tensor]):
    """The canonical tensors of a stored model, each made when read (``read(name)``: one
    canonical tensor, from the stored ones it needs) and rounded to ``half`` (floating
    ones), a copy the caller owns;
    nothing is kept. ``meta``: every tensor's shape and dtype as read (the meta device).
    Deleting a name forgets it (the handed-over matching frees what it no longer reads);
    nothing can be set (a streamed state is read only)."""

    streamed = True  # (weight matching keeps no copy of a streamed model: Problem)

    def __init__(self, read: Callable[[str], torch.Tensor], meta: dict[str, torch.Tensor],
                 half: torch.dtype) -> None:
        self._read, self.half, self.meta = read, half, meta

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.meta:
            raise KeyError(name)
        t = self._read(name)
        return t.to(self.half) if t.is_floating_point() else t

    def __setitem__(self, name: str, t: torch.Tensor) -> None:
        raise TypeError(f"a streamed model's tensors are read only ({name})")

    def __delitem__(self, name: str) -> None:
        del self.meta[name]

    def __contains__(self, name: object) -> bool:
        return name in self.meta

    def __iter__(self) -> Iterator[str]:
        return iter(self.meta)

    def __len__(self) -> int:
        return len(self.meta)

    def clear(self) -> None:
        """Forget every tensor (without reading them, as MutableMapping's would)."""
        self.meta.clear()
