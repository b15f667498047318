"""The residual map's step: its start (a spectral estimate) and the cache that makes it cheap."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Collection, Mapping, MutableMapping
from dataclasses import dataclass

import torch

from glmc.matching.problem import Problem
from glmc.matching.spilled import SpilledTensors
from glmc.symmetry.groups import (
    Element,
    Matrix,
    OrthogonalGroup,
    Permutation,
    ones_complement_basis,
)
from glmc.symmetry.transform import apply_axes
from glmc.tensors import StateDict, axis_first


def residual_cross(prob: Problem, space: str, bt: Mapping[str, torch.Tensor],
                   names: Collection[str]) -> torch.Tensor:
    """Σ over occurrences of ``space`` in the tensors ``names`` of ``bt``:
    A_axis-first · B̃_axis-firstᵀ."""
    m = None
    for n, axis, _ in prob.spec.occurrences(space):
        if n in names:
            c = (axis_first(prob.A[n], axis) @ axis_first(bt[n], axis).T).double()
            m = c if m is None else m + c
    return m


def gram_occurrences(prob: Problem, space: str) -> list[tuple[str, int]]:
    """The (tensor, axis) whose Gram matrices the spectral start sums, in their order: every
    occurrence of ``space`` whose tensor's other axes carry only isometric spaces
    (permutations, orthogonal maps: they leave the Gram matrices alone)."""
    spec = prob.spec
    return [(n, axis) for n, axis, _ in spec.occurrences(space)
            if all(spec.spaces[s].isometric for s in spec.spaces_of(n) - {space})]


def gram(state: Mapping[str, torch.Tensor], key: tuple[str, int]) -> torch.Tensor:
    """X·Xᵀ of one occurrence's tensor, its axis first (d, d)."""
    x = axis_first(state[key[0]], key[1])
    return x @ x.T


