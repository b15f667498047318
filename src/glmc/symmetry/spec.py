"""The symmetry spec: plain data naming, for every parameter, the space of each axis.

An axis is tagged with a tuple of ``(space, variance)`` pairs, applied in order (an attention
row axis carries the head's inner map first, then the permutation of heads). ``None`` marks an
axis that no symmetry touches (vocabulary rows, image channels, classes).

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


@dataclass
class SymmetrySpec:
    """Spaces (name -> group) and, per parameter, one tag per axis."""

    spaces: dict[str, Group]
    axes: dict[str, tuple[AxisTag, ...]]
    #: Kind of every space, e.g. "residual", "mlp", "heads", "qk", "ov"; matchers choose their
    #: method by the group and this role, never by the architecture.
    roles: dict[str, str] = field(default_factory=dict)
    #: Tensors that move with their spaces but are statistics, not weights (a BatchNorm's
    #: running mean and variance): every transform carries them, matchers do not weigh them.
    buffers: frozenset[str] = frozenset()

    def weights_only(self) -> SymmetrySpec:
        """The spec without its buffers (what the matchers' objectives read)."""
        if not self.buffers:
            return self
        axes = {k: v for k, v in self.axes.items() if k not in self.buffers}
        return SymmetrySpec(dict(self.spaces), axes, dict(self.roles))

    def occurrences(self, space: str) -> Iterator[tuple[str, int, Variance]]:
        """Every (parameter, axis, variance) that ``space`` acts on."""
        for name, tags in self.axes.items():
            for axis, tag in enumerate(tags):
                for s, var in tag or ():
                    if s == space:
                        yield name, axis, var

    def spaces_of(self, name: str) -> set[str]:
        return {s for tag in self.axes[name] for s, _ in (tag or ())}

    def validate(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Check that every tagged axis has the size of its space (raises ValueError)."""
        for name, tags in self.axes.items():
            if name not in shapes:
                raise ValueError(f"spec names parameter {name!r} that the model lacks")
            shape = shapes[name]
            if len(tags) != len(shape):
                raise ValueError(f"{name}: spec has {len(tags)} axes, tensor shape {shape}")
            for axis, tag in enumerate(tags):
                for s, _ in tag or ():
                    if self.spaces[s].size != shape[axis]:
                        raise ValueError(
                            f"{name} axis {axis} has size {shape[axis]}, space {s!r} has "
                            f"size {self.spaces[s].size}"
                        )

    def to_json(self) -> dict:
        return {
            "spaces": {k: g.to_json() for k, g in self.spaces.items()},
            "roles": dict(self.roles),
            "buffers": sorted(self.buffers),
            "axes": {
                k: [None if t is None else [list(p) for p in t] for t in tags]
                for k, tags in self.axes.items()
            },
        }
