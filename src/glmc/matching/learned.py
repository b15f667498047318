"""Learned matching: train the alignment against the task loss on the path.

Both models are frozen; only one latent per space trains (see ``parametrize``): the residual
map, every permutation (straight-through) and the heads' inner maps. Each step samples λ,
builds θ(λ) = λ·θ_A + (1 − λ)·π(θ_B) functionally (torch.func.functional_call on one module,
no surgery) and minimises the task loss on training data. AdamW with linear warm-up and
a learning rate cut at each validation plateau (or cosine decay), gradient clipping; the run
stops on a plateau of the validation loss at fixed λs, or at a cap on steps or time, and
says which (``LearnedResult.stop_reason``).

The start (weight matching's solution, activation matching's, or the one of the two with the
lower validation loss) is evaluated first and is the best so far, so the result is never worse
than it on validation; what is returned is exactly what was evaluated
(a head reassigned during training gets its inner maps aligned afresh at once, and they go on
training from there). Runs data-parallel under torchrun: each rank takes a shard of the
global batch and the latents' gradients are averaged with an all-reduce.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

from glmc import distributed
from glmc.devices import matching_device
from glmc.errors import GlmcError, reason
from glmc.matching.inner import inner_maps
from glmc.matching.options import (
    LearnedMatchingOptions,
    WeightMatchingOptions,
    default_inner,
    parse_lambda,
)
from glmc.matching.parametrize import PermutationLatent, make_latent, project_all
from glmc.matching.problem import Problem, effective_groups, head_tensors, stream_space
from glmc.model import CanonicalModel
from glmc.schedule import lr_factor
from glmc.symmetry.groups import BlockMatrix, Element, Matrix, Permutation
from glmc.symmetry.transform import Transform, apply_axes, filled
from glmc.tensors import StateDict
from glmc.threads import deterministic


@dataclass
class LearnedResult:
    transform: Transform
    log: list[dict] = field(default_factory=list)
    start_val: float = math.nan  # validation loss of the start, at the eval points
    best_val: float = math.inf
    best_step: int = 0  # 0: the start was never beaten
    steps: int = 0
    seconds: float = 0.0
    distance: dict = field(default_factory=dict)  # from the start (weight matching)
    #: Validation loss at the eval points of the endpoints' losses interpolated linearly:
    #: the barrier estimate (at the midpoint, for a pair) is best_val minus this.
    baseline_val: float = math.nan
    #: The λ distribution the steps drew from (a pair's; N models': on their edges).
    lam: str = ""
    #: Each candidate start's validation loss at the eval points, by name, when there
    #: were several (the lowest is where the latents started)
    starts: dict[str, float] = field(default_factory=dict)
    #: Why the steps ended: "plateau" (no new best validation in the last ``patience``
    #: validations, the learning rate cut as often as allowed), "max_steps" or "time_budget"
    stop_reason: str = ""

    def to_json(self) -> dict:
        return {"start_val": self.start_val, "best_val": self.best_val,
                "best_step": self.best_step, "steps": self.steps,
                "barrier_estimate": self.best_val - self.baseline_val,
                "start_barrier_estimate": self.start_val - self.baseline_val,
                "seconds": round(self.seconds, 3), "lam": self.lam,
                "stop_reason": self.stop_reason, "starts": self.starts,
                "distance_from_init": self.distance,
                "log": self.log}


# -- the latents ----------------------------------------------------------------------------


def _key(space: str) -> str:
    return space.replace(".", "_")  # (ModuleDict keys cannot hold dots)


class Latents(torch.nn.Module):
    """One latent per space (or a fixed element where nothing trains), and the hard
    elements they give. Head assignments that change are followed by fresh inner maps. The
    latents live on ``device`` (the permutations' hard assignments on the host)."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, init: Transform, residual: str,
                 inner: str, fix_ones: bool, device: torch.device | None = None) -> None:
        super().__init__()
        spec = a.spec
        self.spec = spec
        self.fixed: dict[str, Element] = {}
        lat: dict[str, torch.nn.Module] = {}
        # The groups weight matching solved in ("none": the stream is kept as it starts).
        groups = effective_groups(spec, "orthogonal" if residual == "none" else residual,
                                  inner, fix_ones)
        stream = stream_space(spec)
        for s, g in groups.items():
            e = init.elements.get(s, g.identity())
            keep = s == stream and residual == "none"
            m = None if keep else make_latent(g, e, space=s)
            if m is None:
                self.fixed[s] = e
            else:
                lat[s] = m
        self.latents = torch.nn.ModuleDict({_key(s): m for s, m in lat.items()})
        self.space_of = {_key(s): s for s in lat}
        # Heads whose inner maps were aligned for their current assignment.
        # (only the heads' tensors: reassigned heads get their inner maps from them)
        self.problem = Problem(a, b, WeightMatchingOptions(inner=inner, device=device or "cpu"),
                               only=head_tensors(spec))
        self.aligned_for = {u: init.elements[u].perm.clone() for u in self.problem.head_units
                            if u in init.elements}
        if not any(True for _ in self.parameters()):
            raise GlmcError("nothing to learn: the spec has no permutation or residual space")
        self.to(device)

    def __getitem__(self, space: str) -> torch.nn.Module:
        return self.latents[_key(space)]

    def elements(self) -> dict[str, Element]:
        """Differentiable elements (for the path)."""
        els = dict(self.fixed)
        for key, lat in self.latents.items():
            els[self.space_of[key]] = lat()
        return els

    def hard(self) -> dict[str, Element]:
        """The group elements as they stand (no gradient)."""
        els = dict(self.fixed)
        for key, lat in self.latents.items():
            els[self.space_of[key]] = lat.element()
        return els

    def project(self, pool: ThreadPoolExecutor | None) -> list[torch.nn.Parameter]:
        """Hard assignments of every permutation; heads reassigned get their inner maps
        aligned afresh. Returns the parameters reset (their optimiser state is stale)."""
        project_all(self.latents, pool)
        reset = []
        for unit, was in self.aligned_for.items():
            now = self[unit].perm
            if torch.equal(now, was):
                continue
            fresh = inner_maps(self.problem, unit, self.hard())
            for s in self.problem.inner_of[unit]:
                if s in self.fixed:
                    self.fixed[s] = fresh[s]
                    continue
                self[s].reset(fresh[s])
                reset.extend(p for p in self[s].parameters() if p.requires_grad)
            self.aligned_for[unit] = now.clone()
        return reset

    def transform(self) -> Transform:
        """The hard elements, on the host."""
        return Transform(self.hard()).to("cpu")

    def snapshot(self) -> dict:
        """Everything the latents are, to restore exactly (the best so far, checkpoints)."""
        return {"state": {k: v.detach().clone() for k, v in self.state_dict().items()},
                "aligned_for": {k: v.clone() for k, v in self.aligned_for.items()}}

    def restore(self, snap: dict, where: str = "") -> None:
        mine = self.state_dict()
        theirs = snap["state"]
        for k, v in mine.items():
            if k not in theirs or tuple(theirs[k].shape) != tuple(v.shape):
                got = list(theirs[k].shape) if k in theirs else "nothing"
                raise GlmcError(f"{where}: latent {k} has shape {got}, these models need "
                                f"{list(v.shape)} (a checkpoint of other models?)")
        self.load_state_dict(theirs)
        self.aligned_for = {k: v.clone() for k, v in snap["aligned_for"].items()}


