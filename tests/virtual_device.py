"""A second device on a machine without one, for the tests of ``device=``: tensors placed on
``cpu:0`` (:data:`DEVICE`) are told apart from the host's (``cpu``), and every operation that
mixes the two where CUDA would refuse it is recorded.

Inside :class:`SeparateDevice` a tensor is on the device once it is made there: by
``.to(DEVICE)`` (or ``device=DEVICE``), or by an operation on tensors that are; ``.cpu()`` or
``.to("cpu")`` bring it back to the host. Its ``.device`` then reads ``cpu:0``, so code that
follows its inputs (``device=x.device``, ``x.new_zeros``) is followed too. CUDA's rules, as
emulated: the tensors of one operation share a device, except a host tensor of no dimension
(a scalar), host indices into a device tensor, and copies (``copy_``, ``.to``); a device
tensor cannot become a NumPy array. The arithmetic itself is the host's, bit for bit.

The mode is per thread (torch's modes are): run what it checks on one thread.
"""

from __future__ import annotations

import contextlib
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

#: The emulated device, and the host.
DEVICE = torch.device("cpu", 0)
HOST = torch.device("cpu")
_MARK = "_on_virtual_device"
#: Operations whose later tensor arguments are indices (host indices are fine on a device).
_INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put", "index"}
#: Properties that give a view of (or the gradient of) the tensor they are read on.
_VIEWS = {"grad", "data", "T", "mT", "H", "mH", "real", "imag"}
#: Questions about tensors that compute nothing on them.
_QUERIES = {"_has_compatible_shallow_copy_type", "is_same_size"}


def on_device(t: object) -> bool:
    """Whether ``t`` is a tensor on the emulated device."""
    return isinstance(t, torch.Tensor) and bool(getattr(t, _MARK, False))


def _mark(t: object, on: bool) -> None:
    if isinstance(t, torch.Tensor):
        with contextlib.suppress(AttributeError, RuntimeError):  # (one that takes none)
            setattr(t, _MARK, on)


def _device_of(x: object) -> torch.device | None:
    """The device an argument names (a tensor's own, as the mode reads it), else None."""
    if isinstance(x, torch.Tensor):
        return DEVICE if on_device(x) else HOST
    if isinstance(x, (str, torch.device)):
        try:
            return torch.device(x)
        except RuntimeError:
            return None
    return None


def _target(args: tuple, kwargs: dict) -> torch.device | None:
    """The device a ``.to(...)`` moves to (None: it keeps the device)."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    for x in args[1:]:
        d = _device_of(x)
        if d is not None:
            return d
    return None


def _tensors(x: object) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


class SeparateDevice(TorchFunctionMode):
    """The emulation (see the module); ``crossings`` lists each operation that mixed the
    host and the device, with where in glmc it was called."""

    def __init__(self) -> None:
        super().__init__()
        self.crossings: list[str] = []

    def _record(self, name: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if "/glmc/" in f.filename]
        where = f"{frames[-1].filename.split('/glmc/')[-1]}:{frames[-1].lineno}" if frames else "?"
        self.crossings.append(f"{name} at {where}")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in ("__get__", "__set__"):
            attr = getattr(getattr(func, "__self__", None), "__name__", None)
            out = func(*args, **kwargs)
            if name == "__set__" and attr == "data":  # (Module.to: param.data = moved)
                _mark(args[0], on_device(args[1]))
            elif attr == "device" and on_device(args[0]):
                return DEVICE
            elif attr in _VIEWS and isinstance(out, torch.Tensor):
                _mark(out, on_device(args[0]))
            return out
        if name in ("to", "cpu"):
            target = HOST if name == "cpu" else _target(args, kwargs)
            out = func(*args, **kwargs)
            on = on_device(args[0]) if target is None else target == DEVICE
            if out is args[0] and on != on_device(out):  # (a move makes a new tensor)
                out = out.clone()
            _mark(out, on)
            return out
        if name in _QUERIES:
            return func(*args, **kwargs)
        if name == "numpy" and on_device(args[0]):
            self._record("numpy of a device tensor")
        considered, indices = _tensors(args), []
        if name in _INDEXING:
            considered = _tensors([args[0], *args[2:]])
            indices = _tensors(args[1:2])
        if name == "copy_":
            considered = _tensors(args[:1])
        dims = [t for t in considered if t.dim() > 0 or on_device(t)]
        marks = {on_device(t) for t in dims}
        if len(marks) > 1:
            self._record(name)
        if any(on_device(i) for i in indices) and not on_device(args[0]):
            self._record(f"{name} with device indices into a host tensor")
        out = func(*args, **kwargs)
        if kwargs.get("device") is not None:
            on = torch.device(kwargs["device"]) == DEVICE
        else:
            on = any(on_device(t) for t in considered)
        for t in _tensors(out):
            _mark(t, on)
        return out
