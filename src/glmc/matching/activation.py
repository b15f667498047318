"""Activation matching: B's symmetries chosen so that its activations on data match A's.

Both models run the same training batches; at the family's probes (``Family.probes``: where
a space's units show) the statistics of both models' observations accumulate in float64,
over every example and position, and each space is solved from them by its group's kind:

- **units** (a permutation space: MLP hidden units, conv channels, a ResNet stage's tied
  stream): the Pearson correlation corr[i, j] of A's unit i with B's unit j, summed over the
  space's probes; the permutation maximising the total is a linear assignment (Git
  Re-Basin's activation matching).
- **heads** (a permutation space with inner spaces nested in it: attention heads, or with
  grouped-query attention key/value groups, with their QK and OV maps): heads compared by
  the canonical correlations of their outputs (:func:`canonical_scores`, whose docstring
  says why these; a group by its query heads' outputs side by side), assigned; the spaces
  nested in them are then aligned by weight matching's own step given that assignment and
  the residual map (:func:`glmc.matching.inner.realign_inner`): each head's QK and OV maps
  and, inside each matched group, the query heads' order, which that step chooses by their
  circuits (which no inner map changes) together with the maps it computes for it.
- **stream** (an orthogonal space: a transformer's residual stream): one map for every
  point where the stream is observed (after the embedding and after every block), the
  orthogonal Procrustes solution of the two models' stream vectors there, each scaled to
  unit RMS (an orthogonal map keeps every norm, so the scaling is equivariant; it gives
  every token and every depth the same weight, where the stream's growing norm would let
  the last blocks decide alone). It fixes the all-ones direction where the family's export
  needs it (``spec.export``) and both models are centred, as weight matching does; the
  permutation-only ablation (``residual="permutation"``) is an assignment on the same
  cross moments, and ``residual="none"`` leaves the stream alone.

Two variants (:data:`VARIANTS`) choose what a unit's activation is:

- ``"post"`` (Git Re-Basin's; method ``activation``): what the next layer reads, each unit
  after the nonlinearity that follows its probe; a space observed where it is a stream
  itself (``Probe.stream``: a ResNet stage's block outputs, after the addition and its
  ReLU) is correlated there.
- ``"prepost"`` (glmc's own; method ``activation-prepost``): each probe's units before and
  after that nonlinearity, the two correlations summed (the pre-activation tells apart
  units that a ReLU silences on these batches, whose post-activation correlation is 0 with
  every unit); a tied stream is correlated at its writers (the summands before the addition).

Where no probe names a nonlinearity and no space has writers besides its stream (the
transformer family), the two coincide. Spaces are independent given the data, so one pass
over the batches serves them all; only A's observations of the current batch are held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from glmc.correction import probe_hooks, units_first
from glmc.errors import GlmcError
from glmc.families.base import Probe
from glmc.matching.inner import realign_inner
from glmc.matching.options import default_inner
from glmc.matching.problem import Problem, WeightMatchingOptions, effective_groups, fixes_ones
from glmc.matching.residual import Solo
from glmc.matching.steps import solve
from glmc.model import CanonicalModel
from glmc.symmetry.groups import Element, OrthogonalGroup, PermutationGroup
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform

Batch = tuple[torch.Tensor, torch.Tensor]
#: The nonlinearities a probe may name (``Probe.activation``).
ACTIVATIONS: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: lambda y: y, "relu": torch.relu, "tanh": torch.tanh}
#: What a unit's activation is: after the nonlinearity (Git Re-Basin's), or before and after.
VARIANTS = ("post", "prepost")


@dataclass
class _Sums:
    """Running float64 sums of both models' observations of one space: batches (n, N) of N
    samples of n units. ``items``: keep each model's joint Gram of every item's units (the
    axis cut into that many equal chunks: one unit each for a permutation of units, head_dim
    or a group's query heads for heads); None: no Grams."""

    items: int | None = None
    count: int = 0
    #: Σa, Σb, Σa·bᵀ, then (with ``items``) each model's Grams (items, chunk, chunk).
    sums: list[torch.Tensor] = field(default_factory=list)

    def add(self, fa: torch.Tensor, fb: torch.Tensor) -> None:
        parts = [fa.sum(1), fb.sum(1), fa @ fb.T]
        if self.items is not None:
            if fa.shape[0] % self.items:
                raise GlmcError(f"a probe of {fa.shape[0]} units cannot show {self.items} "
                                "items of its space")
            parts += [v @ v.mT for v in (f.view(self.items, -1, f.shape[1]) for f in (fa, fb))]
        if not self.sums:
            self.sums = parts
        else:
            for mine, part in zip(self.sums, parts, strict=True):
                mine.add_(part)
        self.count += fa.shape[1]

    def moment(self) -> torch.Tensor:
        """The uncentred cross moment E[a·bᵀ] (n, n)."""
        return self.sums[2] / self.count

    def covariance(self) -> torch.Tensor:
        """The cross-covariance (n, n): rows A's units, columns B's."""
        ma, mb = (s / self.count for s in self.sums[:2])
        return self.moment() - ma[:, None] * mb[None, :]

    def own(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each model's covariance of every item's units, (items, chunk, chunk)."""
        out = []
        for s, g in zip(self.sums[:2], self.sums[3:], strict=True):
            m = s.view(g.shape[0], -1) / self.count
            out.append(g / self.count - m[:, :, None] * m[:, None, :])
        return out[0], out[1]


def correlations(s: _Sums) -> torch.Tensor:
    """corr[i, j] (n, n): the Pearson correlation of A's unit i with B's unit j (0 for a unit
    constant on the batches)."""
    va, vb = (v[:, 0, 0] for v in s.own())
    live = (va > 1e-24 * va.max())[:, None] & (vb > 1e-24 * vb.max())[None, :]
    sd = (va.clamp_min(1e-300)[:, None] * vb.clamp_min(1e-300)[None, :]).sqrt()
    return torch.where(live, s.covariance() / sd, 0.0)


def _inv_sqrt(c: torch.Tensor) -> torch.Tensor:
    """C^(-1/2) of covariances (..., k, k), with a ridge of 1e-10 of the mean variance."""
    k = c.shape[-1]
    ridge = 1e-10 * c.diagonal(dim1=-2, dim2=-1).sum(-1) / k + 1e-300
    w, v = torch.linalg.eigh(c + ridge[..., None, None] * torch.eye(k, dtype=c.dtype))
    return (v * w.clamp_min(1e-300).rsqrt()[..., None, :]) @ v.mT


def canonical_scores(s: _Sums) -> torch.Tensor:
    """score[i, j] (items, items): the sum of the canonical correlations of A's head i's
    output with B's head j's (each ``chunk`` coordinates: a head's head_dim, or a key/value
    group's query heads side by side).

    A head is observed *before* the output projection, as its value-weighted sum y_h, not as
    its contribution O_h·y_h to the stream: y_h does not depend on the residual map (the
    stream's basis enters the value weights and leaves through the output projection), so
    heads are assigned from data alone, without a residual map first and without its errors;
    and it has head_dim coordinates, where a contribution spans d (a d × d cross-covariance
    per pair of heads, of rank head_dim, whose canonical correlations would need d samples
    per head and products of d × d matrices for every pair).

    What the symmetry leaves of y_h is the head's OV map, an invertible N: y_h -> N·y_h (for
    a key/value group also the order of its query heads, a permutation of their blocks). The
    canonical correlations are invariant to any invertible map on either side, so matched
    heads of a planted pair score head_dim (every correlation 1) whatever N is, and the order
    of a group's query heads does not enter. Their sum is a Procrustes invariant: the
    largest correlation of the two whitened outputs under an orthogonal map between them
    (⟨Q, W_a·C_ab·W_b⟩ maximised over orthogonal Q is the nuclear norm).
    """
    wa, wb = (_inv_sqrt(c) for c in s.own())
    n, k = wa.shape[0], wa.shape[1]
    cross = s.covariance().view(n, k, n, k).transpose(1, 2)  # (A item, B item, k, k)
    return torch.linalg.svdvals(wa[:, None] @ cross @ wb[None]).sum(-1)


@dataclass(frozen=True)
class _Kind:
    """How a kind of space is solved: whether its sums keep a Gram per item of its group,
    whether each observed vector is first scaled to unit RMS, and its score (what the
    space's group step maximises)."""

    grams: bool
    unit_rms: bool
    score: Callable[[_Sums], torch.Tensor]


KINDS = {
    "units": _Kind(True, False, correlations),
    "heads": _Kind(True, False, canonical_scores),
    "stream": _Kind(False, True, _Sums.moment),
}


def space_kind(spec: SymmetrySpec, space: str) -> str | None:
    """The kind of ``space`` by its group (None: activation matching has no step for it)."""
    group = spec.spaces[space]
    if isinstance(group, OrthogonalGroup):
        return "stream"
    if type(group) is PermutationGroup:
        return "heads" if spec.nested_in(space) else "units"
    return None


def observed(probes: Sequence[Probe], variant: str) -> list[Probe]:
    """The probes of one space that a variant reads: where the space is a stream itself if
    any (``"post"``) or its writers if any (``"prepost"``), else the others."""
    stream = [p for p in probes if p.stream]
    writers = [p for p in probes if not p.stream]
    return (stream or writers) if variant == "post" else (writers or stream)


def views(p: Probe, variant: str) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The activations a probe's output gives: after its nonlinearity, and before it too for
    ``"prepost"``."""
    after = ACTIVATIONS[p.activation]
    return [after] if variant == "post" or p.activation is None else [ACTIVATIONS[None], after]


@dataclass
class _Point:
    """One probe as read: the kind of its space, and a running sum per view."""

    probe: Probe
    kind: str
    views: list[Callable[[torch.Tensor], torch.Tensor]]
    sums: list[_Sums]
    units: int = 0

    def add(self, ya: torch.Tensor, yb: torch.Tensor) -> None:
        for view, s in zip(self.views, self.sums, strict=True):
            fa, fb = (units_first(view(y), self.probe.axis) for y in (ya, yb))
            if KINDS[self.kind].unit_rms:
                fa, fb = (f / f.pow(2).mean(0).sqrt().clamp_min(1e-300) for f in (fa, fb))
            self.units = fa.shape[0]
            s.add(fa, fb)


def _plan(a: CanonicalModel, variant: str, residual: str) -> list[_Point]:
    """The points to read: every solved space's observed probes.

    Raises:
        GlmcError: a space without a step here, or one that no probe observes.
    """
    if variant not in VARIANTS:
        raise GlmcError(f"unknown activation variant {variant!r} ({' or '.join(VARIANTS)})")
    spec = a.spec
    probes = a.family.probes(a.config)
    nested = {s for c in spec.chains() for s in c.spaces[:-1]}
    points = []
    for space, group in spec.spaces.items():
        kind = space_kind(spec, space)
        if space in nested or (kind == "stream" and residual == "none"):
            continue  # (solved with the heads they are nested in; left alone)
        mine = observed([p for p in probes if p.space == space], variant)
        if kind is None or not mine:
            raise GlmcError(
                "activation matching needs every space to be a permutation or the residual "
                f"stream, observed by a probe; the {a.family.name} family "
                + (f"does not observe {space}" if kind is not None else
                   f"has a {group.kind} space {space} (use weight or learned matching)"))
        items = group.n if KINDS[kind].grams else None
        for p in mine:
            fns = views(p, variant)
            points.append(_Point(p, kind, fns, [_Sums(items) for _ in fns]))
    return points


def settle_unvisited(a: CanonicalModel, b: CanonicalModel, space: str,
                     m: torch.Tensor) -> torch.Tensor:
    """The stream's cross moment ``m`` plus, at 1e-6 of its scale, weight matching's term of
    the tensors only the stream touches (embeddings, the head, the biases it adds).

    The data decide the map on every direction the streams visit and nothing on the others:
    a centred model's stream never leaves the ones-complement, yet a bias after its final
    norm and the head that reads it do use the all-ones direction, and a map that sends B's
    image of it to −1 instead of 1 keeps π(B)'s function but not the merge's. The weights
    settle those directions (exactly, for a planted pair) and move the visited ones by
    about 1e-6 of their spread."""
    spec = a.spec
    names = {n for n, _, _ in spec.occurrences(space) if spec.spaces_of(n) == {space}}
    if not names:
        return m
    solo = Solo.of(Problem(a, b, WeightMatchingOptions(), only=names), space).const
    return m + 1e-6 * m.norm() / solo.norm().clamp_min(1e-300) * solo


@torch.no_grad()
def activation_matching(a: CanonicalModel, b: CanonicalModel, batches: Sequence[Batch], *,
                        variant: str = "post", residual: str = "orthogonal") -> Transform:
    """The transform π of B that best matches its activations on ``batches`` with A's (see
    the module's docstring; ``variant``: one of :data:`VARIANTS`; ``residual``: the residual
    stream's group, ``"orthogonal"``, ``"permutation"`` or ``"none"``).

    Raises:
        GlmcError: a family without probes, a space no probe observes or without a step
            here, or fewer samples at a probe than it shows units (the message says how many
            are needed).
    """
    points = _plan(a, variant, residual)
    held: dict[Probe, torch.Tensor] = {}
    by_probe = {pt.probe: pt for pt in points}
    modules = (a.module(), b.module())
    with probe_hooks(modules[0], list(by_probe), held.__setitem__), \
            probe_hooks(modules[1], list(by_probe),
                        lambda p, y: by_probe[p].add(held.pop(p), y)):
        for x, _ in batches:
            modules[0](x.to(a.dtype) if x.is_floating_point() else x)
            modules[1](x.to(b.dtype) if x.is_floating_point() else x)
    for pt in points:
        if not pt.units:
            raise GlmcError("activation matching needs training batches; none were given")
        if pt.sums[0].count < pt.units:
            raise GlmcError(f"activation matching needs at least {pt.units} samples (examples "
                            f"× positions) at {pt.probe.module}, one per unit of "
                            f"{pt.probe.space}; the batches give {pt.sums[0].count}")
    spec = a.spec
    fix = fixes_ones(a, b)
    groups = effective_groups(spec, residual, default_inner(residual), fix)
    elements: dict[str, Element] = {s: g.identity(a.dtype) for s, g in spec.spaces.items()}
    solved = dict.fromkeys(pt.probe.space for pt in points)
    for space in solved:
        score = sum(KINDS[pt.kind].score(s) for pt in points if pt.probe.space == space
                    for s in pt.sums)
        if space_kind(spec, space) == "stream":
            score = settle_unvisited(a, b, space, score)
        elements[space] = solve(groups[space], score, dtype=a.dtype)
    transform = Transform(elements)
    heads = [s for s in solved if space_kind(spec, s) == "heads"]
    if heads:
        opts = WeightMatchingOptions(residual=residual, fix_ones=fix)
        transform = realign_inner(a, b, transform, units=heads, opts=opts)
    return transform
