"""Part of a model read: the canonical tensors one process works on, the rest as placeholders.

A family's importer turns the stored tensors into canonical ones in one function
(``to_canonical``), each canonical tensor made from a few stored ones (a reader folded with
the norm before it, a writer centred, an output bias with the value bias moved into it). To
make only some canonical tensors without asking each importer which stored tensors they
need, the conversion runs twice over stand-ins:

1. every stored matrix is an :class:`Absent` tensor (its shape and dtype on the meta device,
   and its own name as its source), vectors are read (they are small, and a conversion may
   branch on their values: the final norm's gains decide where its bias goes). Each
   canonical tensor comes out real (made from vectors alone) or :class:`Absent`, carrying
   the stored tensors it is made from;
2. the stored tensors the wanted canonical ones are made from are read, the other matrices
   are :class:`Absent` again: the wanted tensors come out real, computed by the same
   operations on the same values as a full conversion (bit for bit), and a canonical tensor
   that needs an unread one stays a placeholder (no memory).

A conversion that looks at a matrix's values, or updates a read tensor in place with an
unread one, cannot run so: it is run whole instead (the same tensors, without the saving).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_map

__all__ = ["Absent", "placeholder", "read_part"]


class Unreadable(Exception):
    """The conversion needs what a placeholder does not have (a value, an in-place update
    of a real tensor by an unread one)."""


class Absent(torch.Tensor):
    """A tensor not read: its shape and dtype (on the meta device) and ``sources``, the
    stored tensors it would be made from. Every operation with one among its arguments
    gives one (on the meta device, nothing computed), carrying all their sources."""

    sources: frozenset[str] = frozenset()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        sources: set[str] = set()
        name = getattr(func, "__name__", "")
        # (x.add_(y), x[i] = y, x += y, torch.f(..., out=x): x would keep its values)
        in_place = (name == "__setitem__" or (name.startswith("__i") and name.endswith("__"))
                    or (name.endswith("_") and not name.endswith("__")))
        if (in_place and args and not isinstance(args[0], Absent)) or (
                isinstance(kwargs.get("out"), torch.Tensor)
                and not isinstance(kwargs["out"], Absent)):
            raise Unreadable(f"{name} of a read tensor by an unread one")

        def strip(x: Any) -> Any:
            if isinstance(x, Absent):
                sources.update(x.sources)
            return x.to("meta") if isinstance(x, torch.Tensor) else x

        with torch._C.DisableTorchFunctionSubclass():
            a, k = tree_map(strip, (args, kwargs))
            try:
                out = func(*a, **k)
            except (RuntimeError, NotImplementedError) as e:  # (a value asked of meta data)
                raise Unreadable(str(e)) from None
        if in_place:  # (the placeholder itself now carries what was written into it)
            args[0].sources = args[0].sources | frozenset(sources)
            return args[0]
        frozen = frozenset(sources)

        def wrap(t: Any) -> Any:
            return placeholder(t, frozen) if isinstance(t, torch.Tensor) else t

        if isinstance(out, torch.Tensor):
            return wrap(out)
        if isinstance(out, (tuple, list)) and not isinstance(out, torch.Size):
            return tree_map(wrap, out)
        return out  # (shapes, dtypes, numbers)


def placeholder(like: torch.Tensor, sources: Collection[str] = ()) -> Absent:
    """An :class:`Absent` tensor of ``like``'s shape and dtype."""
    with torch._C.DisableTorchFunctionSubclass():
        t = torch.empty(like.shape, dtype=like.dtype, device="meta")
    t = t.as_subclass(Absent)
    t.sources = frozenset(sources)
    return t


class _Stand(Mapping[str, torch.Tensor]):
    """A stored state whose tensors outside ``read`` (and not vectors) are placeholders."""

    def __init__(self, stored: Mapping[str, torch.Tensor], meta: Mapping[str, torch.Tensor],
                 dtype: torch.dtype | None, read: Collection[str]) -> None:
        self._stored, self._meta, self._dtype, self._read = stored, meta, dtype, read

    def __getitem__(self, key: str) -> torch.Tensor:
        m = self._meta[key]
        if key in self._read or m.dim() <= 1:
            return self._stored[key]
        dtype = self._dtype if self._dtype is not None and m.is_floating_point() else m.dtype
        return placeholder(torch.empty(m.shape, dtype=dtype, device="meta"), [key])

    def __contains__(self, key: object) -> bool:
        return key in self._meta

    def __iter__(self) -> Iterator[str]:
        return iter(self._meta)

    def __len__(self) -> int:
        return len(self._meta)


def read_part(convert: Callable[[Mapping[str, torch.Tensor]], Any],
              stored: Mapping[str, torch.Tensor], meta: Mapping[str, torch.Tensor],
              dtype: torch.dtype | None, only: Collection[str]) -> Any:
    """``convert(state)`` (a CanonicalModel) with only the canonical tensors in ``only`` made
    (each the tensor a full conversion makes), the others on the meta device (shapes and
    dtypes). ``stored``: the stored tensors (read when asked, e.g. a ``StoredState``);
    ``meta``: their shapes and stored dtypes; ``dtype``: what a floating tensor is read in.
    A name of ``only`` that the conversion does not make is a KeyError."""
    try:
        skeleton = convert(_Stand(stored, meta, dtype, ()))
        need: set[str] = set()
        for n in only:
            t = skeleton.state[n]
            if isinstance(t, Absent):
                need |= t.sources
        model = convert(_Stand(stored, meta, dtype, need)) if need else skeleton
    except Unreadable:
        model = convert(stored)
    state = model.state
    for n, t in list(state.items()):
        if n not in only:
            state[n] = torch.empty(t.shape, dtype=t.dtype, device="meta")
        elif isinstance(t, Absent) or t.is_meta:  # (its sources were read)
            raise AssertionError(f"canonical tensor {n} was not made from what was read")
    return model
