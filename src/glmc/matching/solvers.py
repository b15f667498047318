"""The small solvers weight matching is built from: assignment, Procrustes, head inner bases.

Every solver maximises a linear objective ⟨T, M⟩ over a group, M the cross-correlation of
model A with model B on one space (rows: A's coordinates, columns: B's).

The linear assignment is lapx's Jonker-Volgenant solver when it is installed (the optional
extra ``fast``: 2-3x scipy's on the hard, MLP-sized problems weight matching solves,
benchmarks/assignment.py), else scipy's; ``GLMC_ASSIGNMENT=scipy`` forces scipy's. Both give
the optimum (the same total; different orders only where two are exactly tied).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from glmc.matching import workspace

#: Above this size lapx's float32 kernel (``lapjvs``) wins; below it ``lapjvh`` in float64.
LARGE_ASSIGNMENT = 8192


def _lapx() -> Any:
    """lapx's module when installed and not turned off, else None (the older ``lap`` package
    has the same import name but not these solvers)."""
    if os.environ.get("GLMC_ASSIGNMENT", "").lower() == "scipy":
        return None
    try:
        import lap
    except ImportError:
        return None
    return lap if hasattr(lap, "lapjvh") and hasattr(lap, "lapjvs") else None


_LAP = _lapx()


def assignment(m: torch.Tensor, current: torch.Tensor | None = None) -> torch.Tensor:
    """perm maximising Σ_i m[i, perm[i]] (linear assignment of a square m).

    When ``current`` already takes the maximum of every row it is optimal (the sum of row
    maxima bounds every assignment), and the O(n³) solve is skipped.
    """
    m = m.detach().cpu()  # (from the device the cost was made on)
    if m.dtype not in (torch.float32, torch.float64):
        m = m.double()
    rowmax = None
    if current is not None:
        current = current.cpu()
        rowmax = m.amax(1)
        picked = m[torch.arange(m.shape[0]), current]
        if bool((picked >= rowmax).all()):
            return current.clone()
    if not _finite(m, rowmax):
        raise ValueError("the assignment's costs hold NaN or infinity")
    n = m.shape[0]
    if _LAP is not None and n > 1:
        if n >= LARGE_ASSIGNMENT:  # (negated in float32: half the memory, the fast kernel)
            with _negated(m, np.float32) as cost:
                _, rows, cols = _LAP.lapjvs(cost, return_cost=True)
        else:
            with _negated(m) as cost:
                _, rows, cols = _LAP.lapjvh(cost, return_cost=True)
        perm = np.empty(n, dtype=np.int64)
        perm[np.asarray(rows, dtype=np.int64)] = np.asarray(cols, dtype=np.int64)
        return torch.from_numpy(perm)
    # The minimisation of -m (scipy's maximize=True would copy the matrix once more: a third
    # of the solve at n = 3072).
    with _negated(m) as cost:
        _, cols = linear_sum_assignment(cost)
    return torch.from_numpy(np.asarray(cols, dtype=np.int64))


def _finite(m: torch.Tensor, rowmax: torch.Tensor | None) -> bool:
    """Whether every entry of m is finite, from its row extremes (NaN and ±inf reach them;
    two passes that allocate nothing large, where ``isfinite`` writes an n × n mask)."""
    if m.numel() == 0:
        return True
    rowmax = m.amax(1) if rowmax is None else rowmax
    return bool(torch.isfinite(rowmax).all()) and bool(torch.isfinite(m.amin(1)).all())


@contextmanager
def _negated(m: torch.Tensor, dtype: type = np.float64) -> Iterator[np.ndarray]:
    """-m in ``dtype`` as a C-contiguous array: negated in place (and back afterwards) when m
    is a buffer of that dtype of the calling worker's (:mod:`glmc.matching.workspace`), else
    a copy (a fresh 75 MB array at n = 3072 costs more in page faults than its arithmetic;
    at n = 11008 a float32 copy is 485 MB beside the cost)."""
    a = m.numpy()
    if a.dtype == dtype and m.is_contiguous() and workspace.owned(m):
        np.negative(a, out=a)
        try:
            yield a
        finally:
            np.negative(a, out=a)
    else:
        yield np.negative(a, dtype=dtype)


def polar(m: torch.Tensor) -> torch.Tensor:
    """The orthogonal U·Vᵀ maximising ⟨T, m⟩ (orthogonal Procrustes)."""
    u, _, vh = torch.linalg.svd(m.double())  # batched over leading axes
    return (u @ vh).to(m.dtype)


#: Below this ratio of the smallest to the largest eigenvalue of MᵀM (cond(M) above 10³),
#: :func:`polar_batch` takes the SVD: the eigenvalues' route loses cond(M)² of precision.
POLAR_EIGH_RATIO = 1e-6


def polar_batch(m: torch.Tensor) -> torch.Tensor:
    """:func:`polar` of a batch of small maps (..., k, k), as M·(MᵀM)^(-1/2): a symmetric
    eigendecomposition is about twice as fast as an SVD at k = 64 (the heads' step solves one
    per pair of heads); an ill-conditioned M is taken by the SVD."""
    md = m.double()
    w, v = torch.linalg.eigh(md.mT @ md)
    ok = w[..., 0] > POLAR_EIGH_RATIO * w[..., -1]
    out = md @ (v * w.clamp_min(torch.finfo(w.dtype).tiny).rsqrt()[..., None, :]) @ v.mT
    if not bool(ok.all()):
        bad = ~ok
        out[bad] = polar(md[bad])
    return out.to(m.dtype)


def procrustes(m: torch.Tensor, fix_ones: bool) -> torch.Tensor:
    """Orthogonal Procrustes; with ``fix_ones`` the map also fixes the all-ones direction.

    In canonical form both models are centred, so the all-ones direction lies in both null
    spaces of m and the unconstrained solution is arbitrary there. Centring m and adding a
    positive multiple of 11ᵀ/n (a block on the orthogonal complement) gives the best map of
    the complement plus the identity on the ones direction, in one SVD.
    """
    if not fix_ones:
        return polar(m)
    n = m.shape[0]
    md = m.double()
    c = md - md.mean(0, keepdim=True)
    c = c - c.mean(1, keepdim=True)
    scale = float(c.abs().max()) + 1.0
    return polar(c + scale / n).to(m.dtype)


def _sym_sqrt_pair(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric square root and inverse square root of PSD matrices (..., k, k)."""
    w, v = torch.linalg.eigh(g)
    w = w.clamp_min(w.amax(-1, keepdim=True) * 1e-12 + 1e-300)
    return (v * w[..., None, :] ** 0.5) @ v.mT, (v * w[..., None, :] ** -0.5) @ v.mT


