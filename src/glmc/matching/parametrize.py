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
- a rotary head's query/key map: on each frequency pair z = z₀·exp(w), w complex (a scale
  and a rotation, invertible for every w), and M₀·(I + W) on the coordinates the rotation
  leaves alone.
- the query heads' order inside each key/value group: one permutation latent per group.

Each group type's latent is registered once (:func:`latent_for`); :func:`make_latent` looks
it up by the group's type.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from glmc.errors import GlmcError
from glmc.matching.solvers import assignment
from glmc.symmetry.groups import (
    BlockInvertibleGroup,
    BlockMatrix,
    BlockOrthogonalGroup,
    BlockPermutationGroup,
    Element,
    FixOnesGroup,
    Group,
    GroupedPermutationGroup,
    Matrix,
    OrthogonalGroup,
    Permutation,
    PermutationGroup,
    RotaryGroup,
    complex_blocks,
)


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
    """Latent (n, n) for a permutation of n items (acting on chunks of an axis); with
    ``groups`` > 1, only its diagonal blocks count (a permutation within each group)."""

    def __init__(self, init: Permutation, groups: int = 1) -> None:
        super().__init__()
        n = init.perm.numel()
        self.groups = groups
        self.z = torch.nn.Parameter(self._one_hot(init.perm))
        self.register_buffer("perm", init.perm.clone())
        r = n // groups
        self.register_buffer("mask", torch.block_diag(*[torch.ones(r, r, dtype=torch.float64)]
                                                      * groups))

    @staticmethod
    def _one_hot(perm: torch.Tensor) -> torch.Tensor:
        n = perm.numel()
        z = torch.zeros(n, n, dtype=torch.float64)
        z[torch.arange(n), perm] = 1.0
        return z

    def project(self) -> None:
        """Hungarian on the latent (warm-started: skipped when the current one is optimal);
        within each group when there are several. (On the host: ``perm`` lives there from
        here on, wherever the latent does.)"""
        if self.groups == 1:
            self.perm = assignment(self.z.detach(), self.perm)
            return
        r = self.perm.numel() // self.groups
        z = self.z.detach()
        self.perm = torch.cat([assignment(z[s, s]) + s.start
                               for s in (slice(g * r, (g + 1) * r) for g in range(self.groups))])

    def matrix(self) -> torch.Tensor:
        """Straight-through matrix (n, n): value P_hard, gradient to Z."""
        n = self.z.shape[0]
        hard = torch.zeros_like(self.z)
        hard[torch.arange(n, device=hard.device), self.perm.to(hard.device)] = 1.0
        z = self.z * self.mask
        return hard + z - z.detach()

    def reset(self, init: Permutation) -> None:
        """Start afresh from ``init`` (the heads it sits in were reassigned)."""
        with torch.no_grad():
            self.z.copy_(self._one_hot(init.perm))
            self.perm = init.perm.clone()

    def element(self) -> Element:
        return Permutation(self.perm.clone())  # (on the host)


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
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
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


class RotaryLatent(Latent):
    """A rotary head's query/key maps (H, k, k): z₀·exp(w) on each frequency pair of the
    first ``rotary`` coordinates (w = log-scale + i·angle; unit scale for the orthogonal
    subgroup), M₀·(I + W) (or M₀·cayley(W)) on the rest."""

    def __init__(self, init: BlockMatrix, rotary: int, orthogonal: bool) -> None:
        super().__init__()
        self.rotary, self.orthogonal = rotary, orthogonal
        blocks = init.blocks.double()
        h = rotary // 2
        i = torch.arange(h)
        self.register_buffer("z0", torch.complex(blocks[:, i, i], blocks[:, i + h, i]))
        self.log_scale = torch.nn.Parameter(torch.zeros(blocks.shape[0], h, dtype=torch.float64))
        if orthogonal:
            self.log_scale.requires_grad_(False)
        self.angle = torch.nn.Parameter(torch.zeros(blocks.shape[0], h, dtype=torch.float64))
        rest = blocks[:, rotary:, rotary:]
        self.register_buffer("m0", rest.clone())
        self.w = torch.nn.Parameter(torch.zeros_like(rest))

    def blocks(self) -> torch.Tensor:
        z = self.z0 * torch.polar(torch.exp(self.log_scale), self.angle)
        rot = torch.stack([complex_blocks(c.real, c.imag) for c in z])
        if self.m0.shape[-1] == 0:
            return rot
        rest = (self.m0 @ cayley((self.w - self.w.mT) / 2) if self.orthogonal
                else self.m0 + self.m0 @ self.w)
        return _block_diag2(rot, rest)

    def forward(self) -> Element:
        return BlockMatrix(self.blocks(), orthogonal=self.orthogonal)

    def reset(self, init: BlockMatrix) -> None:
        fresh = RotaryLatent(init, self.rotary, self.orthogonal)
        with torch.no_grad():
            self.z0.copy_(fresh.z0)
            self.m0.copy_(fresh.m0)
            for p in (self.log_scale, self.angle, self.w):
                p.zero_()

    def element(self) -> Element:
        with torch.no_grad():
            return BlockMatrix(self.blocks().clone(), orthogonal=self.orthogonal)