class LatentSet(torch.nn.Module):
    """The latents of N − 1 models against the first (the frame), trained together; with
    ``first``, the first model's own latents too (a free frame)."""

    def __init__(self, members: Sequence[Latents], first: Latents | None = None) -> None:
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        self.first = first

    def _all(self) -> list[Latents]:
        return [*([self.first] if self.first is not None else []), *self.members]

    def project(self, pool: ThreadPoolExecutor | None) -> list[torch.nn.Parameter]:
        return [p for m in self._all() for p in m.project(pool)]

    def transforms(self) -> list[Transform]:
        """Models 2..N's maps into the first model's coordinates (a free frame's moved back
        by the first's inverse: T₁⁻¹ ∘ T_i)."""
        if self.first is None:
            return [m.transform() for m in self.members]
        spec = self.first.spec
        back = self.first.transform().inverse(spec)
        return [back.compose(m.transform(), spec) for m in self.members]

    def snapshot(self) -> dict:
        snap = {"members": [m.snapshot() for m in self.members]}
        return snap | ({"first": self.first.snapshot()} if self.first is not None else {})

    def restore(self, snap: dict, where: str = "") -> None:
        if len(snap.get("members", ())) != len(self.members):
            raise GlmcError(f"{where}: latents of {len(snap.get('members', ()))} models after "
                            f"the first, these models have {len(self.members)} (a checkpoint "
                            "of other models?)")
        if ("first" in snap) != (self.first is not None):
            raise GlmcError(f"{where}: a checkpoint of a {'free' if 'first' in snap else 'fixed'}"
                            " frame; start without --resume or use the same options")
        for m, s in zip(self.members, snap["members"], strict=True):
            m.restore(s, where)
        if self.first is not None:
            self.first.restore(snap["first"], where)


# -- the path ------------------------------------------------------------------------------


