"""Buffers that a unit worker thread reuses from one unit's step to the next.

A permutation unit's step writes two n × n matrices (its cross-correlation and its cost; 38
and 75 MB at n = 3072). Fresh allocations of that size come from the system each time, and
filling them costs as much as the arithmetic on them (page faults: about 45 ms per 75 MB);
a worker thread that reuses its own buffers pays that once. Only threads that call
:func:`enable` (weight matching's unit workers, :mod:`glmc.matching.executors`) keep buffers,
until they end or call :func:`disable`; anywhere else :func:`buffer` is a fresh ``torch.empty``.
A buffer lives on the device it is asked for (the host by default).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import torch

_local = threading.local()


def enable() -> None:
    """Let the calling thread keep the buffers it asks for (until it ends)."""
    _local.buffers = {}


def enabled() -> bool:
    """Whether the calling thread keeps its buffers."""
    return getattr(_local, "buffers", None) is not None


def disable() -> None:
    """Stop keeping the calling thread's buffers (they are freed)."""
    _local.buffers = None


def release() -> None:
    """Drop the calling thread's buffers (each is made again when next asked for): for a
    step whose n x n matrices are done with while it still has work, when memory is short."""
    buffers = getattr(_local, "buffers", None)
    if buffers:
        buffers.clear()


def buffer(key: str, shape: tuple[int, ...], dtype: torch.dtype,
           device: torch.device | None = None) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype`` on ``device`` (None: the host):
    the calling thread's buffer ``key`` when it keeps buffers (valid until it asks for
    ``key`` again), else a new one."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        return torch.empty(shape, dtype=dtype, device=device)
    t = buffers.get(key)
    if (t is None or t.shape != shape or t.dtype != dtype
            or t.device != (device or torch.device("cpu"))):
        buffers.pop(key, None)  # (the old one is freed before the new one is made)
        t = buffers[key] = torch.empty(shape, dtype=dtype, device=device)
    return t


def owned(t: torch.Tensor) -> bool:
    """Whether ``t`` is one of the calling thread's buffers (whose contents its steps may
    overwrite: nothing else reads them)."""
    buffers = getattr(_local, "buffers", None)
    return buffers is not None and any(
        b.data_ptr() == t.data_ptr() and b.shape == t.shape and b.dtype == t.dtype
        for b in buffers.values())


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # (glibc's; absent elsewhere)
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_freed() -> None:
    """Hand the memory freed so far back to the system. glibc keeps freed blocks under
    32 MB in the arena of the thread that made them, where no other thread reuses them;
    weight matching makes B's moved tensors on the workers and frees them on others, and
    without this the process grows by about a copy of the model per iteration. A no-op
    where the C library has no ``malloc_trim``."""
    if _TRIM is not None:
        _TRIM(0)
