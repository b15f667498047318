"""Group elements: values that act on tensor axes.

An element acts on one axis of a tensor with a *variance*:

- ``"out"`` (contravariant, e.g. the output side of a Linear weight): ``x <- T x``;
- ``"in"`` (covariant, e.g. the input side of a Linear weight, or key rows that pair with
  query rows): ``x <- T^{-T} x``, i.e. ``W <- W T^{-1}`` on the input side.

For permutations and orthogonal maps the two coincide. Elements are immutable values:
``compose``, ``inverse`` and ``apply`` return new objects.

**Chunks.** An element of ``n`` items acts on an axis of any size N that ``n`` divides, the
axis cut into ``n`` contiguous chunks of N/n: a :class:`Permutation` moves whole chunks (the
heads of an attention layer, ``head_dim`` rows each), a :class:`Matrix` M acts as M ⊗ I on them,
and a :class:`BlockMatrix` of ``n`` blocks k × k applies block g to every k-vector of chunk g
(I ⊗ M_g: a key/value head's inner map, read by each query head of its group). So the same
element acts on a key axis of n·k entries and on a query axis of n·r·k entries: a spec
broadcasts a map by naming its space on both.

**Conjugation.** Where several spaces share an axis (applied inner first), the outer one is a
permutation of chunks that carries the inner element's blocks with it:
P·E·P⁻¹ is again an element of E's kind (:meth:`Element.conjugated`), which is what
:class:`~glmc.symmetry.transform.Transform` needs to invert and compose.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch

Variance = Literal["out", "in"]


def _chunks(size: int, n: int, what: str) -> int:
    if n < 1 or size % n:
        raise ValueError(f"{what} of {n} items cannot act on an axis of size {size}")
    return size // n


class Element:
    """A group element of ``n`` items (chunks of an axis); ``size`` its natural axis size."""

    size: int
    kind: str

    def matrix(self, dtype: torch.dtype = torch.float64,
               device: torch.device | None = None) -> torch.Tensor:
        """Dense (size, size) matrix T (on an axis of its natural size), on ``device``
        (None: where the element is)."""
        raise NotImplementedError

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        raise NotImplementedError

    def inverse(self) -> Element:
        raise NotImplementedError

    def compose(self, other: Element) -> Element:
        """``self ∘ other``: apply ``other`` first, then ``self`` (T = T_self · T_other)."""
        t = self.matrix(torch.float64)
        m = t @ other.matrix(torch.float64, t.device)
        orth = getattr(self, "orthogonal", True) and getattr(other, "orthogonal", True)
        return Matrix(m, orthogonal=orth)

    def conjugated(self, outer: Permutation, axis_size: int) -> Element:
        """P·self·P⁻¹ for the permutation ``outer`` acting after it on an axis of
        ``axis_size`` entries (raises ValueError where the result is not of this kind)."""
        raise ValueError(f"a {self.kind} element cannot sit inside a permutation of the axis")

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors that define the element (for saving)."""
        raise NotImplementedError

    def to(self, dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> Element:
        """The element in ``dtype`` (its dense tensors) and on ``device`` (None: as it
        is)."""
        return self


@dataclass(frozen=True, eq=False)
class Permutation(Element):
    """Chunk ``i`` of the result is chunk ``perm[i]`` of the input; ``perm`` (n,).

    ``perm`` lives on the host, wherever the tensors it acts on do (assignments are solved
    there; it moves to a tensor's device to act on it): :meth:`to` leaves it there."""

    perm: torch.Tensor
    kind = "permutation"
    orthogonal = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "perm", self.perm.cpu())  # (a no-op on the host)

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.perm.numel()

    def index(self, axis_size: int | None = None) -> torch.Tensor:
        """Row index of length ``axis_size`` (default: one row per item): result row r is
        input row ``index[r]``."""
        c = 1 if axis_size is None else _chunks(axis_size, self.size, "a permutation")
        if c == 1:
            return self.perm
        offs = torch.arange(c, device=self.perm.device)
        return (self.perm[:, None] * c + offs[None, :]).reshape(-1)

    def matrix(self, dtype: torch.dtype = torch.float64,
               device: torch.device | None = None) -> torch.Tensor:
        n = self.size
        m = torch.zeros(n, n, dtype=dtype)
        m[torch.arange(n), self.perm] = 1.0
        return m.to(device)  # (made on the host, as the order)

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        return x.index_select(axis, self.index(x.shape[axis]).to(x.device))

    def inverse(self) -> Permutation:
        return Permutation(torch.argsort(self.perm))

    def compose(self, other: Element) -> Element:
        if isinstance(other, Permutation) and other.size == self.size:
            return Permutation(other.perm[self.perm])
        return super().compose(other)

    def conjugated(self, outer: Permutation, axis_size: int) -> Permutation:
        """P·E·P⁻¹ at the granularity of the finer of the two, read back at this one's."""
        n, m = self.size, outer.size
        fine = n * m // torch.gcd(torch.tensor(n), torch.tensor(m)).item()
        _chunks(axis_size, fine, "a permutation")
        p, e = outer.index(fine), self.index(fine)
        c = torch.argsort(p)[e[p]]  # (P E P⁻¹ as an index: result i is input c[i])
        step = fine // n
        blocks = c.view(n, step)
        coarse = blocks[:, 0] // step
        if not torch.equal(blocks, coarse[:, None] * step + torch.arange(step)):
            raise ValueError("a permutation of chunks does not conjugate this permutation into "
                             "one of the same chunks")
        return Permutation(coarse)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"perm": self.perm}

    def is_identity(self) -> bool:
        return bool(torch.equal(self.perm, torch.arange(self.size)))


