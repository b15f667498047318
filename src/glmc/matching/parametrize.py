"""Differentiable latents for learned matching: one per space, each giving a group element.

- permutation (MLP units, heads): the forward pass uses the hard assignment of the latent
  Z (Hungarian on it), the backward pass is straight-through: P = P_hard + Z − stopgrad(Z).
- orthogonal (residual stream): O = O₀·cayley(A), A = C·(W − Wᵀ)/2·C skew with C the
  centring projector when the map must fix the all-ones direction. Exactly orthogonal for
  every W, equal to O₀ (the weight-matching solution) at W = 0, and smooth there. (The polar
  factor of a latent near O₀ has all singular values equal to one, where the SVD's gradient
  divides by σᵢ² − σⱼ² = 0; the Cayley map has no such point near the start.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from glmc.matching.solvers import assignment
from glmc.symmetry.groups import Element, Matrix, Permutation


class PermutationLatent(torch.nn.Module):
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


class OrthogonalLatent(torch.nn.Module):
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

    def project(self) -> None:
        pass

    def matrix(self) -> torch.Tensor:
        a = self.c @ ((self.w - self.w.T) / 2) @ self.c
        eye = torch.eye(a.shape[0], dtype=a.dtype)
        return self.o0 @ torch.linalg.solve(eye + a, eye - a)  # (I + A)⁻¹(I − A), orthogonal

    def element(self) -> Element:
        with torch.no_grad():
            return Matrix(self.matrix().clone(), orthogonal=True)


def project_all(latents: dict[str, torch.nn.Module], pool: ThreadPoolExecutor | None) -> None:
    """Hard assignments of every permutation latent, run together on a thread pool."""
    mods = [m for m in latents.values() if isinstance(m, PermutationLatent)]
    if pool is None:
        for m in mods:
            m.project()
    else:
        list(pool.map(lambda m: m.project(), mods))