def _block_diag2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per leading index, blockdiag(a[i], b[i]) (differentiable)."""
    top = torch.cat([a, a.new_zeros(*a.shape[:-1], b.shape[-1])], dim=-1)
    bottom = torch.cat([b.new_zeros(*b.shape[:-1], a.shape[-1]), b], dim=-1)
    return torch.cat([top, bottom], dim=-2)


# -- one latent per group type ---------------------------------------------------------------

LatentFactory = Callable[[Any, Element, str], "Latent | None"]
#: Group type -> ``fn(group, start, space) -> Latent`` (None: the element stays as it
#: starts; ``space``: its name, for messages).
LATENTS: dict[type[Group], LatentFactory] = {}


def latent_for(kind: type[Group]) -> Callable[[LatentFactory], LatentFactory]:
    """Register learned matching's latent for groups of type ``kind``."""
    def register(fn: LatentFactory) -> LatentFactory:
        LATENTS[kind] = fn
        return fn
    return register


def make_latent(group: Group, start: Element, space: str = "") -> Latent | None:
    """The latent of ``group`` at ``start`` (``space``: its name, for messages)."""
    if type(group) not in LATENTS:
        raise GlmcError(f"space {space}: learned matching has no latent for a {group.kind} "
                        "group")
    return LATENTS[type(group)](group, start, space)


def _permutation_start(start: Element, space: str) -> Permutation:
    if not isinstance(start, Permutation):
        raise GlmcError(f"space {space}: the start is not a permutation (the permutation-only "
                        "ablation starts from weight matching with residual=permutation)")
    return start


@latent_for(PermutationGroup)
def _permutation(group: PermutationGroup, start: Element, space: str) -> Latent:
    """A real matrix, the hard assignment forward, straight-through backward."""
    return PermutationLatent(_permutation_start(start, space))


@latent_for(GroupedPermutationGroup)
def _grouped(group: GroupedPermutationGroup, start: Element, space: str) -> Latent:
    return PermutationLatent(_permutation_start(start, space), group.groups)


@latent_for(OrthogonalGroup)
def _orthogonal(group: OrthogonalGroup, start: Element, space: str) -> Latent:
    """O₀·cayley(A), A skew: exactly orthogonal at every step."""
    return OrthogonalLatent(start, fix_ones=False)


@latent_for(FixOnesGroup)
def _fixing_ones(group: FixOnesGroup, start: Element, space: str) -> Latent:
    return OrthogonalLatent(start, fix_ones=True)


def _block(kind: str) -> LatentFactory:
    def make(group: Group, start: Element, space: str) -> Latent | None:
        return BlockLatent(start, kind) if isinstance(start, BlockMatrix) else None
    return make


latent_for(BlockInvertibleGroup)(_block("invertible"))
latent_for(BlockOrthogonalGroup)(_block("orthogonal"))
latent_for(BlockPermutationGroup)(_block("fixed"))  # (kept; re-solved when heads move)


@latent_for(RotaryGroup)
def _rotary(group: RotaryGroup, start: Element, space: str) -> Latent | None:
    if not isinstance(start, BlockMatrix):
        return None
    return RotaryLatent(start, group.rotary, group.orthogonal)


def project_all(latents: dict[str, torch.nn.Module], pool: ThreadPoolExecutor | None) -> None:
    """Hard assignments of every permutation latent, run together on a thread pool."""
    mods = [m for m in latents.values() if isinstance(m, PermutationLatent)]
    if pool is None:
        for m in mods:
            m.project()
    else:
        list(pool.map(lambda m: m.project(), mods))
