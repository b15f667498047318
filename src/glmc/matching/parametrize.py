"""Differentiable latents for learned matching: one per space, each giving a group element
(its group builds it: ``Group.latent``). Calling a latent gives the differentiable element
(for the path), ``element()`` the hard one.

- permutation (MLP units, heads): the forward pass uses the hard assignment of the latent
  Z (Hungarian on it), the backward pass is straight-through: P = P_hard + Z − stopgrad(Z).
- orthogonal (residual stream): O = O₀·cayley(A), A = C·(W − Wᵀ)/2·C skew with C the
  centring projector when the map must fix the all-ones direction. Exactly orthogonal for
  every W, equal to O₀ (the weight-matching solution) at W = 0, and smooth there. (The polar
  factor of a latent near O₀ has all singular values equal to one, where the SVD's gradient
  divides by σᵢ² − σⱼ² = 0; the Cayley map has no such point near the start.)
- a head's inner maps (block-diagonal): M = M₀·(I + W) per head, invertible near W = 0 (the
  full group: GL per head); M₀·cayley(W) for the orthogonal subgroup; or fixed (permutations
  of the head dimensions, the permutation-only ablation). M₀ is re-set when the heads they
  belong to are reassigned (``reset``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from glmc.matching.solvers import assignment
from glmc.symmetry.groups import BlockMatrix, Element, Matrix, Permutation


class Latent(torch.nn.Module):
    """A latent: called, the differentiable element; ``element()``, the hard one."""

    def project(self) -> None:
        """Make the hard element follow the latent (permutations: a new assignment)."""

    def matrix(self) -> torch.Tensor:
        raise NotImplementedError

    def forward(self) -> Element:
        return Matrix(self.matrix(), orthogonal=True)

    def element(self) -> Element:
        raise NotImplementedError


class PermutationLatent(Latent):
    """Latent (n, n) for a permutation of n blocks of size ``block``."""

    def __init__(self, init: Permutation) -> None:
        super().__init__()
        n = init.perm.numel()
        self.block = init.block
        z = torch.zeros(n, n, dtype=torch.float64)
        z[torch.arange(n), init.perm] = 1.0
        self.z = torch.nn.Parameter(z)
        self.register_buffer("perm", init.perm.clone())

    def project(self) -> None:
        """Hungarian on the latent (warm-started: skipped when the current one is optimal)."""
        self.perm = assignment(self.z.detach(), self.perm)

    def matrix(self) -> torch.Tensor:
        """Straight-through matrix (n·block, n·block): value P_hard, gradient to Z."""
        n = self.z.shape[0]
        hard = torch.zeros(n, n, dtype=self.z.dtype)
        hard[torch.arange(n), self.perm] = 1.0
        p = hard + self.z - self.z.detach()
        if self.block > 1:
            p = torch.kron(p, torch.eye(self.block, dtype=p.dtype))
        return p

    def element(self) -> Element:
        return Permutation(self.perm.clone(), self.block)


class OrthogonalLatent(Latent):
    """O = O₀·cayley(A): exactly orthogonal, O₀ at the start."""

    def __init__(self, init: Element, fix_ones: bool) -> None:
        super().__init__()
        o0 = init.matrix(torch.float64)
        d = o0.shape[0]
        self.register_buffer("o0", o0)
        self.w = torch.nn.Parameter(torch.zeros(d, d, dtype=torch.float64))
        c = torch.eye(d, dtype=torch.float64)
        if fix_ones:
            c = c - 1.0 / d
        self.register_buffer("c", c)

    def matrix(self) -> torch.Tensor:
        return self.o0 @ cayley(self.c @ ((self.w - self.w.T) / 2) @ self.c)

    def element(self) -> Element:
        with torch.no_grad():
            return Matrix(self.matrix().clone(), orthogonal=True)


def cayley(a: torch.Tensor) -> torch.Tensor:
    """(I + A)⁻¹(I − A) for skew A (..., n, n): orthogonal, the identity at A = 0."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype).expand_as(a)
    return torch.linalg.solve(eye + a, eye - a)


class BlockLatent(Latent):
    """Inner maps of the heads (H, k, k): M₀·(I + W) ("invertible"), M₀·cayley(W)
    ("orthogonal"), or M₀ itself ("fixed")."""

    def __init__(self, init: BlockMatrix, kind: str) -> None:
        super().__init__()
        if kind not in ("invertible", "orthogonal", "fixed"):
            raise ValueError(f"unknown inner latent {kind!r}")
        self.kind = kind
        blocks = init.blocks.double()
        self.register_buffer("m0", blocks.clone())
        w = torch.zeros_like(blocks)
        if kind == "fixed":
            self.register_buffer("w", w)
        else:
            self.w = torch.nn.Parameter(w)

    def blocks(self) -> torch.Tensor:
        if self.kind == "fixed":
            return self.m0
        if self.kind == "orthogonal":
            return self.m0 @ cayley((self.w - self.w.mT) / 2)
        return self.m0 + self.m0 @ self.w

    def forward(self) -> Element:
        return BlockMatrix(self.blocks(), orthogonal=self.kind != "invertible")

    def reset(self, init: BlockMatrix) -> None:
        """Start afresh from ``init`` (the heads were reassigned)."""
        with torch.no_grad():
            self.m0.copy_(init.blocks.double())
            self.w.zero_()

    def element(self) -> Element:
        with torch.no_grad():
            return BlockMatrix(self.blocks().clone(), orthogonal=self.kind != "invertible")


def project_all(latents: dict[str, torch.nn.Module], pool: ThreadPoolExecutor | None) -> None:
    """Hard assignments of every permutation latent, run together on a thread pool."""
    mods = [m for m in latents.values() if isinstance(m, PermutationLatent)]
    if pool is None:
        for m in mods:
            m.project()
    else:
        list(pool.map(lambda m: m.project(), mods))
