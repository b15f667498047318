"""Groups of the symmetry spaces and their elements.

A *space* is a vector space that several tensor axes share (the residual stream, the hidden
units of one MLP, the heads of one attention layer). A *group* says which maps of that space
preserve the network's function; an *element* is one such map.

Every element acts on one tensor axis with a *variance*:

- ``"out"`` (contravariant, e.g. the output side of a Linear weight): ``x <- T x``;
- ``"in"`` (covariant, e.g. the input side of a Linear weight, or key rows that pair with
  query rows): ``x <- T^{-T} x``, i.e. ``W <- W T^{-1}`` on the input side.

For permutations and orthogonal maps the two coincide. Elements are immutable values:
``compose``, ``inverse`` and ``apply`` return new tensors.

Groups are types, one per kind (``PermutationGroup``, ``OrthogonalGroup``,
``BlockInvertibleGroup``): each knows its identity, its random elements, its step in weight
matching (``solve``: the element maximising a linear objective) and its latent in learned
matching (``latent``), so the matchers never ask which kind a space is. A new kind is a new
subclass (it registers its ``kind`` for ``group_from_json``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Literal

import torch

from glmc.errors import GlmcError

Variance = Literal["out", "in"]


def _move(x: torch.Tensor, axis: int) -> torch.Tensor:
    return x.movedim(axis, 0)


# --------------------------------------------------------------------------------------------
# Elements
# --------------------------------------------------------------------------------------------


class Element:
    """A group element acting on an axis of size ``size``."""

    size: int
    kind: str

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Dense (size, size) matrix T."""
        raise NotImplementedError

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        raise NotImplementedError

    def inverse(self) -> Element:
        raise NotImplementedError

    def compose(self, other: Element) -> Element:
        """``self ∘ other``: apply ``other`` first, then ``self`` (T = T_self · T_other)."""
        m = self.matrix(torch.float64) @ other.matrix(torch.float64)
        orth = getattr(self, "orthogonal", True) and getattr(other, "orthogonal", True)
        return Matrix(m, orthogonal=orth)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors that define the element (for saving)."""
        raise NotImplementedError

    def to(self, dtype: torch.dtype) -> Element:
        return self


@dataclass(frozen=True, eq=False)
class Permutation(Element):
    """Block permutation: block ``i`` of the result is block ``perm[i]`` of the input.

    ``perm`` has shape (n_blocks,); the axis has size ``n_blocks * block``. ``block > 1``
    permutes attention heads as units of ``head_dim`` rows.
    """

    perm: torch.Tensor
    block: int = 1
    kind = "permutation"
    orthogonal = True

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.perm.numel() * self.block

    def index(self) -> torch.Tensor:
        """Row index of length ``size``: result row r is input row ``index[r]``."""
        if self.block == 1:
            return self.perm
        offs = torch.arange(self.block, device=self.perm.device)
        return (self.perm[:, None] * self.block + offs[None, :]).reshape(-1)

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        eye = torch.eye(self.size, dtype=dtype, device=self.perm.device)
        return eye[self.index()]

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        return x.index_select(axis, self.index().to(x.device))

    def inverse(self) -> Permutation:
        return Permutation(torch.argsort(self.perm), self.block)

    def compose(self, other: Element) -> Element:
        if isinstance(other, Permutation) and other.block == self.block:
            return Permutation(other.perm[self.perm], self.block)
        return super().compose(other)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"perm": self.perm}

    def is_identity(self) -> bool:
        return bool(torch.equal(self.perm, torch.arange(self.perm.numel())))


@dataclass(frozen=True, eq=False)
class Matrix(Element):
    """A dense map T of shape (n, n): orthogonal (T^{-1} = T^T) or general invertible."""

    m: torch.Tensor
    orthogonal: bool = True
    kind = "matrix"

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.m.shape[0]

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self.m.to(dtype)

    def _acting(self, variance: Variance) -> torch.Tensor:
        if variance == "out" or self.orthogonal:
            return self.m
        return torch.linalg.inv(self.m.double()).T.to(self.m.dtype)

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        t = self._acting(variance).to(x.dtype)
        if axis == x.dim() - 1:  # x·Tᵀ keeps x's row-major layout (later products stay fast)
            return x @ t.T
        xf = _move(x, axis)
        y = (t @ xf.reshape(xf.shape[0], -1)).reshape(xf.shape)
        return y.movedim(0, axis)

    def inverse(self) -> Matrix:
        inv = self.m.T if self.orthogonal else torch.linalg.inv(self.m.double()).to(self.m.dtype)
        return Matrix(inv.contiguous(), self.orthogonal)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"matrix": self.m}

    def to(self, dtype: torch.dtype) -> Matrix:
        return Matrix(self.m.to(dtype), self.orthogonal)


@dataclass(frozen=True, eq=False)
class BlockMatrix(Element):
    """Block-diagonal map: ``blocks`` (n_blocks, b, b), block ``h`` acts on rows h*b:(h+1)*b.

    The map inside each attention head (QK or OV inner basis).
    """

    blocks: torch.Tensor
    orthogonal: bool = False
    kind = "block_matrix"

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.blocks.shape[0] * self.blocks.shape[1]

    def matrix(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return torch.block_diag(*self.blocks.to(dtype))

    def _acting(self, variance: Variance) -> torch.Tensor:
        if variance == "out" or self.orthogonal:
            return self.blocks
        return self._inverse_transpose

    @cached_property
    def _inverse_transpose(self) -> torch.Tensor:
        return torch.linalg.inv(self.blocks.double()).mT.to(self.blocks.dtype)

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        t = self._acting(variance).to(x.dtype)
        n, b, _ = t.shape
        xf = _move(x, axis)
        rest = xf.shape[1:]
        y = torch.bmm(t, xf.reshape(n, b, -1)).reshape(n * b, *rest)
        return y.movedim(0, axis)

    def inverse(self) -> BlockMatrix:
        if self.orthogonal:
            return BlockMatrix(self.blocks.mT.contiguous(), True)
        return BlockMatrix(self._inverse_transpose.mT.contiguous(), False)

    def compose(self, other: Element) -> Element:
        if isinstance(other, BlockMatrix) and other.blocks.shape == self.blocks.shape:
            return BlockMatrix(self.blocks @ other.blocks, self.orthogonal and other.orthogonal)
        return super().compose(other)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"blocks": self.blocks}

    def to(self, dtype: torch.dtype) -> BlockMatrix:
        return BlockMatrix(self.blocks.to(dtype), self.orthogonal)


def element_from_tensors(kind: str, tensors: dict[str, torch.Tensor], meta: dict) -> Element:
    """Inverse of ``Element.tensors`` plus the metadata saved beside it."""
    if kind == "permutation":
        return Permutation(tensors["perm"].long(), int(meta.get("block", 1)))
    if kind == "matrix":
        return Matrix(tensors["matrix"], bool(meta["orthogonal"]))
    if kind == "block_matrix":
        return BlockMatrix(tensors["blocks"], bool(meta["orthogonal"]))
    raise ValueError(f"unknown element kind {kind!r}")


def element_meta(e: Element) -> dict:
    meta: dict = {"kind": e.kind}
    if isinstance(e, Permutation):
        meta["block"] = e.block
    else:
        meta["orthogonal"] = bool(e.orthogonal)  # type: ignore[attr-defined]
    return meta


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


def _random_orthogonal(n: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).to(dtype)


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
    """The symmetry group of one space: ``size`` coordinates in ``size // block`` blocks.

    One subclass per kind, each with its identity, random elements, its step in weight
    matching (``solve``) and its latent in learned matching (``latent``):

    - :class:`PermutationGroup`: permutations of the blocks (block > 1: attention heads);
    - :class:`OrthogonalGroup`: O(size), the residual stream in canonical (RMSNorm) form;
    - :class:`BlockInvertibleGroup`: GL(block)^(size // block), the inner basis of each head.

    ``group_kind(name)`` is the class of a kind's name (as saved in a spec's JSON).
    """

    size: int
    block: int = 1
    #: The name saved with a spec (``to_json``); ``group_kind`` finds the class by it.
    kind: ClassVar[str] = ""
    #: Whether its elements keep every tensor's norm (permutations and orthogonal maps do).
    isometric: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            GROUP_KINDS[cls.kind] = cls

    @property
    def n_blocks(self) -> int:
        return self.size // self.block

    def identity(self, dtype: torch.dtype = torch.float32) -> Element:
        raise NotImplementedError

    def random(
        self,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float64,
        *,
        subgroup: str | None = None,
    ) -> Element:
        """A random element (of ``subgroup``, a name the kind defines, when given)."""
        raise NotImplementedError

    def permutations(self) -> PermutationGroup:
        """Its subgroup of permutation matrices (the permutation-only ablation)."""
        raise NotImplementedError(f"a {self.kind} group has no permutation subgroup here")

    def solve(self, m: torch.Tensor, current: Element | None = None, *, fix_ones: bool = False,
              dtype: torch.dtype = torch.float32) -> Element:
        """The element T maximising ⟨T, m⟩, weight matching's step (m: one row and column
        per block, A's by B's). ``current``: the element it replaces (a warm start);
        ``fix_ones``: among the maps that fix the all-ones direction; ``dtype``: of a dense
        result."""
        raise NotImplementedError(f"a {self.kind} group has no step of its own")

    def latent(self, start: Element, *, space: str = "", fix_ones: bool = False,
               inner: str = "invertible") -> torch.nn.Module | None:
        """Learned matching's latent for this group, at ``start`` (see
        ``glmc.matching.parametrize``); None: the element stays as it is.

        fix_ones: orthogonal maps keep the all-ones direction; inner: the subgroup a head's
        inner maps learn in ("invertible", "orthogonal" or "permutation": kept fixed).
        space: the space's name, for messages."""
        return None

    def to_json(self) -> dict:
        return {"kind": self.kind, "size": self.size, "block": self.block}