@dataclass(frozen=True, eq=False)
class Matrix(Element):
    """A dense map T (n, n), acting as T ⊗ I on n chunks: orthogonal (T^{-1} = T^T) or
    general invertible."""

    m: torch.Tensor
    orthogonal: bool = True
    kind = "matrix"

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.m.shape[0]

    def matrix(self, dtype: torch.dtype = torch.float64,
               device: torch.device | None = None) -> torch.Tensor:
        return self.m.to(device=device, dtype=dtype)

    def _acting(self, variance: Variance) -> torch.Tensor:
        if variance == "out" or self.orthogonal:
            return self.m
        return torch.linalg.inv(self.m.double()).T.to(self.m.dtype)

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        t = self._acting(variance).to(x.device, x.dtype)
        c = _chunks(x.shape[axis], self.size, "a matrix")
        if c == 1 and axis == x.dim() - 1:  # x·Tᵀ keeps x's row-major layout
            return x @ t.T
        xf = x.movedim(axis, 0)
        y = (t @ xf.reshape(self.size, -1)).reshape(xf.shape)
        return y.movedim(0, axis)

    def inverse(self) -> Matrix:
        inv = self.m.T if self.orthogonal else torch.linalg.inv(self.m.double()).to(self.m.dtype)
        return Matrix(inv.contiguous(), self.orthogonal)

    def conjugated(self, outer: Permutation, axis_size: int) -> Matrix:
        if outer.size != self.size:
            return super().conjugated(outer, axis_size)
        p = outer.perm
        return Matrix(self.m[p][:, p].contiguous(), self.orthogonal)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"matrix": self.m}

    def to(self, dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> Matrix:
        return Matrix(self.m.to(device=device, dtype=dtype), self.orthogonal)


@dataclass(frozen=True, eq=False)
class BlockMatrix(Element):
    """Block-diagonal map: ``blocks`` (n, k, k); on an axis of n·r·k entries block g acts
    on each of the r k-vectors of chunk g (the inner map of a head, or of a key/value head
    and every query head that reads it)."""

    blocks: torch.Tensor
    orthogonal: bool = False
    kind = "block_matrix"

    @property
    def n(self) -> int:
        return self.blocks.shape[0]

    @property
    def k(self) -> int:
        return self.blocks.shape[1]

    @property
    def size(self) -> int:  # type: ignore[override]
        return self.n * self.k

    def matrix(self, dtype: torch.dtype = torch.float64,
               device: torch.device | None = None) -> torch.Tensor:
        return torch.block_diag(*self.blocks.to(device=device, dtype=dtype))

    def _acting(self, variance: Variance) -> torch.Tensor:
        if variance == "out" or self.orthogonal:
            return self.blocks
        return self._inverse_transpose

    @cached_property
    def _inverse_transpose(self) -> torch.Tensor:
        return torch.linalg.inv(self.blocks.double()).mT.to(self.blocks.dtype)

    def apply(self, x: torch.Tensor, axis: int, variance: Variance) -> torch.Tensor:
        t = self._acting(variance).to(x.device, x.dtype)
        r = _chunks(x.shape[axis], self.size, "a block matrix")
        xf = x.movedim(axis, 0)
        rest = xf.shape[1:]
        if r == 1:
            y = torch.bmm(t, xf.reshape(self.n, self.k, -1))
        else:  # (each chunk holds r k-vectors, all mapped by its block)
            xr = xf.reshape(self.n, r, self.k, -1)
            y = torch.einsum("gij,grjc->gric", t, xr)
        return y.reshape(xf.shape[0], *rest).movedim(0, axis)

    def inverse(self) -> BlockMatrix:
        if self.orthogonal:
            return BlockMatrix(self.blocks.mT.contiguous(), True)
        return BlockMatrix(self._inverse_transpose.mT.contiguous(), False)

    def compose(self, other: Element) -> Element:
        if isinstance(other, BlockMatrix) and other.blocks.shape == self.blocks.shape:
            return BlockMatrix(self.blocks @ other.blocks, self.orthogonal and other.orthogonal)
        return super().compose(other)

    def conjugated(self, outer: Permutation, axis_size: int) -> BlockMatrix:
        """A permutation of whole blocks (or of groups of them) carries the blocks along; one
        that only moves chunks inside each block's span (query heads within their key/value
        group) commutes with it."""
        n, m = self.n, outer.size
        _chunks(axis_size, n * self.k, "a block matrix")
        if n % m == 0:
            r = n // m
            idx = (outer.perm[:, None] * r + torch.arange(r)).reshape(-1)
            return BlockMatrix(self.blocks[idx].contiguous(), self.orthogonal)
        if m % n == 0 and (axis_size // m) % self.k == 0:
            q = m // n
            if torch.equal(outer.perm // q, torch.arange(m) // q):
                return self
        return super().conjugated(outer, axis_size)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"blocks": self.blocks}

    def to(self, dtype: torch.dtype | None = None,
           device: torch.device | str | None = None) -> BlockMatrix:
        return BlockMatrix(self.blocks.to(device=device, dtype=dtype), self.orthogonal)


def element_from_tensors(kind: str, tensors: dict[str, torch.Tensor], meta: dict) -> Element:
    """Inverse of ``Element.tensors`` plus the metadata saved beside it (a permutation's
    ``block``, saved by earlier versions, is implied by the axis it acts on)."""
    if kind == "permutation":
        return Permutation(tensors["perm"].long())
    if kind == "matrix":
        return Matrix(tensors["matrix"], bool(meta["orthogonal"]))
    if kind == "block_matrix":
        return BlockMatrix(tensors["blocks"], bool(meta["orthogonal"]))
    raise ValueError(f"unknown element kind {kind!r}")


def element_meta(e: Element) -> dict:
    meta: dict = {"kind": e.kind}
    if not isinstance(e, Permutation):
        meta["orthogonal"] = bool(e.orthogonal)  # type: ignore[attr-defined]
    return meta