def task_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; logits (..., classes), y (...) class ids."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class PathModel:
    """θ(w) = Σ_i w_i·π_i(θ_i) over N models (π_1 the identity, or from ``first``; π_i from
    ``latents[i − 2]``) evaluated with one module. A pair takes a float λ:
    θ(λ) = λ·θ_A + (1 − λ)·π(θ_B). The models, the module and each batch are on ``device``
    (None: where they are)."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel | Sequence[CanonicalModel],
                 latents: Latents | Sequence[Latents],
                 dtype: torch.dtype = torch.float32, first: Latents | None = None,
                 device: torch.device | None = None) -> None:
        others = [b] if isinstance(b, CanonicalModel) else list(b)
        self.members = [latents] if isinstance(latents, Latents) else list(latents)
        if len(self.members) != len(others):
            raise ValueError(f"{len(others)} models after the first, {len(self.members)} "
                             "latents")
        self.spec, self.device = a.spec, device
        self.states = [{k: v.to(device, dtype) for k, v in m.state.items()}
                       for m in (a, *others)]
        #: (a narrower model's free entries take the first model's values at every step)
        self.free = [{k: f.to(device) for k, f in m.free.items()} for m in others]
        self.first = first
        self.module = a.module(dtype).to(device)
        for p in self.module.parameters():
            p.requires_grad_(False)

    @staticmethod
    def weights(lam: float | Sequence[float]) -> tuple[float, ...]:
        """The models' weights at ``lam`` (a pair's λ: (λ, 1 − λ))."""
        return (lam, 1 - lam) if isinstance(lam, numbers.Real) else tuple(lam)

    def state(self, lam: float | Sequence[float]) -> StateDict:
        w = self.weights(lam)
        els = [m.elements() for m in self.members]
        out = {}
        states = [filled(self.spec, st, free, self.states[0], e) if free else st
                  for st, free, e in zip(self.states[1:], self.free, els, strict=True)]
        e0 = self.first.elements() if self.first is not None else None
        for n, x0 in self.states[0].items():
            tags = self.spec.axes.get(n)
            acc = w[0] * (apply_axes(x0, tags, e0) if e0 is not None and tags else x0)
            for wi, st, e in zip(w[1:], states, els, strict=True):
                acc = acc + wi * (apply_axes(st[n], tags, e) if tags else st[n])
            out[n] = acc
        return out

    def loss(self, lam: float | Sequence[float], x: torch.Tensor,
             y: torch.Tensor) -> torch.Tensor:
        state = self.state(lam)
        x, y = x.to(self.device), y.to(self.device)
        return task_loss(functional_call(self.module, state, (_cast(x, state),)), y)

    @torch.no_grad()
    def losses(self, batches: list, lambdas: Sequence) -> list[float]:
        """Mean loss over ``batches`` at each of ``lambdas`` (floats for a pair, else
        weights)."""
        return [sum(float(self.loss(lam, x, y)) for x, y in batches) / len(batches)
                for lam in lambdas]


def _cast(x: torch.Tensor, state: StateDict) -> torch.Tensor:
    """Images in the models' dtype (token ids stay integers)."""
    return x.to(next(iter(state.values())).dtype) if x.is_floating_point() else x


def distance(init: Transform, learned: Transform) -> dict:
    """How far learned matching moved from its start, per space: the fraction of units (or
    heads) reassigned; for the residual map ‖O − O₀‖_F and its rotation angles; for inner
    maps ‖M − M₀‖_F / ‖M₀‖_F."""
    out = {}
    for s, e in learned.elements.items():
        e0 = init.elements.get(s)
        if isinstance(e, Permutation) and isinstance(e0, Permutation):
            changed = int((e.perm != e0.perm).sum())
            out[s] = {"changed": changed, "of": e.perm.numel(),
                      "fraction": changed / e.perm.numel()}
        elif isinstance(e, Matrix) and e0 is not None:
            m, m0 = e.matrix(torch.float64), e0.matrix(torch.float64)
            angles = torch.linalg.eigvals(m @ m0.T).angle().abs().rad2deg()
            out[s] = {"frobenius": float(torch.linalg.matrix_norm(m - m0)),
                      "max_angle_deg": float(angles.max()),
                      "mean_angle_deg": float(angles.mean())}
        elif isinstance(e, BlockMatrix) and isinstance(e0, BlockMatrix):
            b, b0 = e.blocks.double(), e0.blocks.double()
            out[s] = {"relative": float((b - b0).norm() / b0.norm().clamp_min(1e-30))}
    return out


# -- the run ---------------------------------------------------------------------------------


def _lambda_sampler(spec: str) -> Callable[[torch.Generator], float]:
    """λ ~ the distribution ``spec`` ("uniform:LO,HI" or "gaussian:MEAN,STD", clipped)."""
    kind, lo, hi = parse_lambda(spec)
    if kind == "uniform":
        return lambda g: lo + (hi - lo) * float(torch.rand((), generator=g, dtype=torch.float64))
    return lambda g: min(1.0, max(0.0, lo + hi * float(torch.randn((), generator=g,
                                                                    dtype=torch.float64))))