def group_kind(kind: str) -> type[Group]:
    """The class of the groups of ``kind`` (e.g. "permutation")."""
    if kind not in GROUP_KINDS:
        raise ValueError(f"unknown group kind {kind!r} (one of {', '.join(GROUP_KINDS)})")
    return GROUP_KINDS[kind]


def group_from_json(d: dict) -> Group:
    """Inverse of ``Group.to_json``."""
    return group_kind(d["kind"])(int(d["size"]), int(d.get("block", 1)))


class PermutationGroup(Group):
    """Permutations of the ``n_blocks`` blocks (block > 1: attention heads, ``block`` rows
    each)."""

    kind = "permutation"

    def identity(self, dtype: torch.dtype = torch.float32) -> Permutation:
        return Permutation(torch.arange(self.n_blocks), self.block)

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64, *,
               subgroup: str | None = None) -> Permutation:
        return Permutation(torch.randperm(self.n_blocks, generator=generator), self.block)

    def permutations(self) -> PermutationGroup:
        return self

    def solve(self, m: torch.Tensor, current: Element | None = None, *, fix_ones: bool = False,
              dtype: torch.dtype = torch.float32) -> Permutation:
        """A linear assignment (skipped when ``current`` is already optimal)."""
        from glmc.matching.solvers import assignment

        warm = current.perm if isinstance(current, Permutation) else None
        return Permutation(assignment(m, warm), self.block)

    def latent(self, start: Element, *, space: str = "", fix_ones: bool = False,
               inner: str = "invertible") -> torch.nn.Module:
        """A real matrix, the hard assignment forward, straight-through backward."""
        from glmc.matching.parametrize import PermutationLatent

        if not isinstance(start, Permutation):
            raise GlmcError(f"space {space}: the start is not a permutation (the "
                            "permutation-only ablation starts from weight matching with "
                            "residual=permutation)")
        return PermutationLatent(start)