def grams(prob: Problem, space: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Σ A·Aᵀ and Σ B·Bᵀ over :func:`gram_occurrences`, added in their order (None: none)."""
    ga = gb = None
    for key in gram_occurrences(prob, space):
        a, b = gram(prob.A, key), gram(prob.B, key)
        ga = a if ga is None else ga + a
        gb = b if gb is None else gb + b
    return ga, gb


def spectral_init(prob: Problem, space: str, solo: torch.Tensor,
                  summed: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
                  ) -> Element:
    """Residual map from invariants: T·G_B·Tᵀ = G_A for the Gram matrices of
    :func:`gram_occurrences` (``summed``: their sums made elsewhere, e.g. across the ranks;
    default :func:`grams`); the eigenvector signs come from ``solo`` = Σ A·Bᵀ over the
    tensors that only the residual space touches."""
    ga, gb = summed if summed is not None else grams(prob, space)
    d, device = prob.spec.spaces[space].size, prob.device
    if ga is None:
        return Matrix(torch.eye(d, device=device), True)
    q = (ones_complement_basis(d) if prob.opts.fix_ones
         else torch.eye(d, dtype=torch.float64)).to(device)
    ga, gb = q.T @ ga.double() @ q, q.T @ gb.double() @ q
    _, ua = torch.linalg.eigh(ga)
    _, ub = torch.linalg.eigh(gb)
    signs = torch.sign(torch.diagonal(ua.T @ (q.T @ solo.double() @ q) @ ub))
    signs[signs == 0] = 1  # (no residual-only tensors: the Gram eigenbases as they come)
    t = q @ (ua * signs) @ ub.T @ q.T
    if prob.opts.fix_ones:
        t = t + torch.full((d, d), 1.0 / d, dtype=torch.float64, device=device)
    if not isinstance(prob.stream_group(), OrthogonalGroup):  # (its nearest element)
        return prob.solve_stream(t)
    return Matrix(t.to(prob.dtype), True)


def residual_start(prob: Problem, solo: Solo, dtype: torch.dtype,
                   grams: tuple[torch.Tensor | None, torch.Tensor | None] | None = None
                   ) -> Element:
    """The residual map's start (``opts.init``): the Gram eigenbases matched ("spectral"), the
    best map for the tensors only the stream touches ("embeddings"), the map given
    ("activation": ``opts.stream_start``), or the identity. ``grams``: the spectral start's
    Gram sums, made elsewhere (across the ranks)."""
    if prob.opts.init == "activation":
        return prob.opts.stream_start.to(dtype, prob.device)
    if prob.opts.init == "spectral":
        return spectral_init(prob, prob.stream, solo.const, grams)
    if prob.opts.init == "embeddings":
        return prob.solve_stream(solo.const)
    return prob.stream_group().identity(dtype).to(device=prob.device)


class ResidualCache:
    """The residual step without touching most of the model.

    Every tensor the residual space acts on once keeps its cross-correlation
    C_n = A_n·B̂_nᵀ (B̂: B with every other element applied, not the residual map), which only
    changes when its own unit's assignment does. Then the residual step needs only Σ C_n, and
    a tensor's term is ⟨T, C_n⟩. B̃ (``bt_all``) may lag behind the residual map for tensors
    whose units are not due; ``refresh`` brings them up to date before their unit is solved.
    Tensors in head bundles (circuit terms, and inner maps that move even when the heads'
    assignment does not) and tensors the space acts on twice are kept fresh instead.

    The C_n are summed and multiplied in float64 and kept so; for a pair held in bfloat16
    (``prob.half``) they are kept in float32 (half the memory, as large as B held): their
    products are float32 ones, and the rounding of the pair to bfloat16 is 2¹⁶ times
    float32's. With ``opts.spill`` they are kept in files there instead, read back one at a
    time (:mod:`glmc.matching.spilled`: the same values).
    """

    def __init__(self, prob: Problem, space: str, t: Element, bt_all: StateDict) -> None:
        self.prob, self.space, self.bt_all = prob, space, bt_all
        counts: dict[str, int] = defaultdict(int)
        for n, _, _ in prob.spec.occurrences(space):
            if n in bt_all:
                counts[n] += 1
        self.fresh = sorted(n for n in bt_all if n in prob.bundled or counts.get(n, 0) > 1)
        self.direct = [n for n in self.fresh if n in counts]  # its M term computed each time
        self.axis = {n: ax for n, ax, _ in prob.spec.occurrences(space)
                     if counts.get(n) == 1 and n not in self.fresh}
        self.at = dict.fromkeys(counts, t)  # the residual element applied to bt_all[n]
        # (in files under opts.spill, one read at a time: a streamed pair's, see spilled.py)
        self.cross: MutableMapping[str, torch.Tensor] = (
            SpilledTensors(prob.opts.spill) if prob.opts.spill is not None else {})
        self.kept = torch.float64 if prob.half is None else torch.float32  # (the C_n's)
        self.recross(list(self.axis))
        # The steps from a stale map to the current one, shared by the units (most of them
        # take the same step: a d x d x d product each would repeat it), keyed by the maps'
        # ids (the maps are held, so the ids stay theirs).
        self._steps: dict[tuple[int, int], tuple[Element, Element, Element]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        """Remove the cache's files, when it is kept in them (the cache is spent)."""
        if isinstance(self.cross, SpilledTensors):
            self.cross.close()

    def step(self, old: Element, t: Element) -> Element:
        """t·old⁻¹ (computed once per pair of maps; units on several threads ask for it)."""
        key = (id(old), id(t))
        with self._lock:
            hit = self._steps.get(key)
            if hit is None:
                hit = self._steps[key] = (old, t, t.compose(old.inverse()))
        return hit[2]

    def refresh(self, names: list[str], el: dict[str, Element]) -> None:
        t = el[self.space]
        for n in names:
            if n in self.at and self.at[n] is not t:
                self.bt_all[n] = apply_axes(self.bt_all[n], self.prob.spec.axes[n],
                                            {self.space: self.step(self.at[n], t)})
                self.at[n] = t

    def recross(self, names: list[str]) -> None:
        """C_n = A·B̃ᵀ·T for the cached tensors among ``names`` (B̃ = T·B̂ on the residual
        axis, T the map ``bt_all[n]`` carries)."""
        for n in names:
            if n in self.axis:
                self.cross[n] = self._cross(n, self.bt_all[n])

    def _cross(self, n: str, bt: torch.Tensor) -> torch.Tensor:
        ax = self.axis[n]
        c = axis_first(self.prob.A[n], ax) @ axis_first(bt, ax).T
        return (c.double() @ self.at[n].matrix(torch.float64, c.device)).to(self.kept)

    def permuted(self, moved: StateDict, space: str, old: Element,
                 new: Element) -> dict[str, torch.Tensor]:
        """C_n for the tensors ``moved`` (``bt_all[n]`` with ``space``'s permutation going
        from ``old`` to ``new``), to install with ``cross.update`` once the step is taken;
        nothing is changed here (units run this at once on worker threads). Only the slices
        that moved enter: C_n + A_Uᵀ·(B̃_U,new − B̃_U,old)·T over the changed positions U,
        a few percent of the product once the permutations settle."""
        out = {}
        changed = (torch.nonzero(old.index() != new.index()).flatten()
                   if isinstance(old, Permutation) and isinstance(new, Permutation) else None)
        for n, bt in moved.items():
            if n not in self.axis:
                continue
            axes = [i for i, tag in enumerate(self.prob.spec.axes[n])
                    if any(s == space for s, _ in tag or ())]
            if len(axes) != 1 or changed is None or 2 * changed.numel() > old.size:
                out[n] = self._cross(n, bt)
                continue
            ax, u, idx = self.axis[n], axes[0], changed.to(bt.device)  # (a host order's)
            a = self.prob.A[n].index_select(u, idx)
            db = bt.index_select(u, idx) - self.bt_all[n].index_select(u, idx)
            # (|U|·d² in float64, not d³: T multiplies the thin factor)
            tm = self.at[n].matrix(torch.float64, bt.device)
            out[n] = (self.cross[n] + axis_first(a, ax).double() @ (
                axis_first(db, ax).T.double() @ tm)).to(self.kept)
        return out

    def solve(self, el: dict[str, Element], const: torch.Tensor) -> Element:
        self.refresh(self.fresh, el)
        m = sum(self.cross.values(), const.clone())
        if self.direct:  # (quadratic terms are linearised at T)
            c = residual_cross(self.prob, self.space, self.bt_all, self.direct)
            m = m + c @ el[self.space].matrix(torch.float64, c.device)
        return self.prob.solve_stream(m, el[self.space])

    def terms(self, t: Element, el: dict[str, Element]) -> tuple[dict[str, float], StateDict]:
        """The distance terms under residual map ``t`` and the fresh tensors moved to it.
        Spilled (``opts.spill``), none is returned: each is moved, its term taken and the
        copy dropped (a layer's attention, not every layer's, beside B), and taking ``t``
        leaves them behind the map until :meth:`refresh` moves them again, by the same step
        from the same tensor (the same bits, for a second product)."""
        if t is el[self.space]:
            moved = self.prob.moved((n, self.bt_all[n]) for n in self.fresh)
            out = self.prob.terms(moved)
        else:
            step = t.compose(el[self.space].inverse())

            def move(n: str) -> torch.Tensor:
                return apply_axes(self.bt_all[n], self.prob.spec.axes[n], {self.space: step})

            if isinstance(self.cross, SpilledTensors):
                out, moved = {}, {}
                for n in self.fresh:  # (the float32 move dropped once rounded, before the term)
                    out |= self.prob.terms(self.prob.moved([(n, move(n))]))
            else:
                moved = self.prob.moved((n, move(n)) for n in self.fresh)
                out = self.prob.terms(moved)
        tm = t.matrix(torch.float64, self.prob.device)
        for n, c in self.cross.items():
            out[n] = self.prob.sq_a[n] + self.prob.sq_b[n] - 2 * float((tm * c).sum())
        return out, moved

    def moved(self, moved: StateDict, t: Element) -> None:
        self.bt_all.update(moved)
        for n in moved:
            if n in self.at:
                self.at[n] = t
        self._steps.clear()  # (steps to the old map: no unit asks for them again)


def solo_cross(prob: Problem, space: str, names: list[str]) -> torch.Tensor:
    """Σ A·Bᵀ over the tensors only ``space`` touches, in chunks of columns summed in float64
    (near double precision at the speed of the models' dtype: a 50k-row embedding table
    enters once, and its rounding would otherwise limit the residual map's accuracy)."""
    d = prob.spec.spaces[space].size
    m = torch.zeros(d, d, dtype=torch.float64, device=prob.device)
    for n, axis, _ in prob.spec.occurrences(space):
        if n not in names:
            continue
        if len(prob.A.shape(n)) == 2 and axis == 1:  # (a table: its rows are the chunks,
            # weighed as they are read)
            for a, b in zip(prob.A.rows(n, 2048), prob.B.rows(n, 2048), strict=True):
                m += (a.T @ b).double()
        else:
            a, b = axis_first(prob.A[n], axis), axis_first(prob.B[n], axis)
            for j in range(0, a.shape[1], 2048):
                m += (a[:, j:j + 2048] @ b[:, j:j + 2048].T).double()
    return m


@dataclass
class Solo:
    """The tensors only the residual space touches (embedding tables, the head, biases): they
    enter through one constant cross-correlation ``const`` = Σ A·Bᵀ, their term is
    Σ(‖A‖² + ‖B‖²) − 2⟨T, const⟩, and they are never moved."""

    names: list[str]
    const: torch.Tensor
    sq: float

    @classmethod
    def of(cls, prob: Problem, space: str) -> Solo:
        spec = prob.spec
        names = [n for n, _, _ in spec.occurrences(space) if spec.spaces_of(n) == {space}]
        sq = sum(prob.sq_a[n] + prob.sq_b[n] for n in names)
        return cls(names, solo_cross(prob, space, names), sq)

    def term(self, t: Element) -> float:
        """Their distance term under the residual map ``t``."""
        return self.sq - 2 * float((t.matrix(torch.float64, self.const.device)
                                    * self.const).sum())
