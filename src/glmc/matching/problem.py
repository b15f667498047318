"""The weight-matching problem: weighted models, the spec's units, the distance's terms, and
each unit's step (an assignment problem and how its solution becomes group elements).

The objective is the distance of what the merge interpolates::

    D(π) = Σ_t w_t ‖A_t − π(B)_t‖²,   w_t = 1 / (entries of t)      (weighting "tensor")

so every tensor counts by its mean squared difference, whatever its size (an embedding table of
50k rows counts as much as one MLP matrix; the paper's code weighs its blocks the same way).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from glmc.devices import matching_device
from glmc.errors import GlmcError
from glmc.matching import workspace
from glmc.matching.heads import HeadUnit, Proposal, balancing, head_unit, propose_heads
from glmc.matching.held import HeldState, held_dtype, rounded
from glmc.matching.options import WEIGHTINGS, WeightMatchingOptions
from glmc.matching.steps import solve
from glmc.model import CanonicalModel, check_pair
from glmc.symmetry.elements import Permutation
from glmc.symmetry.groups import (
    Element,
    Group,
    GroupedPermutationGroup,
    OrthogonalGroup,
    PermutationGroup,
)
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import apply_axes
from glmc.tensors import StateDict, axis_first
from glmc.threads import num_threads

__all__ = ["UNIT_STEPS", "WEIGHTINGS", "Problem", "Proposal", "WeightMatchingOptions",
           "centred_pair", "check_pair", "cross", "effective_groups", "fixes_ones",
           "propose_heads", "propose_permutation", "propose_unit", "stream_space"]


def tensor_weights(spec: SymmetrySpec, state: StateDict, scheme: str,
                   row_masks: dict[str, tuple[int, torch.Tensor]] | None = None,
                   bias_weight: float = 1.0,
                   role_weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """w_t per tensor: 1/entries ("tensor"; masked rows do not count) or 1 ("none"); under
    "tensor", bias vectors (1-D ``*.bias``) times ``bias_weight``; the tensors a space of
    role r acts on (the spec's roles: "qk" for attention's queries and keys) times
    ``role_weights[r]``."""
    if scheme not in WEIGHTINGS:
        raise GlmcError(f"unknown weighting {scheme!r} (one of {', '.join(WEIGHTINGS)})")
    factor = {n: (role_weights or {})[role] for s, role in spec.roles.items()
              if role in (role_weights or {}) for n, _, _ in spec.occurrences(s)}
    state = shapes_of(state)  # (sizes only: a streamed model's tensors are not read)
    w = {}
    for name in spec.axes:
        if scheme == "none":
            w[name] = 1.0
            continue
        owner = name[:-len("bias")] + "weight" if name.endswith(".bias") else name
        # ("layer": a bias counts as its layer's entries do)
        name_for_size = owner if scheme == "layer" and owner in state else name
        entries = state[name_for_size].numel()
        if row_masks and name_for_size in row_masks:
            axis, mask = row_masks[name_for_size]
            entries = entries // state[name_for_size].shape[axis] * max(1, int(mask.sum()))
        w[name] = 1.0 / entries
        if scheme == "tensor" and name.endswith(".bias") and state[name].dim() == 1:
            w[name] *= bias_weight
        w[name] *= factor.get(name, 1.0)
    return w


def shapes_of(state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """``state``'s tensors, or where it streams them (:class:`glmc.io.streamed.StreamedState`)
    their shapes and dtypes on the meta device (nothing read)."""
    return getattr(state, "meta", state)


def streamed(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``state`` makes each tensor when read, keeping none (a streamed model: its
    weighted copies are then made when read too, never kept)."""
    return getattr(state, "streamed", False)


