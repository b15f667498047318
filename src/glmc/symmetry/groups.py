"""The symmetry groups of the spaces: pure algebra (identity, random elements, subgroups).

A *space* is an index set that several tensor axes share (the residual stream, the hidden
units of one MLP, the heads of one attention layer, the inner basis of each head). Its group
says which maps of it preserve the network's function; its elements
(:mod:`glmc.symmetry.elements`) act on the axes.

Groups are types, one per kind; each knows its identity, its random elements and its
subgroups (the permutation-only ablation replaces every group by ``permutations()``; a named
``subgroup`` restricts it further). How the matchers solve for a group, and the latent that
learned matching trains for it, are registered by group type in :mod:`glmc.matching` — a new
kind of symmetry is a new class here plus its step and latent there.

Sizes: a group of ``n`` items acts on any axis cut into ``n`` chunks (see
:mod:`glmc.symmetry.elements`); block groups act on ``n`` blocks of ``k`` coordinates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from glmc.symmetry.elements import (
    BlockMatrix,
    Element,
    Matrix,
    Permutation,
    Variance,
    element_from_tensors,
    element_meta,
)

__all__ = ["GROUP_KINDS", "BlockInvertibleGroup", "BlockMatrix", "BlockOrthogonalGroup",
           "BlockPermutationGroup", "Element", "Group", "GroupedPermutationGroup", "Matrix",
           "OrthogonalGroup", "Permutation", "PermutationGroup", "RotaryGroup", "Variance",
           "element_from_tensors", "element_meta", "embed_fixing_ones", "group_from_json",
           "group_kind", "ones_complement_basis", "random_orthogonal"]


def random_orthogonal(n: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """A Haar-random orthogonal (n, n) matrix."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


def _random_invertible(k: int, g: torch.Generator) -> torch.Tensor:
    """A well-conditioned invertible (k, k) matrix: singular values in [e^-0.5, e^0.5]."""
    q1, q2 = random_orthogonal(k, g, torch.float64), random_orthogonal(k, g, torch.float64)
    s = torch.exp(torch.rand(k, generator=g, dtype=torch.float64) - 0.5)
    return q1 @ torch.diag(s) @ q2