def balancing_map(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """N such that N·x and N⁻ᵀ·y have equal Gram matrices (a balanced factorisation).

    x, y: (..., k, ·) factors of the circuit xᵀ·y, which N leaves unchanged. Balanced
    factors of a full-rank circuit are unique up to an orthogonal map, so after balancing two
    heads only an orthogonal Procrustes remains. The Grams, and so N, do not change when an
    orthogonal map acts on the columns (the residual stream).
    """
    x, y = x.double(), y.double()
    return balancing_from_grams(x @ x.mT, y @ y.mT)


def balancing_from_grams(gx: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
    """:func:`balancing_map` from the Gram matrices Gx = x·xᵀ and Gy = y·yᵀ (..., k, k):
    N = P^{1/2} with P·Gx·P = Gy."""
    gx, gy = gx.double(), gy.double()
    k = gx.shape[-1]
    tr = (gx.diagonal(dim1=-2, dim2=-1).sum(-1) + gy.diagonal(dim1=-2, dim2=-1).sum(-1))
    eye = torch.eye(k, dtype=gx.dtype, device=gx.device)
    ridge = (1e-12 * tr / k + 1e-300)[..., None, None] * eye
    gx_h, gx_ih = _sym_sqrt_pair(gx + ridge)
    p = gx_ih @ _sym_sqrt_pair(gx_h @ (gy + ridge) @ gx_h)[0] @ gx_ih
    return _sym_sqrt_pair((p + p.mT) / 2)[0]


def align_inner(
    xa: torch.Tensor, ya: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, invertible: bool,
    balance: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """M (..., k, k) with M·xb ≈ xa and M⁻ᵀ·yb ≈ ya: head b's inner basis aligned to head a.

    Batched over leading axes (one head pair each). ``invertible``: M in GL(k) (balance both
    heads, then Procrustes); else M orthogonal. Exact when head b is head a under any
    invertible inner map and its circuit has rank k. ``balance``: the heads' balancing maps
    (N_a, N_b) when already known.
    """
    x_a, y_a, x_b, y_b = (t.double() for t in (xa, ya, xb, yb))
    if not invertible:
        return polar(x_a @ x_b.mT + y_a @ y_b.mT).to(xa.dtype)
    na, nb = balance or (balancing_map(x_a, y_a), balancing_map(x_b, y_b))
    na_it, nb_it = torch.linalg.inv(na).mT, torch.linalg.inv(nb).mT
    r = polar((na @ x_a) @ (nb @ x_b).mT + (na_it @ y_a) @ (nb_it @ y_b).mT)
    return (torch.linalg.solve(na, r @ nb)).to(xa.dtype)