def _schedule(opts: LearnedMatchingOptions, scale: Callable[[], float]
              ) -> Callable[[int], float]:
    """The learning rate's factor at each step: a linear warm-up, then ``scale()`` (the
    plateau schedule: 1, cut at each plateau) or a cosine decay towards 0 at ``opts.steps``
    (the training loop's schedule)."""
    if opts.schedule == "cosine":
        return lambda step: lr_factor(step, opts.warmup, opts.steps)
    return lambda step: min(1.0, (step + 1) / max(1, opts.warmup)) * scale()


@dataclass
class _Run:
    """Everything a step reads and a checkpoint keeps."""

    latents: Latents | LatentSet
    optim: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR | None
    data_gen: torch.Generator
    lam_gen: torch.Generator
    best: dict
    result: LearnedResult
    step: int = 0
    bad: int = 0
    #: The plateau schedule's learning-rate factor, and how many plateaus have cut it.
    scale: float = 1.0
    cuts: int = 0
    #: What else defines the run (inner maps, fixed all-ones direction): a resume must match.
    setup: dict = field(default_factory=dict)
    #: Where the path is validated, the draw of each step's point (a pair's λ or N models'
    #: weights, see PathModel) and the models' own points (a pair: λ = 1 is A, 0 is B), for
    #: the baseline; set by :meth:`start`.
    points: tuple = ()
    sample: Callable[[torch.Generator], float | tuple[float, ...]] | None = None
    vertices: tuple = ()
    #: The validation losses at ``vertices`` (the models' own), set by :func:`_evaluate_start`.
    ends: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, latents: Latents | LatentSet, result: LearnedResult,
              opts: LearnedMatchingOptions, setup: dict, **where) -> _Run:
        """A fresh run: AdamW with warm-up and cosine decay, the start as the best so far.
        ``where``: ``sample`` (each step's draw: the caller knows whether B is narrower),
        ``points`` and ``vertices`` (default: the pair's)."""
        optim = _optimiser(latents, opts)
        where.setdefault("points", opts.eval_lambdas)
        where.setdefault("vertices", (1.0, 0.0))
        run = cls(latents, optim, None, torch.Generator().manual_seed(opts.seed),
                  torch.Generator().manual_seed(opts.seed + 1), latents.snapshot(),
                  result, setup=setup, **where)
        run.sched = torch.optim.lr_scheduler.LambdaLR(optim, _schedule(opts, lambda: run.scale))
        return run

    def save(self, path: Path, opts: LearnedMatchingOptions) -> None:
        from glmc.io.atomic import atomic_path

        payload = {"latents": self.latents.snapshot(), "optim": self.optim.state_dict(),
                   "sched": self.sched.state_dict(), "data_gen": self.data_gen.get_state(),
                   "lam_gen": self.lam_gen.get_state(), "best": self.best, "step": self.step,
                   "start_val": self.result.start_val, "best_val": self.result.best_val,
                   "best_step": self.result.best_step, "bad": self.bad,
                   "scale": self.scale, "cuts": self.cuts,
                   "stop_reason": self.result.stop_reason,
                   "log": self.result.log, "options": _comparable(opts) | self.setup,
                   "odds": getattr(self.sample, "odds", None)}
        with atomic_path(path) as tmp:
            torch.save(payload, tmp)

    def resume(self, ckpt: Path | None, opts: LearnedMatchingOptions) -> bool:
        """Continue from rank 0's checkpoint ``ckpt`` if ``opts`` ask to and it exists."""
        st = _read_checkpoint(ckpt, opts, self.setup)
        if st is None:
            return False
        self.latents.restore(st["latents"], str(ckpt))
        self.optim.load_state_dict(st["optim"])
        self.sched.load_state_dict(st["sched"])
        self.data_gen.set_state(st["data_gen"])
        self.lam_gen.set_state(st["lam_gen"])
        self.best, self.step, self.bad = st["best"], st["step"], st["bad"]
        self.scale, self.cuts = st["scale"], st["cuts"]
        self.result.stop_reason = st["stop_reason"]
        r = self.result
        r.start_val, r.best_val, r.best_step = st["start_val"], st["best_val"], st["best_step"]
        r.log = st["log"]
        if st.get("odds") is not None:
            self.sample.odds = st["odds"]
        return True


def _optimiser(latents: Latents | LatentSet, opts: LearnedMatchingOptions) -> torch.optim.Optimizer:
    """AdamW; the permutations' latents at ``perm_lr_scale`` of the learning rate."""
    perms = [p for m in latents.modules() if isinstance(m, PermutationLatent)
             for p in m.parameters()]
    others = [p for p in latents.parameters() if all(p is not q for q in perms)]
    # The scale holds permutations near their start while continuous maps adapt; with
    # nothing continuous to learn (the permutation-only ablation) it would only slow them.
    groups = [{"params": others, "lr": opts.lr},
              {"params": perms, "lr": opts.lr * (opts.perm_lr_scale if others else 1.0)}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=opts.lr,
                             weight_decay=opts.weight_decay)