def ones_complement_basis(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Orthonormal basis (n, n-1) of the complement of the all-ones direction (Householder)."""
    u = torch.ones(n, dtype=torch.float64) / math.sqrt(n)
    e = torch.zeros(n, dtype=torch.float64)
    e[0] = 1.0
    v = u - e
    if v.norm() < 1e-12:  # n == 1
        return torch.zeros(n, 0, dtype=dtype)
    v = v / v.norm()
    h = torch.eye(n, dtype=torch.float64) - 2 * torch.outer(v, v)  # maps e0 <-> u
    return h[:, 1:].to(dtype)


def embed_fixing_ones(o_small: torch.Tensor) -> torch.Tensor:
    """Lift an orthogonal (n-1, n-1) map of the ones-complement to an (n, n) map fixing 1."""
    n = o_small.shape[0] + 1
    q = ones_complement_basis(n, o_small.dtype)
    return q @ o_small @ q.T + torch.full((n, n), 1.0 / n, dtype=o_small.dtype)


#: Every kind of group by its name (``Group.kind``): each subclass registers itself.
GROUP_KINDS: dict[str, type[Group]] = {}


@dataclass(frozen=True)
class Group:
    """The symmetry group of one space of ``n`` items (chunks of an axis)."""

    n: int
    #: The name saved with a spec (``to_json``); ``group_kind`` finds the class by it.
    kind: ClassVar[str] = ""
    #: Whether its elements keep every tensor's norm (permutations and orthogonal maps do).
    isometric: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            GROUP_KINDS[cls.kind] = cls

    @property
    def size(self) -> int:
        """The axis size its elements act on without broadcasting (n, or n·k for blocks)."""
        return self.n

    def fits(self, axis_size: int) -> bool:
        """Whether its elements act on an axis of ``axis_size`` entries."""
        return axis_size % self.size == 0

    def identity(self, dtype: torch.dtype = torch.float32) -> Element:
        raise NotImplementedError

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Element:
        raise NotImplementedError

    def permutations(self) -> Group:
        """Its subgroup of permutation matrices (the permutation-only ablation)."""
        raise NotImplementedError(f"a {self.kind} group has no permutation subgroup here")

    def subgroup(self, name: str) -> Group:
        """A named subgroup: ``"permutation"`` (:meth:`permutations`), or one the kind
        defines (``"orthogonal"``, ``"fix_ones"``); the group itself for its own name."""
        if name == "permutation":
            return self.permutations()
        raise ValueError(f"a {self.kind} group has no subgroup {name!r}")

    def to_json(self) -> dict:
        return {"kind": self.kind, **{k: v for k, v in self.__dict__.items()}}


def group_kind(kind: str) -> type[Group]:
    """The class of the groups of ``kind`` (e.g. "permutation")."""
    if kind not in GROUP_KINDS:
        raise ValueError(f"unknown group kind {kind!r} (one of {', '.join(GROUP_KINDS)})")
    return GROUP_KINDS[kind]


def group_from_json(d: dict) -> Group:
    """Inverse of ``Group.to_json``."""
    fields = {k: v for k, v in d.items() if k != "kind"}
    return group_kind(d["kind"])(**fields)


# -- permutations ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PermutationGroup(Group):
    """Permutations of the ``n`` items (MLP units, attention heads as chunks of rows)."""

    kind: ClassVar[str] = "permutation"

    def identity(self, dtype: torch.dtype = torch.float32) -> Permutation:
        return Permutation(torch.arange(self.n))

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64
               ) -> Permutation:
        return Permutation(torch.randperm(self.n, generator=generator))

    def permutations(self) -> PermutationGroup:
        return self


@dataclass(frozen=True)
class GroupedPermutationGroup(Group):
    """Permutations of ``n`` items in ``groups`` contiguous groups, each within its group: the
    query heads that read one key/value head (grouped-query attention), reordered among
    themselves."""

    groups: int = 1
    kind: ClassVar[str] = "grouped_permutation"

    def __post_init__(self) -> None:
        if self.groups < 1 or self.n % self.groups:
            raise ValueError(f"{self.groups} groups do not divide {self.n} items")

    @property
    def per_group(self) -> int:
        return self.n // self.groups

    def identity(self, dtype: torch.dtype = torch.float32) -> Permutation:
        return Permutation(torch.arange(self.n))

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64
               ) -> Permutation:
        r = self.per_group
        inner = torch.stack([torch.randperm(r, generator=generator)
                             for _ in range(self.groups)])
        return Permutation((inner + torch.arange(self.groups)[:, None] * r).reshape(-1))

    def permutations(self) -> GroupedPermutationGroup:
        return self

    def contains(self, e: Element) -> bool:
        """Whether ``e`` moves every item within its group."""
        r = self.per_group
        return isinstance(e, Permutation) and bool(
            torch.equal(e.perm // r, torch.arange(self.n) // r))


# -- the residual stream ---------------------------------------------------------------------


@dataclass(frozen=True)
class OrthogonalGroup(Group):
    """O(n): the residual stream in canonical (RMSNorm) form. Subgroups: ``"permutation"``
    (its permutation matrices: the permutation-only ablation) and ``"fix_ones"`` (the maps
    that fix the all-ones direction, so that a LayerNorm model stays a LayerNorm model)."""

    kind: ClassVar[str] = "orthogonal"

    def fits(self, axis_size: int) -> bool:
        return axis_size == self.n

    def identity(self, dtype: torch.dtype = torch.float32) -> Matrix:
        return Matrix(torch.eye(self.n, dtype=dtype), orthogonal=True)

    def permutations(self) -> PermutationGroup:
        return PermutationGroup(self.n)

    def subgroup(self, name: str) -> Group:
        if name in ("fix_ones", "orthogonal"):
            return self if name == "orthogonal" else FixOnesGroup(self.n)
        return super().subgroup(name)

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Matrix:
        return Matrix(random_orthogonal(self.n, generator, dtype), orthogonal=True)


@dataclass(frozen=True)
class FixOnesGroup(OrthogonalGroup):
    """The orthogonal maps of R^n that fix the all-ones direction (a LayerNorm model's
    residual maps that keep it exportable as a LayerNorm model)."""

    kind: ClassVar[str] = "fix_ones"

    def subgroup(self, name: str) -> Group:
        return self if name in ("fix_ones", "orthogonal") else super().subgroup(name)

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Matrix:
        small = random_orthogonal(self.n - 1, generator, torch.float64)
        return Matrix(embed_fixing_ones(small).to(dtype), orthogonal=True)


# -- the inner bases of heads ----------------------------------------------------------------


@dataclass(frozen=True)
class _BlockGroup(Group):
    """A map of each of ``n`` blocks of ``k`` coordinates (the inner basis of each head)."""

    k: int = 1

    @property
    def size(self) -> int:
        return self.n * self.k

    def identity(self, dtype: torch.dtype = torch.float32) -> BlockMatrix:
        eye = torch.eye(self.k, dtype=dtype).expand(self.n, -1, -1)
        return BlockMatrix(eye.clone(), orthogonal=True)

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64
               ) -> BlockMatrix:
        blocks = torch.stack([self._random_block(generator) for _ in range(self.n)])
        return BlockMatrix(blocks.to(dtype), orthogonal=self.isometric)

    def _random_block(self, g: torch.Generator) -> torch.Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class BlockInvertibleGroup(_BlockGroup):
    """GL(k) on each block: the inner basis of each head (W_Q·M with W_K·M⁻ᵀ keeps the QK
    circuit; W_V·N with N⁻¹·W_O keeps the OV circuit)."""

    kind: ClassVar[str] = "block_invertible"
    isometric: ClassVar[bool] = False

    def _random_block(self, g: torch.Generator) -> torch.Tensor:
        return _random_invertible(self.k, g)

    def permutations(self) -> BlockPermutationGroup:
        return BlockPermutationGroup(self.n, self.k)

    def subgroup(self, name: str) -> Group:
        if name == "invertible":
            return self
        if name == "orthogonal":
            return BlockOrthogonalGroup(self.n, self.k)
        return super().subgroup(name)


@dataclass(frozen=True)
class BlockOrthogonalGroup(_BlockGroup):
    """O(k) on each block."""

    kind: ClassVar[str] = "block_orthogonal"

    def _random_block(self, g: torch.Generator) -> torch.Tensor:
        return random_orthogonal(self.k, g, torch.float64)

    def permutations(self) -> BlockPermutationGroup:
        return BlockPermutationGroup(self.n, self.k)

    def subgroup(self, name: str) -> Group:
        return self if name in ("orthogonal", "invertible") else super().subgroup(name)


@dataclass(frozen=True)
class BlockPermutationGroup(_BlockGroup):
    """A permutation of each block's coordinates ``fixed`` to ``k`` (the first ``fixed`` stay:
    rotary ones, which no permutation but the identity commutes with)."""

    fixed: int = 0
    kind: ClassVar[str] = "block_permutation"

    def _random_block(self, g: torch.Generator) -> torch.Tensor:
        order = torch.cat([torch.arange(self.fixed),
                           self.fixed + torch.randperm(self.k - self.fixed, generator=g)])
        return torch.eye(self.k, dtype=torch.float64)[order]

    def permutations(self) -> BlockPermutationGroup:
        return self

    def subgroup(self, name: str) -> Group:
        return self if name in ("orthogonal", "invertible") else super().subgroup(name)


@dataclass(frozen=True)
class RotaryGroup(_BlockGroup):
    """The maps of each head's query/key basis that commute with every rotary rotation.

    Rotary embeddings rotate the pairs (i, i + rotary/2), i < rotary/2, of the first
    ``rotary`` coordinates (transformers' rotate-half layout) by position-dependent angles; a
    map M of the queries, with M⁻ᵀ on the keys, keeps every score only if it commutes with
    all of them: on each pair one complex scalar (a scale times a 2×2 rotation), and any
    invertible map on the ``k - rotary`` coordinates the rotation leaves alone (partial
    rotary). ``orthogonal``: unit scalars and orthogonal maps (its orthogonal subgroup).
    """

    rotary: int = 0
    orthogonal: bool = False
    kind: ClassVar[str] = "rotary"

    def __post_init__(self) -> None:
        if self.rotary % 2 or not 0 < self.rotary <= self.k:
            raise ValueError(f"rotary dimensions {self.rotary} must be even and in (0, "
                             f"{self.k}]")

    @property
    def isometric(self) -> bool:  # type: ignore[override]
        return self.orthogonal

    def _random_block(self, g: torch.Generator) -> torch.Tensor:
        h, k = self.rotary // 2, self.k
        theta = 2 * math.pi * torch.rand(h, generator=g, dtype=torch.float64)
        scale = (torch.ones(h, dtype=torch.float64) if self.orthogonal
                 else torch.exp(torch.rand(h, generator=g, dtype=torch.float64) - 0.5))
        block = torch.zeros(k, k, dtype=torch.float64)
        block[:self.rotary, :self.rotary] = complex_blocks(scale * torch.cos(theta),
                                                           scale * torch.sin(theta))
        if k > self.rotary:
            rest = k - self.rotary
            block[self.rotary:, self.rotary:] = (random_orthogonal(rest, g, torch.float64)
                                                 if self.orthogonal
                                                 else _random_invertible(rest, g))
        return block

    def permutations(self) -> BlockPermutationGroup:
        return BlockPermutationGroup(self.n, self.k, fixed=self.rotary)

    def subgroup(self, name: str) -> Group:
        if name == "invertible":
            return self
        if name == "orthogonal":
            return RotaryGroup(self.n, self.k, self.rotary, orthogonal=True)
        return super().subgroup(name)


def complex_blocks(re: torch.Tensor, im: torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """The (..., 2h, 2h) maps that multiply x_i + i·x_{i+h} by re_i + i·im_i (re, im
    (..., h)): the rotate-half layout's complex scalars, one per frequency pair. ``out``:
    written into its leading (2h, 2h) blocks instead, which must be zeros (in place: a batch
    of maps costs no copy)."""
    h = re.shape[-1]
    if out is None:
        out = re.new_zeros(*re.shape[:-1], 2 * h, 2 * h)
    i = torch.arange(h, device=out.device)
    out[..., i, i], out[..., i + h, i + h] = re, re
    out[..., i, i + h], out[..., i + h, i] = -im, im
    return out
