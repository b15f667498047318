"""Weight matching's step for each kind of group: the element T maximising ⟨T, M⟩, for M the
cross-correlation of A with B on the space (rows: A's items, columns: B's).

One function per group type, registered once with :func:`solver`; the matchers look a
group's step up by its type (``solve(group, m)``), never by a name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from glmc.matching.solvers import assignment, procrustes
from glmc.symmetry.groups import (
    Element,
    FixOnesGroup,
    Group,
    GroupedPermutationGroup,
    Matrix,
    OrthogonalGroup,
    Permutation,
    PermutationGroup,
)

Step = Callable[[Any, torch.Tensor, "Element | None", torch.dtype], Element]
#: Group type -> its step ``fn(group, m, current, dtype)`` (``current``: the element it
#: replaces, a warm start; ``dtype``: of a dense result).
SOLVERS: dict[type[Group], Step] = {}


def solver(kind: type[Group]) -> Callable[[Step], Step]:
    """Register the weight-matching step of groups of type ``kind``."""
    def register(fn: Step) -> Step:
        SOLVERS[kind] = fn
        return fn
    return register


def solvable(group: Group) -> bool:
    return type(group) in SOLVERS


def solve(group: Group, m: torch.Tensor, current: Element | None = None,
          dtype: torch.dtype = torch.float32) -> Element:
    """The element of ``group`` maximising ⟨T, m⟩ (m: (n, n))."""
    if type(group) not in SOLVERS:
        raise TypeError(f"weight matching has no step for a {group.kind} group")
    return SOLVERS[type(group)](group, m, current, dtype)


@solver(PermutationGroup)
def _assignment(group: PermutationGroup, m: torch.Tensor, current: Element | None,
                dtype: torch.dtype) -> Permutation:
    """A linear assignment (skipped when ``current`` is already optimal)."""
    warm = current.perm if isinstance(current, Permutation) else None
    return Permutation(assignment(m, warm))


@solver(GroupedPermutationGroup)
def _grouped_assignment(group: GroupedPermutationGroup, m: torch.Tensor,
                        current: Element | None, dtype: torch.dtype) -> Permutation:
    """One assignment per group, on its diagonal block of ``m``."""
    r = group.per_group
    perm = torch.empty(group.n, dtype=torch.long)
    for g in range(group.groups):
        s = slice(g * r, (g + 1) * r)
        perm[s] = assignment(m[s, s]) + g * r
    return Permutation(perm)


@solver(OrthogonalGroup)
def _procrustes(group: OrthogonalGroup, m: torch.Tensor, current: Element | None,
                dtype: torch.dtype) -> Matrix:
    """Orthogonal Procrustes."""
    return Matrix(procrustes(m, fix_ones=False).to(dtype), orthogonal=True)


@solver(FixOnesGroup)
def _procrustes_fixing_ones(group: FixOnesGroup, m: torch.Tensor, current: Element | None,
                            dtype: torch.dtype) -> Matrix:
    """Orthogonal Procrustes among the maps that fix the all-ones direction."""
    return Matrix(procrustes(m, fix_ones=True).to(dtype), orthogonal=True)