def _read_checkpoint(ckpt: Path | None, opts: LearnedMatchingOptions, setup: dict
                     ) -> dict | None:
    """Rank 0's checkpoint on every rank (only rank 0 writes them, so on several machines
    only its own may hold one); None when there is none to resume."""
    st = None
    if distributed.rank() == 0 and opts.resume and ckpt is not None and ckpt.is_file():
        try:
            st = torch.load(ckpt, weights_only=True, map_location="cpu")  # (any device's)
            if not isinstance(st, dict):
                raise ValueError("not a learned-matching checkpoint")
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait
            st = {"error": f"{ckpt}: cannot read the checkpoint ({reason(e)}); start without "
                           "--resume"}
    st = distributed.from_main(st)
    if st is not None:
        if "error" in st:
            raise GlmcError(st["error"])
        there, here = st.get("options") or {}, _comparable(opts) | setup
        if there != here:
            diff = "; ".join(f"{k}: {there.get(k)!r} there, {here.get(k)!r} here"
                             for k in sorted(set(there) | set(here))
                             if there.get(k) != here.get(k))
            raise GlmcError(f"{ckpt}: checkpoint was written with other options ({diff}); "
                            "start without --resume or use the same options")
        if "latents" not in st:
            raise GlmcError(f"{ckpt}: not a learned-matching checkpoint; start without "
                            "--resume")
    return st


def learned_matching(
    a: CanonicalModel,
    b: CanonicalModel,
    data,
    init: Transform | dict[str, Transform],
    opts: LearnedMatchingOptions | None = None,
    fix_ones: bool = True,
    progress=None,
    inner: str | None = None,
) -> LearnedResult:
    """Refine ``init`` (π with π(B) ≈ A, e.g. from weight matching) against the task loss.

    init: the start, or candidate starts by name: the one with the lowest validation loss
    at the eval points is refined (the first of equals).
    data: a glmc.data TextDataset or ImageDataset that fits the models.
    inner: the heads' inner maps: "invertible" (trained), "orthogonal" (trained), or
    "permutation" (kept; re-solved when heads are reassigned); None: "permutation" with a
    permutation residual map, else "invertible".
    progress: optional callable(step, loss, barrier estimate or None): the validation loss
    at the eval λs minus the endpoints' loss interpolated linearly (a barrier estimate).
    """
    opts = opts or LearnedMatchingOptions()
    inner = inner or default_inner(opts.residual)
    device = _check(opts)
    init, starts = best_by_validation(a, b, data, init, opts, device)
    latents = Latents(a, b, init, opts.residual, inner, fix_ones, device)
    path = PathModel(a, b, latents, getattr(torch, opts.dtype), device=device)
    lam = opts.lam_for(narrower=bool(b.free))
    result = _fit(a, path, latents, LearnedResult(transform=init, lam=lam, starts=starts),
                  data, opts,
                  {"inner": inner, "fix_ones": fix_ones}, progress,
                  sample=_lambda_sampler(lam))
    result.transform = latents.transform()
    result.distance = distance(init, result.transform)
    return result


def best_by_validation(a: CanonicalModel, b: CanonicalModel, data,
                       init: Transform | dict[str, Transform], opts: LearnedMatchingOptions,
                       device: torch.device | None = None
                       ) -> tuple[Transform, dict[str, float]]:
    """The candidate of ``init`` with the lowest validation loss at ``opts.eval_lambdas``
    (on the validation batches learned matching reads, on ``device``), and every
    candidate's loss (none for one). Learned matching's start is chosen so, and weight
    matching's iterate when it has data (:func:`glmc.methods.builtin.weight`)."""
    if isinstance(init, Transform):
        return init, {}
    if len(init) == 1:
        return next(iter(init.values())), {}
    batches = _validation_batches(data, opts, opts.context or a.task.context(a.config))
    losses = {}
    with torch.no_grad(), deterministic():
        for name, t in init.items():
            path = PathModel(a, b, [_Fixed(t)], getattr(torch, opts.dtype), device=device)
            val = path.losses(batches, opts.eval_lambdas)
            losses[name] = sum(val) / len(val)
    best = min(losses, key=losses.get)  # (the first of equals)
    return init[best], losses


@dataclass(frozen=True)
class _Fixed:
    """A transform standing where a path reads its latents' elements."""

    transform: Transform

    def elements(self) -> dict[str, Element]:
        return dict(self.transform.elements)


@dataclass
class LearnedManyResult(LearnedResult):
    """Learned refinement of N models' frame: ``transforms`` (the first the identity)."""

    transforms: list[Transform] = field(default_factory=list)
    points: list[list[float]] = field(default_factory=list)  # where it was validated
    alpha: float = math.nan
    free_frame: bool = False  # (whether the first model's map trained too)

    def to_json(self) -> dict:
        return super().to_json() | {"alpha": self.alpha, "eval_points": self.points,
                                    "free_frame": self.free_frame}


