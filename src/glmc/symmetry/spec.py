"""The symmetry spec: plain data naming, for every parameter, the spaces acting on each axis.

An axis is tagged with a tuple of ``(space, variance)`` pairs, applied in order, inner first
(a query row axis carries the head's inner map, then the query heads' order inside their
key/value group, then the order of the groups). ``None`` marks an axis that no symmetry
touches (vocabulary rows, image channels, classes). A space's element acts on any axis its
size divides (see :mod:`glmc.symmetry.elements`): a key/value head's inner map names the
key rows (n_kv·d_head) and the query rows (n_head·d_head) alike, and acts on each query head
of its group.

Example (an MLP hidden layer between two residual-stream spaces)::

    spaces = {"res": OrthogonalGroup(256), "mlp.0": PermutationGroup(1024)}
    axes = {
        "blocks.0.mlp.fc.weight":   (out("mlp.0"), inp("res")),    # (1024, 256)
        "blocks.0.mlp.fc.bias":     (out("mlp.0"),),               # (1024,)
        "blocks.0.mlp.proj.weight": (out("res"), inp("mlp.0")),    # (256, 1024)
    }
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from glmc.symmetry.groups import Group, Variance

AxisTag = tuple[tuple[str, Variance], ...] | None


def out(*spaces: str) -> tuple[tuple[str, Variance], ...]:
    """An output-side (contravariant) axis carrying ``spaces``, applied in the given order."""
    return tuple((s, "out") for s in spaces)


def inp(*spaces: str) -> tuple[tuple[str, Variance], ...]:
    """An input-side (covariant) axis carrying ``spaces``, applied in the given order."""
    return tuple((s, "in") for s in spaces)


@dataclass(frozen=True)
class Chain:
    """The spaces on one axis, inner first, and the axis's size (for conjugations)."""

    spaces: tuple[str, ...]
    size: int


@dataclass
class SymmetrySpec:
    """Spaces (name -> group) and, per parameter, one tag per axis."""

    spaces: dict[str, Group]
    axes: dict[str, tuple[AxisTag, ...]]
    #: A label for every space ("residual", "mlp", "heads", "qk", "ov", ...), for reports and
    #: plots; matchers choose their step by the group's type, never by this.
    roles: dict[str, str] = field(default_factory=dict)
    #: Tensors that move with their spaces but are statistics, not weights (a BatchNorm's
    #: running mean and variance): every transform carries them, matchers do not weigh them.
    buffers: frozenset[str] = frozenset()
    #: What writing the model back as its stock class requires of a space's element: the name
    #: of a subgroup (``{"res": "fix_ones"}`` for a LayerNorm model), stated by the family.
    export: dict[str, str] = field(default_factory=dict)
    #: The parameters' shapes, recorded by :meth:`validate` (chains need the axis sizes).
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, repr=False)
    #: The spaces on the model's output's last axis, when its output is a vector of a space
    #: (a bare encoder's last hidden state is the stream): an aligned model then computes the
    #: original's output moved by the transform (None: the output is the same, e.g. logits).
    output: AxisTag = None

    def weights_only(self) -> SymmetrySpec:
        """The spec without its buffers (what the matchers' objectives read)."""
        if not self.buffers:
            return self
        axes = {k: v for k, v in self.axes.items() if k not in self.buffers}
        return SymmetrySpec(dict(self.spaces), axes, dict(self.roles), frozenset(),
                            dict(self.export), dict(self.shapes), self.output)

    def with_groups(self, groups: Mapping[str, Group]) -> SymmetrySpec:
        """The same axes with some spaces' groups replaced (e.g. by a subgroup)."""
        return SymmetrySpec({**self.spaces, **groups}, self.axes, dict(self.roles),
                            self.buffers, dict(self.export), dict(self.shapes), self.output)

    def occurrences(self, space: str) -> Iterator[tuple[str, int, Variance]]:
        """Every (parameter, axis, variance) that ``space`` acts on."""
        for name, tags in self.axes.items():
            for axis, tag in enumerate(tags):
                for s, var in tag or ():
                    if s == space:
                        yield name, axis, var

    def spaces_of(self, name: str) -> set[str]:
        return {s for tag in self.axes[name] for s, _ in (tag or ())}

    def chains(self) -> Iterator[Chain]:
        """Every axis carrying more than one space (the nested ones), with its size."""
        for name, tags in self.axes.items():
            for axis, tag in enumerate(tags):
                if tag and len(tag) > 1:
                    size = self.shapes[name][axis] if name in self.shapes else 0
                    yield Chain(tuple(s for s, _ in tag), size)

    def nested_in(self, space: str) -> list[str]:
        """The spaces applied before ``space`` on an axis they share (the inner maps and
        orders a head permutation carries), in a fixed order."""
        inner: set[str] = set()
        for chain in self.chains():
            if space in chain.spaces:
                inner.update(chain.spaces[:chain.spaces.index(space)])
        return sorted(inner)

    def outer_chain(self, space: str) -> Chain | None:
        """The axis on which the most spaces act after ``space`` (None: no space does), whose
        outer elements conjugate ``space``'s in inverses and compositions."""
        best = None
        for chain in self.chains():
            if space in chain.spaces and chain.spaces[-1] != space:
                after = len(chain.spaces) - chain.spaces.index(space)
                if best is None or after > len(best.spaces) - best.spaces.index(space):
                    best = chain
        return best

    def validate(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Check that every tagged axis fits its spaces (raises ValueError); records the
        shapes."""
        for name, tags in self.axes.items():
            if name not in shapes:
                raise ValueError(f"spec names parameter {name!r} that the model lacks")
            shape = shapes[name]
            if len(tags) != len(shape):
                raise ValueError(f"{name}: spec has {len(tags)} axes, tensor shape {shape}")
            for axis, tag in enumerate(tags):
                for s, _ in tag or ():
                    if not self.spaces[s].fits(shape[axis]):
                        raise ValueError(
                            f"{name} axis {axis} has size {shape[axis]}, which space {s!r} "
                            f"(size {self.spaces[s].size}) does not act on")
        self.shapes = {k: tuple(v) for k, v in shapes.items() if k in self.axes}

    def to_json(self) -> dict:
        return {
            "spaces": {k: g.to_json() for k, g in self.spaces.items()},
            "roles": dict(self.roles),
            "buffers": sorted(self.buffers),
            "export": dict(self.export),
            "axes": {
                k: [None if t is None else [list(p) for p in t] for t in tags]
                for k, tags in self.axes.items()
            },
        }
