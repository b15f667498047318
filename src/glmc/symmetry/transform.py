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
from glmc.symmetry.elements import Element, element_from_tensors, element_meta
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


def unapply_axes(x: torch.Tensor, tags: tuple,
                 elements: Mapping[str, Element]) -> torch.Tensor:
    """Undo ``apply_axes(x, tags, elements)`` (inverses, in reverse order)."""
    for axis, tag in enumerate(tags):
        for space, variance in reversed(tag or ()):
            if space in elements:
                x = elements[space].inverse().apply(x, axis, variance)
    return x


def filled(spec: SymmetrySpec, state: Mapping[str, torch.Tensor],
           free: Mapping[str, torch.Tensor], like: Mapping[str, torch.Tensor],
           elements: Mapping[str, Element]) -> StateDict:
    """``state`` with the entries ``free`` marks (name -> boolean mask) taken from ``like``
    brought into ``state``'s coordinates (the elements undone), so that once ``elements``
    act they equal ``like``'s own. Differentiable in ``elements`` (learned matching fills
    at every step); the other tensors are ``state``'s, not copied."""
    out = dict(state)
    for name, mask in free.items():
        tags = spec.axes.get(name)
        there = unapply_axes(like[name], tags, elements) if tags else like[name]
        out[name] = torch.where(mask, there.to(state[name].dtype), state[name])
    return out


def _outers(spec: SymmetrySpec, space: str) -> list[tuple[str, int]]:
    """The spaces applied after ``space`` on its most nested axis, inner first, with that
    axis's size (empty when no space acts after it)."""
    chain = spec.outer_chain(space)
    if chain is None:
        return []
    after = chain.spaces[chain.spaces.index(space) + 1:]
    return [(s, chain.size) for s in after]


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
        """A random element of every space; ``subgroups`` maps a space's name or label
        (``spec.roles``) to the name of the subgroup to draw from (``Group.subgroup``)."""
        subgroups = subgroups or {}
        elements = {}
        for name, group in spec.spaces.items():
            sub = subgroups.get(name, subgroups.get(spec.roles.get(name, ""), None))
            elements[name] = (group if sub is None else group.subgroup(sub)).random(
                generator, dtype)
        return cls(elements)

    def to(self, device: torch.device | str) -> Transform:
        """Every element on ``device`` (its permutations stay on the host, see
        :class:`~glmc.symmetry.elements.Permutation`), in its own dtype."""
        return Transform({k: e.to(device=device) for k, e in self.elements.items()},
                         self.source)

    # -- algebra --------------------------------------------------------------------------
    # Where spaces share an axis (a head's inner map, then the order of heads) the group is a
    # semidirect product: on an axis carrying E_1 ... E_k (inner first) the map is
    # T = E_k···E_1, and each outer E_j (a permutation of chunks) carries the inner blocks
    # with it, E_j·X·E_j⁻¹ = X reindexed (``Element.conjugated``). Hence, per space j:
    #   (T⁻¹)_j   = conj(E_k···E_{j+1}) (E_j⁻¹)
    #   (S ∘ O)_j = conj((O_k···O_{j+1})⁻¹) (S_j) · O_j

    def inverse(self, spec: SymmetrySpec) -> Transform:
        out = {}
        for space, e in self.elements.items():
            x = e.inverse()
            for outer, size in _outers(spec, space):
                if outer in self.elements:
                    x = x.conjugated(self.elements[outer], size)  # type: ignore[arg-type]
            out[space] = x
        return Transform(out)

    def compose(self, other: Transform, spec: SymmetrySpec) -> Transform:
        """``self ∘ other``: apply ``other`` first."""
        out = {}
        for space in set(self.elements) | set(other.elements):
            a, b = self.elements.get(space), other.elements.get(space)
            if a is not None:
                for outer, size in reversed(_outers(spec, space)):
                    if outer in other.elements:
                        o = other.elements[outer].inverse()
                        a = a.conjugated(o, size)  # type: ignore[arg-type]
            out[space] = a.compose(b) if a is not None and b is not None else (a or b)
        return Transform(out)

    # -- action ---------------------------------------------------------------------------
    def apply(self, spec: SymmetrySpec, state: Mapping[str, torch.Tensor],
              consume: bool = False) -> StateDict:
        """The transformed state dict (parameters the spec does not name are copied).

        ``consume``: ``state`` (a dict) is handed over: each tensor is replaced in it by its
        transformed one as it goes (one tensor more at a time, not a second model), the
        others kept as they are; returns ``state``."""
        for name, e in self.elements.items():
            group = spec.spaces.get(name)
            if group is not None and e.size != group.size:
                raise GlmcError(f"{self.source or 'transform'}: space {name} has size {e.size}, "
                                f"the model's {group.size} (a transform of another model)")
        result = state if consume else {}
        for name in list(state):
            x, tags = state[name], spec.axes.get(name)
            result[name] = (apply_axes(x, tags, self.elements) if tags
                            else x if consume else x.clone())
            del x
        return result  # type: ignore[return-value]

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