class OrthogonalGroup(Group):
    """O(size): the residual stream. Subgroups: ``"permutation"`` (its permutation matrices:
    the permutation-only ablation) and ``"fix_ones"`` (the maps that fix the all-ones
    direction, so that a LayerNorm model stays a LayerNorm model)."""

    kind = "orthogonal"

    def identity(self, dtype: torch.dtype = torch.float32) -> Matrix:
        return Matrix(torch.eye(self.size, dtype=dtype), orthogonal=True)

    def permutations(self) -> PermutationGroup:
        return PermutationGroup(self.size)

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64, *,
               subgroup: str | None = None) -> Element:
        if subgroup == "permutation":
            return self.permutations().random(generator, dtype)
        if subgroup == "fix_ones":
            small = _random_orthogonal(self.size - 1, generator, torch.float64)
            return Matrix(embed_fixing_ones(small).to(dtype), orthogonal=True)
        return Matrix(_random_orthogonal(self.size, generator, dtype), orthogonal=True)

    def solve(self, m: torch.Tensor, current: Element | None = None, *, fix_ones: bool = False,
              dtype: torch.dtype = torch.float32) -> Matrix:
        """Orthogonal Procrustes."""
        from glmc.matching.solvers import procrustes

        return Matrix(procrustes(m, fix_ones).to(dtype), orthogonal=True)

    def latent(self, start: Element, *, space: str = "", fix_ones: bool = False,
               inner: str = "invertible") -> torch.nn.Module:
        """O₀·cayley(A), A skew: exactly orthogonal at every step."""
        from glmc.matching.parametrize import OrthogonalLatent

        return OrthogonalLatent(start, fix_ones)