def cross_sum(pairs: list[tuple[torch.Tensor, torch.Tensor]],
              scales: list[float] | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Σ s·a·bᵀ over the pairs (each (n, ·) and (m, ·)): accumulated in place, never
    concatenated (a concatenation would copy every operand, transposed ones included);
    ``out``: an (n, m) tensor to write it into."""
    for i, (a, b) in enumerate(pairs):
        s = 1.0 if scales is None else scales[i]
        if i == 0:
            out = a @ b.T if out is None else torch.matmul(a, b.T, out=out)
            if s != 1.0:
                out.mul_(s)
        else:
            out.addmm_(a, b.T, alpha=s)
    return out


def head_tensors(spec: SymmetrySpec) -> set[str]:
    """The tensors of every space nested in another and of the spaces they nest in (what
    aligning heads' inner maps reads)."""
    spaces = {s for c in spec.chains() for s in c.spaces}
    return {n for s in spaces for n, _, _ in spec.occurrences(s)}


def stream_space(spec: SymmetrySpec) -> str | None:
    """The residual stream: the space whose group is orthogonal (weight matching supports
    one)."""
    streams = [s for s, g in spec.spaces.items() if isinstance(g, OrthogonalGroup)]
    if len(streams) > 1:
        raise GlmcError(f"the spec has {len(streams)} orthogonal spaces ({', '.join(streams)}); "
                        "weight matching supports one residual stream")
    return streams[0] if streams else None


def centred_pair(a: CanonicalModel, b: CanonicalModel) -> bool:
    """Both streams stay in the ones-complement (every residual writer mean-zero)."""
    return a.uncentred_writer() is None and b.uncentred_writer() is None


def fixes_ones(a: CanonicalModel, b: CanonicalModel) -> bool:
    """Whether the residual map should fix the all-ones direction: when the family says the
    stock class needs it (a LayerNorm model's) and both models can still be written back as
    it (both streams centred)."""
    stream = stream_space(a.spec)
    return (stream is not None and a.spec.export.get(stream) == "fix_ones"
            and centred_pair(a, b))


def effective_groups(spec: SymmetrySpec, residual: str, inner: str,
                     fix_ones: bool) -> dict[str, Group]:
    """The group each space is matched in: the stream's (``residual``: "orthogonal", fixing
    the all-ones direction when ``fix_ones``; "permutation": its permutations, the
    ablation), the heads' inner maps restricted to ``inner`` ("invertible", "orthogonal" or
    "permutation"), every other space's own."""
    stream = stream_space(spec)
    nested = {s for c in spec.chains() for s in c.spaces[:-1]}
    out = dict(spec.spaces)
    for s, g in spec.spaces.items():
        if s == stream:
            out[s] = (g.permutations() if residual == "permutation"
                      else g.subgroup("fix_ones") if fix_ones else g)
        elif s in nested and not isinstance(g, GroupedPermutationGroup):
            out[s] = g.subgroup(inner)
    return out


class WeightedState(Mapping[str, torch.Tensor]):
    """One model's tensors as the distance weighs them: √w_t·X_t, rows outside a row mask
    zeroed. Those in ``held`` are made once and kept; the others are made again at each
    read, or block by block of rows (B's, and the tensors only the residual stream touches,
    are read a few times at the start: kept, they would cost a copy of the models for the
    whole run).

    ``consume``: the state is handed over (``WeightMatchingOptions.hand_over``): each kept
    copy replaces in ``state`` the tensor it is made from, which is freed at once, and
    :meth:`drop` frees the others' when they are no longer read. A kept tensor that
    bfloat16 or float16 holds exactly (:func:`packed`: a half-precision checkpoint's tensors
    that the canonical rewrite leaves as stored) is kept so instead, at half the memory, and
    weighed when read: the same numbers (``state`` then holds a placeholder of its shape
    and dtype on the meta device). Kept copies, packed or not, live on the device the
    weighing puts its tensors on (``weigh.device``: B's, made when read, are moved there as
    they are).

    ``half``: the dtype the pair is held in (:func:`glmc.matching.held.held_dtype`): every
    tensor is read rounded to it, in float32 at least, and every kept one kept in it."""

    def __init__(self, state: StateDict, names: list[str],
                 weigh: Callable[[str, torch.Tensor, slice | None], torch.Tensor],
                 held: set[str], consume: bool = False,
                 half: torch.dtype | None = None) -> None:
        self._state, self._weigh, self._half = state, weigh, half
        self._names = dict.fromkeys(names)  # (ordered)
        self._held: dict[str, torch.Tensor] = {}
        self._packed: dict[str, tuple[torch.Tensor, torch.dtype]] = {}
        for n in names:
            if n not in held:
                continue
            t = state[n]
            small = (packed(t) if half is None or t.is_meta else t.to(half)) if consume else None
            if small is not None:
                self._packed[n] = (_placed(weigh, small),
                                   torch.promote_types(t.dtype, torch.float32))
                state[n] = torch.empty_like(t, device="meta")
            else:
                self._held[n] = weigh(n, rounded(t, half), None)
                if consume:
                    state[n] = self._held[n]

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._held.get(name)
        if t is not None:
            return t
        if name not in self._names:
            raise KeyError(name)
        small = self._packed.get(name)
        if small is not None:
            return self._weigh(name, small[0].to(small[1]), None)
        return self._weigh(name, rounded(self._state[name], self._half), None)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def pop(self, name: str, default: object = None) -> object:
        """Forget ``name`` (its kept copy is freed)."""
        self._names.pop(name, None)
        self._packed.pop(name, None)
        return self._held.pop(name, default)

    def drop(self, name: str) -> None:
        """Take the tensor ``name`` is made from out of the state (handed over: it is freed
        unless kept; a read of ``name`` not kept is then a KeyError, never other values)."""
        self._state.pop(name, None)

    def shape(self, name: str) -> torch.Size:
        return shapes_of(self._state)[name].shape

    def rows(self, name: str, size: int) -> Iterator[torch.Tensor]:
        """The weighted tensor ``name`` in blocks of ``size`` rows (of its first axis)."""
        t, held, small = self._state[name], self._held.get(name), self._packed.get(name)
        for i in range(0, t.shape[0], size):
            s = slice(i, i + size)
            yield (held[s] if held is not None else self._weigh(
                name, small[0][s].to(small[1]) if small else rounded(t[s], self._half), s))

    def sq_norm(self, name: str, block: int = 1 << 22) -> float:
        """‖√w_t·X_t‖² summed in float64; a tensor of more than ``block`` entries (an
        embedding table) in blocks of rows, so that neither its weighted nor its float64
        copy is made whole (a 50k x 768 table's would take 150 and 300 MB)."""
        t = shapes_of(self._state)[name]
        if t.numel() <= block or t.dim() == 0:
            return float(self[name].double().pow(2).sum())
        size = max(1, block // max(1, t[0].numel()))
        return sum(float(c.double().pow_(2).sum()) for c in self.rows(name, size))


def packed(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` (float32) in bfloat16 or float16 when that holds every entry exactly (converted
    back, the same tensor bit for bit), else None."""
    if t.dtype != torch.float32 or t.device.type == "meta":
        return None
    for dtype in (torch.bfloat16, torch.float16):
        half = t.to(dtype)
        if torch.equal(half.to(t.dtype), t):  # (±0 keep their sign; the models are finite)
            return half
    return None


def _placed(weigh: Callable, t: torch.Tensor) -> torch.Tensor:
    """``t`` on the device ``weigh`` puts its tensors on (none named: where it is)."""
    device = getattr(weigh, "device", None)
    return t if device is None else t.to(device)


@dataclass(frozen=True)
class Weighing:
    """A tensor as the distance weighs it, on ``device``: masked rows zeroed, times √w_t. (A
    value of its own, not a method of the problem: the weighted states hold it, and a method
    would tie them and the problem into a cycle that keeps every tensor until the garbage
    collector runs, a model's worth per finished matching.)"""

    w: Mapping[str, float]
    row_masks: Mapping[str, tuple[int, torch.Tensor]]
    device: torch.device | None = None  # (None: where each tensor is)

    def __call__(self, name: str, t: torch.Tensor, rows: slice | None) -> torch.Tensor:
        """``t`` weighed, on the device; ``rows``: the rows of tensor ``name`` that ``t``
        holds (None: all)."""
        t = _placed(self, t)  # (a no-op on the host)
        if name in self.row_masks:
            axis, mask = self.row_masks[name]
            if rows is not None and axis == 0:
                mask = mask[rows]
            shape = [1] * t.dim()
            shape[axis] = -1
            t = t * mask.reshape(shape).to(t.device, t.dtype)
        scale = self.w[name] ** 0.5
        return t * scale if scale != 1.0 else t


class Problem:
    """Weighted A and B (each tensor times √w_t: :class:`WeightedState`, A's copies kept for
    the tensors the steps read, B's made when read), the spec's units, and the distance's
    terms. A pair handed over and stored in bfloat16 is held in it (``half``, and B moved:
    :meth:`moved`; see :mod:`glmc.matching.held`)."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, opts: WeightMatchingOptions,
                 only: set[str] | None = None,
                 local: Callable[[Problem], Collection[str]] | None = None):
        """``only``: these tensors alone (a caller that reads no others saves their
        memory and time; the distance and its scale then cover these only).

        ``local``: given the problem's structure (its units, groups and streams: everything
        but the tensors), the tensors this process works on (weight matching spread across
        processes, :mod:`glmc.matching.spread`): A's copies are kept and the norms computed
        for those alone; ``sq_a`` and ``sq_b`` then lack the others until the caller fills
        them in. Every tensor can still be read (weighed when read)."""
        spec = a.spec.weights_only()  # (statistics move with their units, unweighed)
        self.spec, self.opts = spec, opts
        #: Where the weighted copies and the products live (``opts.device``)
        self.device = matching_device(opts.device)
        self.w = tensor_weights(spec, a.state, opts.weighting, opts.row_masks,
                                opts.bias_weight, opts.role_weights)
        names = [n for n in spec.axes if only is None or n in only]
        self.names = names  # (the tensors the distance covers, in the spec's order)
        stream = stream_space(spec)
        #: The dtype the pair is held in when not its own (see :mod:`glmc.matching.held`)
        self.half = held_dtype(a, b, opts.hand_over)
        own = shapes_of(a.state)[next(iter(spec.axes))].dtype
        #: The dtype of the products and of the elements
        self.dtype = own if self.half is None else torch.promote_types(own, torch.float32)
        self._balance: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._memo: dict[str, Any] = {}
        self._unit_norms: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        #: The group each space is matched in (the ablations restrict the model's own).
        self.groups = effective_groups(spec, opts.residual, opts.inner or "invertible",
                                       bool(opts.fix_ones))
        #: The residual space the descent solves (None: none, or residual "none")
        self.stream = stream if opts.residual != "none" else None
        nested = {s for c in spec.chains() for s in c.spaces[:-1]}
        # Every other space is a unit with a step of its own (``UNIT_STEPS``, by its group) or
        # is solved with the unit it is nested in (the heads' inner maps and orders).
        self.units = [s for s, g in self.groups.items()
                      if type(g) in UNIT_STEPS and s != stream and s not in nested]
        for s, g in self.groups.items():
            if s not in self.units and s != stream and s not in nested:
                raise GlmcError(f"space {s}: weight matching has no step for a free {g.kind} "
                                "space")
        #: What each unit carries nested in it (its inner spaces), and the head units'
        #: structure (see :mod:`glmc.matching.heads`).
        self.inner_of: dict[str, list[str]] = {u: spec.nested_in(u) for u in self.units}
        self.head_units: dict[str, HeadUnit] = {
            u: head_unit(spec, self.groups, u) for u in self.units if self.inner_of[u]}
        #: Tensors on which a nested space acts: their maps need not keep norms.
        self.bundled = {n for u in self.head_units for s in self.inner_of[u]
                        for n, _, _ in spec.occurrences(s)}
        # Units that share no tensor are independent given the residual map (transformers:
        # every unit meets only the residual stream); chained ones (an MLP's hidden layers)
        # must be solved one after another.
        owners: dict[str, set[str]] = defaultdict(set)
        for u in self.units:
            for n in self.term_names(u):
                owners[n].add(u)
        self.independent = all(len(us) <= 1 for us in owners.values())
        keep = set(names) if local is None else set(local(self)) & set(names)
        # A's weighted copies are read by every step, except those of the tensors only the
        # stream touches (folded into one constant at the start); B's only at the start.
        solo = {n for n in names if stream is not None and spec.spaces_of(n) == {stream}}
        hand_over = opts.hand_over  # (A's tensors replaced by their kept copies)
        weigh = Weighing(self.w, opts.row_masks, self.device)
        # (A streamed: each step reads its tensors from A's files, none is kept)
        self.A = WeightedState(a.state, names, weigh,
                               set() if streamed(a.state) else keep - solo,
                               consume=hand_over, half=self.half)
        self.B = WeightedState(b.state, names, weigh, set(), half=self.half)  # (freed in apply)
        # ‖A_t‖², ‖B_t‖² (weighted): a tensor moved by permutations and orthogonal maps keeps
        # its norm, so its distance term is ‖A‖² + ‖B‖² − 2⟨A, π(B)⟩.
        self.sq_a = {n: self.A.sq_norm(n) for n in names if n in keep}
        self.sq_b = {n: self.B.sq_norm(n) for n in names if n in keep}
        if hand_over:  # (B is read at the start only: what the steps would read of it, now)
            self._units_norms([u for u in self.units if u not in self.head_units
                               and self.term_names(u) & keep])

    # -- the distance -------------------------------------------------------------------------
    def terms(self, bt: StateDict, names: set[str] | None = None) -> dict[str, float]:
        """w_t‖A_t − π(B)_t‖² for the tensors of the transformed B ``bt`` (those in ``names``).

        A tensor inside a head carries the heads' invertible inner maps, which change its norm:
        its term is computed directly; every other one from its inner product."""
        out = {}
        for n, x in bt.items():
            if names is not None and n not in names:
                continue
            if n in self.bundled:
                out[n] = squared_distance(self.A[n], x)
            else:
                out[n] = self.sq_a[n] + self.sq_b[n] - 2 * float((self.A[n] * x).sum())
        return out

    def scale(self) -> float:
        """Σ_t w_t(‖A_t‖² + ‖B_t‖²): the distance of two unrelated models (to read it as a
        fraction: 0 for B = A, about 1 for unrelated weights, 2 for B = −A)."""
        return sum(self.sq_a.values()) + sum(self.sq_b.values())

    def release(self, names: list[str]) -> None:
        """Drop the weighted copies of ``names`` (e.g. embedding tables whose contribution is
        already folded into a constant): their memory is returned before the loop starts
        (handed over, the models' own tensors of ``names`` too)."""
        for n in names:
            self.A.pop(n, None)
            self.B.pop(n, None)
            if self.opts.hand_over:
                self.A.drop(n)
                self.B.drop(n)

    def term_names(self, space: str) -> set[str]:
        """The tensors that ``space`` (or the inner spaces nested in it) touches."""
        return {n for s in [space, *self.inner_of.get(space, [])]
                for n, _, _ in self.spec.occurrences(s)}

    def apply(self, elements: dict[str, Element], exclude: set[str],
              names: list[str] | None = None) -> StateDict:
        """B with every element applied except those of the spaces in ``exclude``; B handed
        over (``opts.hand_over``: the start's B moved, read once), each of its tensors is
        freed once moved."""
        # (identity permutations would only copy: the start's are most of the elements)
        use = {k: e for k, e in elements.items() if k not in exclude
               and not (isinstance(e, Permutation) and e.is_identity())}
        out = self.moved()
        for n in (names if names is not None else self.spec.axes):
            out[n] = apply_axes(self.B[n], self.spec.axes[n], use)
            if self.opts.hand_over:
                self.B.drop(n)
        return out

    def moved(self, items: Iterable[tuple[str, torch.Tensor]] = ()) -> StateDict:
        """A state of B moved, as the matching holds it, filled with ``items`` (made one by
        one): a dict, or held in the pair's half dtype (:class:`HeldState`, each tensor
        rounded as it is set: the terms computed from it are those of what is held)."""
        if self.half is None:
            return dict(items)
        return HeldState(self.half, self.dtype, items)  # type: ignore[return-value]

    def stream_group(self) -> Group:
        """The group the residual map is sought in (see :func:`effective_groups`)."""
        return self.groups[self.stream]

    def solve_stream(self, m: torch.Tensor, current: Element | None = None) -> Element:
        """The residual map maximising ⟨T, m⟩ (Procrustes, or an assignment)."""
        return solve(self.stream_group(), m, current, self.dtype)

    # -- what the units' costs read -------------------------------------------------------
    def raw(self, name: str) -> float:
        """The factor that turns a weighted tensor back into the model's own entries."""
        return self.w[name] ** -0.5

    def unit_norms(self, space: str) -> tuple[torch.Tensor, torch.Tensor]:
        """‖a_i‖, ‖b_j‖ (n,) of the units' vectors (each unit's slices of every tensor it
        touches, unweighted). Permutations and orthogonal maps of the other axes keep them,
        so B's are computed once, in its own order."""
        if space not in self._unit_norms:
            out = []
            for s in (self.A, self.B):
                sq = None
                for n, ax, _ in self.spec.occurrences(space):
                    if n in s:
                        v = axis_first(s[n], ax).double().pow(2).sum(1) * self.raw(n) ** 2
                        sq = v if sq is None else sq + v
                out.append(sq.sqrt().clamp_min(1e-30))
            self._unit_norms[space] = (out[0], out[1])
        return self._unit_norms[space]

    def _units_norms(self, units: list[str]) -> None:
        """:meth:`unit_norms` of ``units`` made now (B handed over is not read later), on one
        thread as a unit's worker makes them (a reduction's order can follow the threads)."""
        if self.opts.unit_cost == "distance":  # (no step reads them)
            return
        with num_threads(1):
            for u in units:
                self.unit_norms(u)

    def memo(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, made once per ``key`` (for what depends on A alone, which never
        moves; units on several threads ask for their own keys)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def balance(self, space: str, st) -> tuple[torch.Tensor, torch.Tensor]:
        """The balancing maps (n, k, k) of A's and of B's own heads in ``space``, from the
        pair statistics ``st`` the first time (orthogonal maps of the residual stream and the
        query heads' order leave the Grams alone)."""
        if space not in self._balance:
            self._balance[space] = balancing(st)
        return self._balance[space]


# -- the units ------------------------------------------------------------------------------


def cross(prob: Problem, space: str, el: dict[str, Element], bt: StateDict,
          unweighted: bool = False) -> torch.Tensor:
    """M = Σ over (tensor, axis) of ``space``: A_axis-first · B̃_axis-firstᵀ, (n, n).

    ``bt`` holds B with every space but ``space`` applied (tensors it lacks are skipped).
    Where the space acts on a tensor twice (a circuit-form attention weight) the term is
    quadratic: it is linearised at the current element, applied on the other axis.
    ``unweighted``: the models' own entries (the units' costs), not the weighted ones.
    Written into the calling worker's buffer (:mod:`glmc.matching.workspace`).
    """
    counts: dict[str, int] = defaultdict(int)
    for n, _, _ in prob.spec.occurrences(space):
        counts[n] += 1
    pairs, scales = [], []
    for n, axis, _ in prob.spec.occurrences(space):
        if n not in bt:
            continue
        b = bt[n]
        if counts[n] > 1:
            b = apply_axes(b, prob.spec.axes[n], {space: el[space]}, skip={(axis, space)})
        pairs.append((axis_first(prob.A[n], axis), axis_first(b, axis)))
        scales.append(prob.raw(n) ** 2 if unweighted else 1.0)
    if not pairs:
        return None  # type: ignore[return-value]
    shape = (pairs[0][0].shape[0], pairs[0][1].shape[0])
    dtype = torch.promote_types(pairs[0][0].dtype, pairs[0][1].dtype)
    return cross_sum(pairs, scales, out=workspace.buffer("cross", shape, dtype,
                                                         pairs[0][0].device))


def angle_cost(c: torch.Tensor, na: torch.Tensor, nb: torch.Tensor,
               block: int = 1 << 17) -> torch.Tensor:
    """−‖â_i − b̂_j‖ = −√(2 − 2 cos) (n, m) in float64 for cos = c / (na_i·nb_j), c (n, m)
    and the norms (n,), (m,). Written block by block of rows into the calling worker's
    buffer (each block's arithmetic stays in cache, and no n × m temporary is made)."""
    out = workspace.buffer("cost", tuple(c.shape), torch.float64, c.device)
    rows = max(1, block // max(1, c.shape[1]))
    for i in range(0, c.shape[0], rows):
        o = out[i:i + rows]
        o.copy_(c[i:i + rows])
        o.div_(na[i:i + rows, None] * nb[None])
        o.mul_(-2).add_(2).clamp_(min=0).sqrt_().neg_()
    return out


def propose_permutation(prob: Problem, space: str, el: dict[str, Element],
                        bt: StateDict) -> Proposal:
    """Units assigned by D's own terms (or by the angle between their vectors)."""
    if prob.opts.unit_cost == "distance":
        cost = cross(prob, space, el, bt)
    else:  # (from the unweighted cross-correlation)
        na, nb = prob.unit_norms(space)
        cost = angle_cost(cross(prob, space, el, bt, unweighted=True), na, nb)
    return Proposal(cost, lambda perm: {space: perm})


def propose_unit(prob: Problem, space: str, el: dict[str, Element], bt: StateDict) -> Proposal:
    """A permutation's step: its units assigned by their vectors, or, where its blocks carry
    inner spaces (heads in head form), by what is left after aligning each pair's inner
    maps."""
    propose = propose_heads if space in prob.head_units else propose_permutation
    return propose(prob, space, el, bt)


#: Weight matching's step for a unit, by the unit's group: the cost that its step
#: (:func:`glmc.matching.steps.solve`) maximises. (A space whose group has none is the
#: residual stream, or is nested in a unit.)
UNIT_STEPS: dict[type[Group], Callable[[Problem, str, dict[str, Element], StateDict],
                                      Proposal]] = {PermutationGroup: propose_unit}


def squared_distance(a: torch.Tensor, b: torch.Tensor, block: int = 1 << 20) -> float:
    """‖a − b‖² summed in float64, about ``block`` entries at a time (a float64 difference of
    the whole tensor would be twice its float32 size beside it: 0.5 GB at 4096²)."""
    a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    rows = max(1, block // max(1, a.shape[1]))
    return sum(float((a[i:i + rows] - b[i:i + rows]).double().pow_(2).sum())
               for i in range(0, a.shape[0], rows))


def relative(distance: float, scale: float) -> float:
    return distance / scale if scale > 0 else math.nan
