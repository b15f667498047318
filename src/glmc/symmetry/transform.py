"""Transform: one group element per space, applied to a state dict through the spec."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from glmc.errors import GlmcError, reason
from glmc.io.atomic import atomic_path
from glmc.symmetry.groups import BlockMatrix, Element, element_from_tensors, element_meta
from glmc.symmetry.spec import SymmetrySpec
from glmc.tensors import StateDict


def apply_axes(
    x: torch.Tensor,
    tags: tuple,
    elements: Mapping[str, Element],
    skip: set[tuple[int, str]] | frozenset[tuple[int, str]] = frozenset(),
) -> torch.Tensor:
    """Apply the elements named by ``tags`` to the axes of ``x``.

    skip: (axis, space) pairs to leave alone (matchers use it to keep one occurrence free).
    """
    for axis, tag in enumerate(tags):
        for space, variance in tag or ():
            if (axis, space) in skip or space not in elements:
                continue
            x = elements[space].apply(x, axis, variance)
    return x


def unapply_axes(x: torch.Tensor, tags: tuple, elements: dict[str, Element]) -> torch.Tensor:
    """Undo ``apply_axes(x, tags, elements)`` (inverses, in reverse order)."""
    for axis, tag in enumerate(tags):
        for space, variance in reversed(tag or ()):
            if space in elements:
                x = elements[space].inverse().apply(x, axis, variance)
    return x


def nested_pairs(spec: SymmetrySpec) -> set[tuple[str, str]]:
    """(inner, outer) spaces that share an axis, inner applied first."""
    pairs = set()
    for tags in spec.axes.values():
        for tag in tags:
            if tag and len(tag) == 2:
                pairs.add((tag[0][0], tag[1][0]))
    return pairs


def _permute_blocks(e: Element, perm: torch.Tensor) -> Element:
    """blockdiag(X) -> blockdiag(X[perm]) (the conjugate P·X·P⁻¹)."""
    if not isinstance(e, BlockMatrix):
        raise TypeError(f"expected a block matrix for a nested space, got {e.kind}")
    return BlockMatrix(e.blocks[perm], e.orthogonal)


@dataclass
class Transform:
    """A group element for every space of a spec (spaces it omits are the identity).

    ``source``: the file it was loaded from, for messages.
    """

    elements: dict[str, Element]
    source: str | None = field(default=None, compare=False, repr=False)

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def identity(cls, spec: SymmetrySpec) -> Transform:
        return cls({name: g.identity() for name, g in spec.spaces.items()})

    @classmethod
    def random(
        cls,
        spec: SymmetrySpec,
        generator: torch.Generator,
        dtype: torch.dtype = torch.float64,
        subgroups: Mapping[str, str] | None = None,
    ) -> Transform:
        """A random element of every space; ``subgroups`` maps a role or space name to a
        subgroup (see ``Group.random``)."""
        subgroups = subgroups or {}
        elements = {}
        for name, group in spec.spaces.items():
            sub = subgroups.get(name, subgroups.get(spec.roles.get(name, ""), None))
            elements[name] = group.random(generator, dtype, subgroup=sub)
        return cls(elements)

    # -- algebra --------------------------------------------------------------------------
    # Where two spaces share an axis (a head's inner map, then the permutation of heads) the
    # group is a semidirect product: T = P·blockdiag(M). Inverse and composition conjugate
    # the inner blocks by the permutation: P·blockdiag(X)·P⁻¹ = blockdiag(X[perm]).

    def inverse(self, spec: SymmetrySpec) -> Transform:
        out = {k: e.inverse() for k, e in self.elements.items()}
        for inner, outer in nested_pairs(spec):
            if inner in out and outer in self.elements:
                perm = self.elements[outer].perm  # type: ignore[attr-defined]
                out[inner] = _permute_blocks(out[inner], perm)
        return Transform(out)

    def compose(self, other: Transform, spec: SymmetrySpec) -> Transform:
        """``self ∘ other``: apply ``other`` first."""
        first = dict(self.elements)
        for inner, outer in nested_pairs(spec):
            if inner in first and outer in other.elements:
                perm = other.elements[outer].perm  # type: ignore[attr-defined]
                first[inner] = _permute_blocks(first[inner], torch.argsort(perm))
        out = {}
        for k in set(first) | set(other.elements):
            a, b = first.get(k), other.elements.get(k)
            out[k] = a.compose(b) if a is not None and b is not None else (a or b)
        return Transform(out)

    # -- action ---------------------------------------------------------------------------
    def apply(self, spec: SymmetrySpec, state: Mapping[str, torch.Tensor]) -> StateDict:
        """The transformed state dict (parameters the spec does not name are copied)."""
        for name, e in self.elements.items():
            group = spec.spaces.get(name)
            if group is not None and e.size != group.size:
                raise GlmcError(f"{self.source or 'transform'}: space {name} has size {e.size}, "
                                f"the model's {group.size} (a transform of another model)")
        result = {}
        for name, x in state.items():
            tags = spec.axes.get(name)
            result[name] = apply_axes(x, tags, self.elements) if tags else x.clone()
        return result

    # -- persistence ----------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write ``path`` (safetensors; the element kinds sit in its JSON metadata)."""
        tensors, meta = {}, {}
        for name, e in self.elements.items():
            meta[name] = element_meta(e)
            for key, t in e.tensors().items():
                tensors[f"{name}/{key}"] = t.contiguous()
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata={"glmc_transform": json.dumps(meta)})

    @classmethod
    def load(cls, path: str | Path) -> Transform:
        path = Path(path)
        if not path.is_file():
            raise GlmcError(f"{path}: no such transform file")
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                raw = (f.metadata() or {}).get("glmc_transform")
            if raw is None:
                raise GlmcError(f"{path}: not a glmc transform (no 'glmc_transform' metadata)")
            meta = json.loads(raw)
            tensors = load_file(str(path))
            elements = {}
            for name, m in meta.items():
                # (cloned: a fresh, aligned allocation computes bit for bit like the saved
                # element; BLAS may round differently on a buffer's unaligned views)
                own = {k.split("/", 1)[1]: t.clone() for k, t in tensors.items()
                       if k.split("/", 1)[0] == name}
                elements[name] = element_from_tensors(m["kind"], own, m)
        except GlmcError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged or foreign file is the user's input
            raise GlmcError(f"{path}: cannot read transform ({reason(e)})") from None
        return cls(elements, str(path))
