"""torch.distributed, started by torchrun, over gloo (what the ranks exchange is on the CPU).

    torchrun --standalone --nproc-per-node 2 $(which glmc) align A B -o OUT --align learned ...
    # several machines: on each, the same command with
    torchrun --nnodes 2 --node-rank R --master-addr HOST --master-port 29500 --nproc-per-node N ...

Learned matching is data parallel: each rank takes a shard of every global batch; the latents'
gradients are averaged with an all-reduce, so the result matches a single process with the
same global batch. Weight matching spreads its units across the ranks
(:mod:`glmc.matching.spread`) with the helpers here: :func:`exchange` and :func:`from_root`
carry every rank's error with its result, so that one rank's failure stops them all at the
same point (one line, from rank 0), and :func:`ordered_sum` adds matrices held on different
ranks in one fixed order (bit for bit the sum one process makes; an all-reduce adds in an
order of its own).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from glmc.errors import GlmcError, reason

T = TypeVar("T")

#: How long a rank waits for the others at one exchange. Weight matching's ranks wait for the
#: slowest one's units and for rank 0's residual map, which on a large pair can take hours
#: (a rank that dies is noticed at once: its connections close).
TIMEOUT = datetime.timedelta(hours=24)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def spread() -> bool:
    """Whether this process is one of several in a process group (work may be spread)."""
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


def from_main(obj: T) -> T:
    """``obj`` as rank 0 has it, on every rank (alone: ``obj`` itself). For what only rank 0
    can read, such as a checkpoint it wrote on its own machine."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)  # (between our own processes)
    return box[0]


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """Join the process group that torchrun describes in the environment (no-op alone).

    A rank that fails leaves the group at once, without waiting for the others at the final
    barrier (they may be waiting for it elsewhere): those at an exchange stop with its error,
    the others find its connections closed (:class:`LostRank`)."""
    if world_size() <= 1 or torch.distributed.is_initialized():
        yield
        return
    # The latents live on the CPU for now, so their all-reduce goes through gloo everywhere.
    torch.distributed.init_process_group(backend="gloo", timeout=TIMEOUT)
    try:
        yield
    except BaseException:
        torch.distributed.destroy_process_group()
        raise
    try:
        _comm(torch.distributed.barrier)
    finally:
        torch.distributed.destroy_process_group()


# -- exchanges that carry errors ---------------------------------------------------------------


class RankFailed(GlmcError):
    """Another rank failed at an exchange (rank 0 says which and why; the others are quiet:
    ``reported_elsewhere``)."""


class LostRank(GlmcError):
    """The connection to another rank broke (it stopped, or was killed)."""


def _comm(fn: Callable[..., T], *args: Any) -> T:
    """A collective call; a broken connection (a rank that stopped) as one line."""
    try:
        return fn(*args)
    except RuntimeError as e:  # (gloo's "Connection reset by peer" and the like)
        raise LostRank(f"rank {rank()}: lost the connection to another rank, which stopped "
                       f"(its error, if it could say one, is above): {reason(e)}") from e


def _summary(error: BaseException | None) -> tuple[str, bool] | None:
    if error is None:
        return None
    if isinstance(error, GlmcError):
        return " ".join(line.strip() for line in str(error).splitlines() if line.strip()), True
    return reason(error), False


def _stop(summaries: Sequence[tuple[str, bool] | None], own: BaseException | None) -> None:
    """Raise on every rank when any failed: rank 0 reports the first failure (its own error,
    or :class:`RankFailed` naming the rank); the others re-raise their own error (quiet when
    it is a :class:`GlmcError`, which rank 0 reports; a bug keeps its traceback) or stop
    quietly."""
    failed = [i for i, s in enumerate(summaries) if s is not None]
    if not failed:
        return
    me = rank()
    if own is not None and (me == 0 or not isinstance(own, GlmcError)):
        raise own
    first = failed[0]
    message, _ = summaries[first]  # type: ignore[misc]
    more = f" (and {len(failed) - 1} other rank{'s' * (len(failed) > 2)})" * (len(failed) > 1)
    error = RankFailed(f"rank {first}{more}: {message}")
    if me != 0:
        error.reported_elsewhere = True  # type: ignore[attr-defined]
        if own is not None:
            own.reported_elsewhere = True  # type: ignore[attr-defined]
            raise own
    raise error


def exchange(fn: Callable[[], T]) -> list[T]:
    """``fn()`` on every rank, and every rank's result on every rank (by rank). When ``fn``
    fails on any rank, every rank raises (see :func:`_stop`) instead of going on."""
    try:
        out, err = fn(), None
    except Exception as e:  # (handed to every rank, then raised on all)
        out, err = None, e
    box: list[Any] = [None] * torch.distributed.get_world_size()
    _comm(torch.distributed.all_gather_object, box, (out, _summary(err)))
    _stop([s for _, s in box], err)
    return [o for o, _ in box]


def from_root(fn: Callable[[], T]) -> T:
    """``fn()`` computed on rank 0 alone, on every rank (rank 0's failure stops all)."""
    out, err = None, None
    if rank() == 0:
        try:
            out = fn()
        except Exception as e:
            err = e
    box = [(out, _summary(err))]
    _comm(torch.distributed.broadcast_object_list, box, 0)
    _stop([box[0][1]] + [None] * (torch.distributed.get_world_size() - 1), err)
    return box[0][0]


def ordered_sum(order: Sequence[tuple[Hashable, int]], value: Callable[[Hashable], torch.Tensor],
                shape: tuple[int, ...], dtype: torch.dtype = torch.float64,
                prefetch_bytes: int = 2 << 30) -> torch.Tensor | None:
    """Σ value(k) over the keys of ``order``, added left to right, (v₁ + v₂) + v₃ + …, as one
    process adds them: bit for bit its sum. ``order`` pairs each key with the rank that
    holds its value (``value`` is called there only); the partial sum passes from rank to
    rank where the holder changes (once per rank when each holds a contiguous run), and the
    result is on rank 0 (None elsewhere, and None when ``order`` is empty).

    A rank computes its values before its turn, up to ``prefetch_bytes`` of them (they are
    made while the ranks before it add theirs), and the rest as its turn comes. Every rank
    must call this with the same ``order``."""
    if not order:
        return None
    me = rank()
    ready: dict[Hashable, torch.Tensor] = {}
    held = 0
    for k, owner in order:
        if owner == me and held < prefetch_bytes:
            ready[k] = value(k)
            held += ready[k].numel() * ready[k].element_size()
    acc: torch.Tensor | None = None
    holder: int | None = None
    for k, owner in order:
        if holder is not None and holder != owner:
            acc = _hand_over(acc, holder, owner, shape, dtype)
        if owner == me:
            v = ready.pop(k) if k in ready else value(k)
            # (the first value copied: it may be a cached tensor; in-place additions round
            # as out-of-place ones do)
            acc = v.clone() if acc is None else acc.add_(v)
        holder = owner
    if holder != 0:
        acc = _hand_over(acc, holder, 0, shape, dtype)  # type: ignore[arg-type]
    return acc if me == 0 else None


def _hand_over(acc: torch.Tensor | None, src: int, dst: int, shape: tuple[int, ...],
               dtype: torch.dtype) -> torch.Tensor | None:
    """The partial sum moved from rank ``src`` to ``dst`` (what this rank holds after)."""
    me = rank()
    if me == src:
        _comm(torch.distributed.send, acc.contiguous(), dst)  # type: ignore[union-attr]
        return None
    if me == dst:
        buf = torch.empty(shape, dtype=dtype)
        _comm(torch.distributed.recv, buf, src)
        return buf
    return acc