def simplex_points(n: int) -> tuple[tuple[float, ...], ...]:
    """Where N models' refinement is validated: the centroid (the uniform merge) and every
    pair's midpoint (the pairwise barriers); for two models the midpoint alone."""
    centroid = tuple([1.0 / n] * n)
    mids = [tuple(0.5 if k in (i, j) else 0.0 for k in range(n))
            for i in range(n) for j in range(i + 1, n)]
    return (centroid, *mids) if n > 2 else (centroid,)


class SimplexSampler:
    """λ over n models, drawn from the run's generator (so that a resumed run draws the same
    λs): ~ Dirichlet(α, ..., α) (numpy's sampler seeded from the generator); with
    ``edge_fraction`` > 0, that share of the draws instead on a pair's edge, λ_i ~ the pair's
    distribution ``lam`` and λ_j = 1 − λ_i (none drawn when it is 0). The pair is random; with
    ``focus`` > 0, once :meth:`observe` has seen the pairs' barriers, pair p is drawn with
    probability ∝ exp(focus·(b_p − max b)), so that the worst pairs get the most steps."""

    def __init__(self, alpha: float, n: int, edge_fraction: float = 0.0, lam: str = "",
                 focus: float = 0.0) -> None:
        self.alpha, self.n, self.edge_fraction, self.focus = alpha, n, edge_fraction, focus
        self.pair = _lambda_sampler(lam) if edge_fraction > 0 else None
        self.pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        #: each pair's odds of an edge draw, in ``pairs``' order (None: alike); a checkpoint
        #: keeps them
        self.odds: list[float] | None = None

    def observe(self, losses: Sequence[float], ends: Sequence[float]) -> None:
        """The validation ``losses`` at :func:`simplex_points` (the centroid, then each pair's
        midpoint in ``pairs``' order) and the models' own ``ends``: each pair's barrier sets
        its odds (kept as they were when ``focus`` is 0)."""
        if self.focus > 0 and self.n > 2:
            b = [loss - (ends[i] + ends[j]) / 2
                 for loss, (i, j) in zip(losses[1:], self.pairs, strict=True)]
            self.odds = [math.exp(self.focus * (x - max(b))) for x in b]

    def __call__(self, g: torch.Generator) -> tuple[float, ...]:
        import numpy as np

        n = self.n
        if self.pair is not None and float(torch.rand((), generator=g)) < self.edge_fraction:
            if self.odds is None:
                i, j = torch.randperm(n, generator=g)[:2].tolist()
            else:
                k = int(torch.multinomial(torch.tensor(self.odds, dtype=torch.float64), 1,
                                          generator=g))
                i, j = self.pairs[k]
                if float(torch.rand((), generator=g)) < 0.5:
                    i, j = j, i
            li = self.pair(g)
            return tuple(li if k == i else 1.0 - li if k == j else 0.0 for k in range(n))
        seed = int(torch.randint(2**62, (), generator=g))
        return tuple(float(w) for w in np.random.default_rng(seed).dirichlet([self.alpha] * n))


def learned_many(
    models: Sequence[CanonicalModel],
    data,
    init: Sequence[Transform],
    opts: LearnedMatchingOptions | None = None,
    fix_ones: bool | Sequence[bool] = True,
    progress=None,
    inner: str | None = None,
) -> LearnedManyResult:
    """Refine N models' frame ``init`` (one transform per model into the first model's
    coordinates, the first the identity: e.g. MergeMany's) against the task loss at
    θ(λ) = Σ_i λ_i·π_i(θ_i), with λ ~ Dirichlet(α, ..., α) at each step
    (``opts.dirichlet_alpha``), or for ``opts.edge_fraction`` of the steps on a pair's edge at
    the pair's λ (``opts.lam_for``; the pair drawn by its last validation barrier with
    ``opts.edge_focus``, see :class:`SimplexSampler`). Models 2..N train their own latents, as in
    :func:`learned_matching` against the first; validation is at :func:`simplex_points`,
    and the start is the best so far. ``inner`` and ``progress`` as for
    :func:`learned_matching`; ``fix_ones``: for all models after the first, or one each
    (``opts.eval_lambdas`` is the pair's and is not read)."""
    opts = opts or LearnedMatchingOptions()
    inner = inner or default_inner(opts.residual)
    device = _check(opts)
    n = len(models)
    if n < 2 or len(init) != n:
        raise GlmcError(f"learned refinement needs 2 or more models and one transform each, "
                        f"got {n} models and {len(init)} transforms")
    alpha = opts.dirichlet_alpha
    fix = [fix_ones] * (n - 1) if isinstance(fix_ones, bool) else list(fix_ones)
    narrower = any(bool(m.free) for m in models[1:])
    if opts.free_frame and narrower:
        raise GlmcError("a free frame needs models of one width (a narrower model's free "
                        "entries take the first model's values, in its coordinates)")
    free = not narrower if opts.free_frame is None else opts.free_frame
    first = None
    if free:
        # (the first keeps the all-ones direction where every pair does: so does the frame)
        groups = effective_groups(models[0].spec, "orthogonal" if opts.residual == "none"
                                  else opts.residual, inner, all(fix))
        home = Transform({s: g.identity() for s, g in groups.items()})
        first = Latents(models[0], models[0], home, opts.residual, inner, all(fix), device)
    latents = LatentSet([Latents(models[0], m, t, opts.residual, inner, f, device)
                         for m, t, f in zip(models[1:], init[1:], fix, strict=True)], first)
    path = PathModel(models[0], models[1:], list(latents.members), getattr(torch, opts.dtype),
                     first=first, device=device)
    points = simplex_points(n)
    vertices = tuple(tuple(float(k == i) for k in range(n)) for i in range(n))
    lam = opts.lam_for(narrower=narrower)
    result = _fit(models[0], path, latents,
                  LearnedManyResult(transform=init[0], points=[list(p) for p in points],
                                    alpha=alpha, lam=lam, free_frame=free),
                  data, opts, {"inner": inner, "fix_ones": fix, "models": n,
                               "alpha": alpha, "edge_fraction": opts.edge_fraction,
                               "edge_focus": opts.edge_focus,
                               "free_frame": free}, progress,
                  points=points,
                  sample=SimplexSampler(alpha, n, opts.edge_fraction, lam, opts.edge_focus),
                  vertices=vertices)
    result.transforms = [init[0], *latents.transforms()]
    result.distance = {f"model {i + 1}": distance(t0, t) for i, (t0, t) in
                       enumerate(zip(init, result.transforms, strict=True)) if i}
    if first is not None:  # (how far the frame itself moved from the first model's coordinates)
        result.distance["frame"] = distance(home, first.transform())
    return result


