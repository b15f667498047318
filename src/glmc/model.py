"""CanonicalModel: a family's canonical config plus its state dict, the value matchers work on.

The config's class names its family (``glmc.families``), which builds the module and gives
the symmetry spec; its ``task`` (``glmc.tasks``) says what the model reads and predicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from torch import nn

from glmc.errors import GlmcError
from glmc.families.registry import family_of
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform, filled
from glmc.tensors import StateDict


@dataclass
class CanonicalModel:
    """A canonical config, its state dict, and the files that travel with the model.

    ``state`` holds every tensor of the module's state dict: parameters and the buffers that
    describe the function (a BatchNorm's running statistics). ``files`` (name -> text:
    ``glmc_tokenizer.json``, ``generation_config.json``) are read beside the weights, kept by
    every rewrite and written into every output folder.

    ``free`` (name -> boolean mask of the tensor's shape): entries the function does not read,
    whatever they hold (a narrower model embedded into wider shapes: the inputs of its padded
    units and heads, its readers' columns on the padded stream). Aligned to another model, they
    take that model's values (:meth:`transformed`'s ``like``). Kept by the rewrites that keep
    the coordinates (:meth:`to`, :meth:`with_files`), dropped by the others.
    """

    config: Any
    state: StateDict
    files: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    free: dict[str, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @property
    def family(self) -> Any:
        """Its :class:`~glmc.families.base.Family` (which builds the module, gives the spec)."""
        return family_of(self.config)

    @property
    def task(self):  # -> glmc.tasks.Task
        from glmc.tasks import task_of

        return task_of(self.config)

    @cached_property
    def spec(self) -> SymmetrySpec:
        spec = self.family.spec(self.config)
        spec.validate({k: tuple(v.shape) for k, v in self.state.items()})
        return spec

    def module(self, dtype: torch.dtype | None = None) -> nn.Module:
        state = self.state if dtype is None else {k: v.to(dtype) for k, v in self.state.items()}
        return self.family.build(self.config, state)

    def with_state(self, state: StateDict) -> CanonicalModel:
        return CanonicalModel(self.config, state, self.files)

    def with_files(self, files: dict[str, str]) -> CanonicalModel:
        """The same model carrying ``files`` as well (they win over its own of that name)."""
        return CanonicalModel(self.config, self.state, {**self.files, **files}, self.free)

    def transformed(self, transform: Transform,
                    like: CanonicalModel | None = None) -> CanonicalModel:
        """The model moved by ``transform`` (the same function). ``like``: the model it is
        aligned to, whose values the free entries take (see the class docstring), so that
        they add nothing to the distance between the two."""
        state = self.state
        if like is not None and self.free:
            state = filled(self.spec, state, self.free, like.state, transform.elements)
        return self.with_state(transform.apply(self.spec, state))

    def to(self, dtype: torch.dtype) -> CanonicalModel:
        return CanonicalModel(self.config, {k: v.to(dtype) for k, v in self.state.items()},
                              self.files, self.free)

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.state.values())).dtype

    def uncentred_writer(self, tol: float | None = None) -> tuple[str, float] | None:
        """The first residual writer that is not mean-zero, with its relative mean, or None
        (None also for a family without a residual stream to centre). ``tol`` (relative to
        the writer's largest entry): default 1e-5, plus a half-precision state's rounding
        (a centred writer rounded to it, as a pair handed over to weight matching is loaded,
        is centred up to its rounding: ``load_model``'s ``half``)."""
        if tol is None:
            dtype = self.dtype if self.state else torch.float32
            half = dtype in (torch.bfloat16, torch.float16)
            tol = 1e-5 + torch.finfo(dtype).eps if half else 1e-5
        return self.family.uncentred_writer(self, tol)

    @property
    def partial(self) -> bool:
        """Whether some tensors are placeholders on the meta device, not read (one process's
        share of a pair: ``load_model``'s ``only``)."""
        return any(t.is_meta for t in self.state.values())

    def n_params(self) -> int:
        return sum(v.numel() for v in self.state.values())


def check_architectures(a: CanonicalModel, b: CanonicalModel, where: str = "",
                        known: bool = False) -> None:
    """A GlmcError naming both when the models were read from different stock architectures
    (``A is llama, B is gpt2``): checked before their shapes or fields are compared.
    ``known``: only when both say theirs (a glmc folder says none)."""
    arch_a, arch_b = (m.config.source.get("arch") if isinstance(
        getattr(m.config, "source", None), dict) else None for m in (a, b))
    if arch_a != arch_b and not (known and None in (arch_a, arch_b)):
        raise GlmcError(f"{where + ': ' if where else ''}the models are of different "
                        f"architectures: A is {arch_a}, B is {arch_b}")


def fitted(a: CanonicalModel, b: CanonicalModel, where: str = "") -> CanonicalModel:
    """B as a model of A's shapes: B itself when they agree, else B embedded exactly into
    A's widths by its family (a narrower B; see ``Family.embed_into``), or a GlmcError."""
    if type(a.config) is not type(b.config) or a.config == b.config:
        return b
    if getattr(a.config, "source", None) is not None and (
            a.config.replace(source={}) == b.config.replace(source={})):
        return b  # (the same model shapes, from stock configs that differ in their names)
    check_architectures(a, b, where, known=True)  # (a Llama is no wider GPT-2)
    return b.family.embed_into(b, a.config, where)


def check_pair(a: CanonicalModel, b: CanonicalModel, where: str = "") -> None:
    """Same parameters with the same shapes, all finite; else one GlmcError, in the models'
    own terms where their configs differ (``n_layer 2 in A, 3 in B``) and else naming the
    tensor. ``where``: how to name the pair (e.g. "runs/a vs runs/b")."""
    at = f"{where}: " if where else ""
    mismatch = (set(a.state) != set(b.state)
                or any(ta.shape != b.state[n].shape for n, ta in a.state.items()))
    if mismatch:
        check_architectures(a, b, where)
        diff = a.config.differences(b.config) if type(a.config) is type(b.config) else []
        if diff:
            more = f" and {len(diff) - 3} more" if len(diff) > 3 else ""
            raise GlmcError(f"{at}the models differ in {', '.join(diff[:3])}{more} (aligning "
                            "models of different shapes is not supported)")
    for name, ta in a.state.items():
        if name not in b.state:
            raise GlmcError(f"{at}model B lacks tensor {name} (shape {list(ta.shape)} in A)")
        if ta.shape != b.state[name].shape:
            raise GlmcError(f"{at}tensor {name}: shape {list(ta.shape)} in A, "
                            f"{list(b.state[name].shape)} in B (different sizes are not "
                            "supported yet)")
    extra = sorted(set(b.state) - set(a.state))
    if extra:
        raise GlmcError(f"{at}model B has tensor {extra[0]} that A lacks")
    for who, m in (("A", a), ("B", b)):
        for name, t in m.state.items():
            if t.is_meta:  # (not read here: another process's share, see load_model's only)
                continue
            # (a finite sum means finite entries; only a sum that is not, rarely an
            # overflow, needs the elementwise check: one pass instead of a boolean copy)
            if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
                raise GlmcError(f"{at}model {who}: tensor {name} contains NaN or Inf")
