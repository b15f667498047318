"""Activation matching (Git Re-Basin's): units paired by how their activations correlate.

For every permutation space, both models run the same training batches; at the family's
probes (``Family.probes``) each unit's outputs, over every example and position, give the
correlation matrix corr[i, j] between A's unit i and B's unit j (summed over the probes of a
space tied across layers, such as a residual stage), both after the nonlinearity that follows
the probe (as Git Re-Basin correlates activations) and before it. The permutation maximising
the total correlation is a linear assignment. Spaces are independent given the data, so one
pass over the batches serves them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from glmc.correction import units_first
from glmc.errors import GlmcError
from glmc.matching.solvers import assignment
from glmc.model import CanonicalModel
from glmc.symmetry.groups import Permutation
from glmc.symmetry.transform import Transform

Batch = tuple[torch.Tensor, torch.Tensor]
#: The nonlinearities a probe may name (``Probe.activation``).
ACTIVATIONS = {None: lambda y: y, "relu": torch.relu}


class _Cross:
    """Running sums for the correlation of two sets of units (A's n, B's n)."""

    def __init__(self) -> None:
        self.sa = self.sb = self.saa = self.sbb = self.sab = None
        self.n = 0

    def add(self, ya: torch.Tensor, yb: torch.Tensor) -> None:
        """ya, yb (N, n, ...): the units on axis 1."""
        fa, fb = units_first(ya), units_first(yb)
        parts = (fa.sum(1), fb.sum(1), fa.pow(2).sum(1), fb.pow(2).sum(1), fa @ fb.T)
        if self.sa is None:
            self.sa, self.sb, self.saa, self.sbb, self.sab = parts
        else:
            for name, p in zip(("sa", "sb", "saa", "sbb", "sab"), parts, strict=True):
                getattr(self, name).add_(p)
        self.n += fa.shape[1]

    def correlation(self) -> torch.Tensor:
        """(n, n) Pearson correlations, rows A's units, columns B's."""
        n = self.n
        ma, mb = self.sa / n, self.sb / n
        cov = self.sab / n - ma[:, None] * mb[None, :]
        sa = (self.saa / n - ma**2).clamp_min(0).sqrt().clamp_min(1e-12)
        sb = (self.sbb / n - mb**2).clamp_min(0).sqrt().clamp_min(1e-12)
        return cov / (sa[:, None] * sb[None, :])


@torch.no_grad()
def activation_matching(a: CanonicalModel, b: CanonicalModel,
                        batches: Sequence[Batch]) -> Transform:
    """The transform π of B's permutation spaces that best correlates its units with A's.

    Raises:
        GlmcError: a family without probes, or a space no probe observes.
    """
    spec = a.spec
    probes = a.family.probes(a.config)
    spaces = {s for s, g in spec.spaces.items() if g.kind == "permutation"}
    unseen = sorted(spaces - {p.space for p in probes})
    if not probes or unseen or any(g.kind != "permutation" for g in spec.spaces.values()):
        raise GlmcError(f"activation matching needs every space to be a permutation observed "
                        f"by a probe; the {a.family.name} family "
                        + (f"does not observe {unseen[0]}" if unseen else
                           "has other symmetries (use weight or learned matching)"))
    outputs: dict[str, dict[str, torch.Tensor]] = {"a": {}, "b": {}}
    modules = {"a": a.module(), "b": b.module()}
    handles = []
    for side, module in modules.items():
        for p in probes:
            sub = module.get_submodule(p.module)
            handles.append(sub.register_forward_hook(
                lambda m, args, y, side=side, name=p.module: outputs[side].__setitem__(name, y)))
    cross: dict[str, list[_Cross]] = defaultdict(list)
    # Each probe's units are correlated after the nonlinearity that follows it (what the next
    # layer reads) and before it (which tells apart units the nonlinearity silences on these
    # batches, a dead ReLU's zeros): the two correlations are summed.
    per_probe = {p.module: (_Cross(), _Cross()) for p in probes}
    for p in probes:
        cross[p.space] += per_probe[p.module] if p.activation else per_probe[p.module][:1]
    try:
        for x, _ in batches:
            x = x.to(a.dtype) if x.is_floating_point() else x
            modules["a"](x)
            modules["b"](x)
            for p in probes:
                ya, yb = outputs["a"][p.module], outputs["b"][p.module]
                per_probe[p.module][0].add(ya, yb)
                if p.activation:
                    f = ACTIVATIONS[p.activation]
                    per_probe[p.module][1].add(f(ya), f(yb))
    finally:
        for h in handles:
            h.remove()
    elements = {}
    for space, parts in cross.items():
        corr = sum(c.correlation() for c in parts)
        elements[space] = Permutation(assignment(corr))
    return Transform(elements)