def _fit(a: CanonicalModel, path: PathModel, latents: Latents | LatentSet,
         result: LearnedResult, data, opts: LearnedMatchingOptions, setup: dict, progress,
         **where) -> LearnedResult:
    """The run: validation batches, a fresh or resumed start, the steps; the latents end at
    the best point found (``where``: see :meth:`_Run.start`)."""
    context = opts.context or a.task.context(a.config)
    val_batches = _validation_batches(data, opts, context)
    run = _Run.start(latents, result, opts, setup=setup, **where)
    ckpt = Path(opts.checkpoint) if opts.checkpoint else None
    resumed = run.resume(ckpt, opts)
    with deterministic():  # (the same seed, the same bits, on any number of threads)
        _evaluate_start(run, path, val_batches, resumed)
        batches = data.batches("train", opts.batch_size, context, generator=run.data_gen)
        t0 = time.perf_counter()
        _train(run, path, batches, val_batches, opts, ckpt, progress)
    latents.restore(run.best)
    run.result.steps, run.result.seconds = len(run.result.log), time.perf_counter() - t0
    return run.result


def _check(opts: LearnedMatchingOptions) -> torch.device:
    """What the options cannot check alone: the batch splits over the processes, and the
    device is there (returned)."""
    world = distributed.world_size()
    if opts.batch_size % world:
        raise GlmcError(f"batch size {opts.batch_size} does not split over {world} processes")
    if opts.dtype not in ("float32", "float64"):
        raise GlmcError(f"dtype must be float32 or float64, got {opts.dtype!r}")
    return matching_device(opts.device)


def _validation_batches(data, opts: LearnedMatchingOptions, context: int | None) -> list:
    """The fixed validation batches (``opts.eval_batches`` of them)."""
    batches = _take(data.eval_batches("val", opts.batch_size, context), opts.eval_batches)
    if not batches:
        raise GlmcError(f"dataset '{data.name}': the validation split is too small for one "
                        f"batch (context {context})")
    return batches


def _evaluate_start(run: _Run, path: PathModel, batches: list, resumed: bool) -> None:
    """The baseline (the endpoints' losses, interpolated linearly) and, unless resumed, the
    start's loss: the best so far, so the result is never worse than weight matching."""
    result = run.result
    # π_i(θ_i) computes model i's function: a vertex needs no latent
    run.ends = ends = path.losses(batches, run.vertices)
    if not resumed:
        losses = path.losses(batches, run.points)
        result.start_val = result.best_val = sum(losses) / len(losses)
        _observe(run, losses)
    result.baseline_val = sum(
        sum(w * e for w, e in zip(path.weights(p), ends, strict=True))
        for p in run.points) / len(run.points)


