"""Where weight matching's work runs: the one strategy object its loop calls
(:func:`glmc.matching.weight.weight_matching`).

An :class:`Executor` solves an iteration's due units, each given the others, and yields their
steps in order (the loop takes them), then proposes the residual map given them all.
:class:`Serial` solves one unit after another on the calling thread; :class:`Threads` several
at once, one per core; :class:`glmc.matching.spread.Ranks` shares them out among torchrun's
ranks. Every unit is solved on one thread whichever runs it (an assignment is single-threaded
anyway, and one product per core uses the cores as well as one product on all of them), so
the three give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch

from glmc.matching import workspace
from glmc.matching.descent import Descent, UnitStep
from glmc.matching.problem import Problem
from glmc.matching.residual import ResidualCache
from glmc.symmetry.elements import Element
from glmc.tensors import StateDict
from glmc.threads import num_threads

__all__ = ["UNITS_IN_FLIGHT_BYTES", "Executor", "Serial", "Threads", "UnitSolver", "local",
           "unit_workers"]

#: One unit's step (``glmc.matching.weight.solve_unit``): given the problem, the residual
#: cache, the unit, every element and B moved to them.
UnitSolver = Callable[[Problem, "ResidualCache | None", str, dict[str, Element], StateDict],
                      UnitStep]

#: The residual map proposed, D's terms under it, and the fresh tensors moved to it.
ResidualProposal = tuple[Element, dict[str, float], StateDict]


class Executor(Protocol):
    """Where the units and the residual map are solved; a context manager around the run."""

    def solve(self, due: list[str], d: Descent, step: UnitSolver) -> Iterator[UnitStep]:
        """``step`` of every unit in ``due``, given ``d``'s elements, yielded in ``due``'s
        order (the caller takes each before asking for the next)."""
        ...

    def residual(self, d: Descent) -> ResidualProposal:
        """The residual map given every element of ``d`` (D's exact minimiser: a
        Procrustes), its terms and the fresh tensors moved to it; nothing taken."""
        ...

    def __enter__(self) -> Executor: ...

    def __exit__(self, *exc: object) -> None: ...


class Serial:
    """The units one after another on the calling thread, each single-threaded (as a
    :class:`Threads` worker solves it) with buffers kept from one unit to the next."""

    def __enter__(self) -> Serial:
        self._own = not workspace.enabled()
        if self._own:
            workspace.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._own:
            workspace.disable()

    def solve(self, due: list[str], d: Descent, step: UnitSolver) -> Iterator[UnitStep]:
        for unit in due:
            with num_threads(1):
                out = step(d.prob, d.cache, unit, d.el, d.bt_all)
            workspace.release_freed()
            yield out

    def residual(self, d: Descent) -> ResidualProposal:
        assert d.cache is not None and d.solo is not None
        new = d.cache.solve(d.el, d.solo.const)
        terms, moved = d.cache.terms(new, d.el)  # (moves the fresh tensors)
        terms["<solo>"] = d.solo.term(new)
        return new, terms, moved


def _worker_start() -> None:
    """A unit worker: single-threaded, keeping its n x n buffers from one unit to the next."""
    torch.set_num_threads(1)
    workspace.enable()


def _released(step: UnitSolver, *args) -> UnitStep:
    """``step(*args)``, then what it freed handed back (see ``workspace.release_freed``)."""
    out = step(*args)
    workspace.release_freed()
    return out


class Threads(Serial):
    """The units several at once on a pool of ``workers`` threads, one per core, at most
    ``depth`` in flight (each holds an n x n cost while it runs). Only units that share no
    tensor run so: each reads the elements and writes its own tensors' entries alone. The
    pool's threads are single-threaded; on leaving, the caller's thread count is restored."""

    def __init__(self, workers: int, depth: int) -> None:
        self.workers, self.depth = workers, depth

    def __enter__(self) -> Threads:
        self.threads = torch.get_num_threads()
        self.pool = ThreadPoolExecutor(max_workers=self.workers, initializer=_worker_start)
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(cancel_futures=True)
        # (a worker's set_num_threads also sets the default of threads started later)
        torch.set_num_threads(self.threads)

    def solve(self, due: list[str], d: Descent, step: UnitSolver) -> Iterator[UnitStep]:
        pending: list[Future] = []
        for unit in due:
            pending.append(self.pool.submit(_released, step, d.prob, d.cache, unit, d.el,
                                            d.bt_all))
            if len(pending) >= self.depth:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


#: Memory the units in flight may hold (each an n x n cost in float32 and its float64 copy).
UNITS_IN_FLIGHT_BYTES = 2 << 30


def unit_workers(prob: Problem, threads: int) -> tuple[int, int]:
    """(workers, depth): units solved at once (one per core, within the memory budget) and
    units in flight. Units that share a tensor are solved one after another."""
    if not prob.independent or not prob.units:
        return 1, 1
    n = max(prob.groups[u].n for u in prob.units)
    fit = max(1, UNITS_IN_FLIGHT_BYTES // (12 * n * n) - 1)
    workers = max(1, min(threads, fit))
    return workers, workers + 1


def local(prob: Problem) -> Serial:
    """This process's executor for ``prob``: :class:`Threads` when its units are independent
    and there are cores (and memory) for several at once, else :class:`Serial`."""
    workers, depth = unit_workers(prob, torch.get_num_threads())
    return Threads(workers, depth) if workers > 1 else Serial()