class BlockInvertibleGroup(Group):
    """GL(block) on each block: the inner basis of each head. Subgroups: ``"orthogonal"``
    and ``"permutation"`` (each block a permutation: the head dimensions reordered). Weight
    matching solves it with the permutation of its blocks (the heads)."""

    kind = "block_invertible"
    isometric = False

    def identity(self, dtype: torch.dtype = torch.float32) -> BlockMatrix:
        eye = torch.eye(self.block, dtype=dtype).expand(self.n_blocks, -1, -1)
        return BlockMatrix(eye.clone(), orthogonal=True)

    def random(self, generator: torch.Generator, dtype: torch.dtype = torch.float64, *,
               subgroup: str | None = None) -> BlockMatrix:
        if subgroup == "permutation":
            eye = torch.eye(self.block, dtype=dtype)
            blocks = [eye[torch.randperm(self.block, generator=generator)]
                      for _ in range(self.n_blocks)]
            return BlockMatrix(torch.stack(blocks), orthogonal=True)
        blocks = []
        for _ in range(self.n_blocks):
            q1 = _random_orthogonal(self.block, generator, torch.float64)
            if subgroup == "orthogonal":
                blocks.append(q1)
                continue
            q2 = _random_orthogonal(self.block, generator, torch.float64)
            # Well-conditioned: singular values in [e^-0.5, e^0.5].
            u = torch.rand(self.block, generator=generator, dtype=torch.float64)
            s = torch.exp(u - 0.5)
            blocks.append(q1 @ torch.diag(s) @ q2)
        return BlockMatrix(torch.stack(blocks).to(dtype), orthogonal=subgroup == "orthogonal")

    def latent(self, start: Element, *, space: str = "", fix_ones: bool = False,
               inner: str = "invertible") -> torch.nn.Module | None:
        """M₀·(I + W) per block (M₀·cayley(W) for "orthogonal"; M₀ for "permutation")."""
        from glmc.matching.parametrize import BlockLatent

        if not isinstance(start, BlockMatrix):
            return None
        return BlockLatent(start, "fixed" if inner == "permutation" else inner)