def _train(run: _Run, path: PathModel, batches: Iterator, val_batches: list,
           opts: LearnedMatchingOptions, ckpt: Path | None, progress) -> None:
    """Steps until a plateau (see :func:`_plateau`), ``opts.steps`` or ``opts.time_budget``
    seconds, validating every ``opts.eval_every``; rank 0 reports and writes the
    checkpoints. Sets ``run.result.stop_reason``."""
    rank = distributed.rank()
    t0 = time.perf_counter()
    if run.result.stop_reason == "plateau":  # (resumed after it stopped: nothing is left)
        return
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        while run.step < opts.steps:
            if opts.time_budget is not None and distributed.from_main(
                    time.perf_counter() - t0 >= opts.time_budget):  # (rank 0's clock decides)
                run.result.stop_reason = "time_budget"
                break
            row = _train_step(run, path, next(batches), run.sample(run.lam_gen), opts, pool,
                              ckpt)
            last = run.step == opts.steps
            stop = False
            if run.step % opts.eval_every == 0 or last:
                row["val"] = _validate(run, path, val_batches, opts, pool)
                stop = _plateau(run, opts)
                if stop:
                    run.result.stop_reason = "plateau"
                if opts.schedule == "plateau":
                    row["lr_scale"] = run.scale  # (the factor from the next step on)
            run.result.log.append(row)
            if progress is not None and rank == 0:
                val = row.get("val")
                progress(run.step, row["loss"],
                         None if val is None else val - run.result.baseline_val)
            if ckpt is not None and rank == 0 and (
                    (opts.checkpoint_every and run.step % opts.checkpoint_every == 0)
                    or last or stop):
                run.save(ckpt, opts)
            if stop:
                break
        else:
            run.result.stop_reason = "max_steps"


def _plateau(run: _Run, opts: LearnedMatchingOptions) -> bool:
    """After a validation: whether the run stops. ``opts.patience`` validations without a
    new best make a plateau; the plateau schedule then cuts the learning rate by
    ``opts.cut`` (the count starting afresh), and the plateau after ``opts.cuts`` cuts
    stops the run; the cosine schedule stops at the first."""
    if not opts.patience or run.bad < opts.patience:
        return False
    if opts.schedule == "plateau" and run.cuts < opts.cuts:
        run.cuts, run.scale, run.bad = run.cuts + 1, run.scale * opts.cut, 0
        return False
    return True


def _train_step(run: _Run, path: PathModel, batch: tuple, lam: float | tuple[float, ...],
                opts: LearnedMatchingOptions, pool: ThreadPoolExecutor,
                ckpt: Path | None) -> dict:
    """One optimiser step on this rank's shard of ``batch`` at ``lam``."""
    rank, world = distributed.rank(), distributed.world_size()
    x, y = batch
    shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    for p in run.latents.project(pool):
        run.optim.state.pop(p, None)
    run.optim.zero_grad(set_to_none=True)
    loss = path.loss(lam, x[shard], y[shard])
    if not torch.isfinite(loss):
        kept = f"; the last good checkpoint {ckpt} is kept" if ckpt else ""
        raise GlmcError(f"learned matching: loss is {float(loss)} at step {run.step}{kept}")
    loss.backward()
    params = [p for p in run.latents.parameters() if p.grad is not None]
    if world > 1:
        for p in params:
            torch.distributed.all_reduce(p.grad)
            p.grad /= world
    torch.nn.utils.clip_grad_norm_(params, opts.clip)
    run.optim.step()
    run.sched.step()
    run.step += 1
    return {"step": run.step, "loss": float(loss.detach()),
            "lambda": lam if isinstance(lam, float) else [round(w, 6) for w in lam]}


def _validate(run: _Run, path: PathModel, batches: list, opts: LearnedMatchingOptions,
              pool: ThreadPoolExecutor) -> float:
    """Validation loss of the hard elements; keep them if they are the best so far."""
    for p in run.latents.project(pool):
        run.optim.state.pop(p, None)
    losses = path.losses(batches, run.points)
    _observe(run, losses)
    val = sum(losses) / len(losses)
    if val < run.result.best_val:
        run.result.best_val, run.result.best_step, run.bad = val, run.step, 0
        run.best = run.latents.snapshot()
    else:
        run.bad += 1
    return val


def _observe(run: _Run, losses: list[float]) -> None:
    """Tell the draws (N models' :class:`SimplexSampler`) the validation ``losses`` at the
    run's points."""
    if isinstance(run.sample, SimplexSampler):
        run.sample.observe(losses, run.ends)


def _comparable(opts: LearnedMatchingOptions) -> dict:
    """Options that must match for a resumed run to continue the same run."""
    d = asdict(replace(opts))
    for k in ("checkpoint", "checkpoint_every", "resume", "dirichlet_alpha", "edge_fraction",
              "edge_focus", "free_frame"):
        d.pop(k)  # (N models' runs keep these in their setup; a pair never reads them)
    d.pop("device")  # (a run resumes on any device)
    d.pop("time_budget")  # (a run stopped by its time budget resumes under any other)
    d["eval_lambdas"] = list(d["eval_lambdas"])
    return d


def _take(it, n: int) -> list:
    out = []
    for item in it:
        if len(out) >= n:
            break
        out.append(item)
    return out
