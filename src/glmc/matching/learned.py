"""Learned matching: train the alignment against the task loss on the path.

Both models are frozen; only one latent per space trains (see ``parametrize``): the residual
map, every permutation (straight-through) and the heads' inner maps. Each step samples λ,
builds θ(λ) = λ·θ_A + (1 − λ)·π(θ_B) functionally (torch.func.functional_call on one module,
no surgery) and minimises the task loss on training data. AdamW with linear warm-up and
cosine decay, gradient clipping, early stopping on the validation loss at fixed λs.

The start (weight matching's solution) is evaluated first and is the best so far, so the
result is never worse than it on validation; what is returned is exactly what was evaluated
(a head reassigned during training gets its inner maps aligned afresh at once, and they go on
training from there). Runs data-parallel under torchrun: each rank takes a shard of the
global batch and the latents' gradients are averaged with an all-reduce.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

from glmc import distributed
from glmc.errors import GlmcError, reason
from glmc.matching.options import (
    LearnedMatchingOptions,
    WeightMatchingOptions,
    default_inner,
    parse_lambda,
)
from glmc.matching.parametrize import PermutationLatent, make_latent, project_all
from glmc.matching.problem import Problem, effective_groups, head_tensors, stream_space
from glmc.matching.weight import inner_maps
from glmc.model import CanonicalModel
from glmc.schedule import lr_factor
from glmc.symmetry.groups import BlockMatrix, Element, Matrix, Permutation
from glmc.symmetry.transform import Transform, apply_axes
from glmc.tensors import StateDict


@dataclass
class LearnedResult:
    transform: Transform
    log: list[dict] = field(default_factory=list)
    start_val: float = math.nan  # validation loss of the start, at the eval λs
    best_val: float = math.inf
    best_step: int = 0  # 0: the start was never beaten
    steps: int = 0
    seconds: float = 0.0
    distance: dict = field(default_factory=dict)  # from the start (weight matching)
    #: Validation loss on the straight line between the endpoints at the eval λs: the
    #: midpoint barrier estimate is best_val minus this.
    baseline_val: float = math.nan

    def to_json(self) -> dict:
        return {"start_val": self.start_val, "best_val": self.best_val,
                "best_step": self.best_step, "steps": self.steps,
                "barrier_estimate": self.best_val - self.baseline_val,
                "start_barrier_estimate": self.start_val - self.baseline_val,
                "seconds": round(self.seconds, 3), "distance_from_init": self.distance,
                "log": self.log}


# -- the latents ----------------------------------------------------------------------------


def _key(space: str) -> str:
    return space.replace(".", "_")  # (ModuleDict keys cannot hold dots)


class Latents(torch.nn.Module):
    """One latent per space (or a fixed element where nothing trains), and the hard
    elements they give. Head assignments that change are followed by fresh inner maps."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, init: Transform, residual: str,
                 inner: str, fix_ones: bool) -> None:
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
        self.problem = Problem(a, b, WeightMatchingOptions(inner=inner),
                               only=head_tensors(spec))
        self.aligned_for = {u: init.elements[u].perm.clone() for u in self.problem.head_units
                            if u in init.elements}
        if not any(True for _ in self.parameters()):
            raise GlmcError("nothing to learn: the spec has no permutation or residual space")

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
        return Transform(self.hard())

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


# -- the path ------------------------------------------------------------------------------


def task_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; logits (..., classes), y (...) class ids."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class PathModel:
    """θ(λ) = λ·θ_A + (1 − λ)·π(θ_B) evaluated with one module, π from the latents."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, latents: Latents,
                 dtype: torch.dtype = torch.float32) -> None:
        self.spec = a.spec
        self.a = {k: v.to(dtype) for k, v in a.state.items()}
        self.b = {k: v.to(dtype) for k, v in b.state.items()}
        self.module = a.module(dtype)
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.latents = latents

    def state(self, lam: float) -> StateDict:
        els = self.latents.elements()
        out = {}
        for n, xa in self.a.items():
            tags = self.spec.axes.get(n)
            xb = apply_axes(self.b[n], tags, els) if tags else self.b[n]
            out[n] = lam * xa + (1 - lam) * xb
        return out

    def loss(self, lam: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        state = self.state(lam)
        return task_loss(functional_call(self.module, state, (_cast(x, state),)), y)

    @torch.no_grad()
    def evaluate(self, batches: list, lambdas: tuple[float, ...]) -> float:
        """Mean loss over ``batches`` and ``lambdas``."""
        total = 0.0
        for lam in lambdas:
            total += sum(float(self.loss(lam, x, y)) for x, y in batches) / len(batches)
        return total / len(lambdas)


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


def _schedule(opts: LearnedMatchingOptions) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay towards 0 over the remaining steps (the training
    loop's schedule)."""
    return lambda step: lr_factor(step, opts.warmup, opts.steps)


@dataclass
class _Run:
    """Everything a step reads and a checkpoint keeps."""

    latents: Latents
    optim: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    data_gen: torch.Generator
    lam_gen: torch.Generator
    best: dict
    result: LearnedResult
    step: int = 0
    bad: int = 0
    #: What else defines the run (inner maps, fixed all-ones direction): a resume must match.
    setup: dict = field(default_factory=dict)

    @classmethod
    def start(cls, latents: Latents, init: Transform, opts: LearnedMatchingOptions,
              setup: dict) -> _Run:
        """A fresh run: AdamW with warm-up and cosine decay, the start as the best so far."""
        optim = _optimiser(latents, opts)
        return cls(latents, optim, torch.optim.lr_scheduler.LambdaLR(optim, _schedule(opts)),
                   torch.Generator().manual_seed(opts.seed),
                   torch.Generator().manual_seed(opts.seed + 1), latents.snapshot(),
                   LearnedResult(transform=init), setup=setup)

    def save(self, path: Path, opts: LearnedMatchingOptions) -> None:
        from glmc.io.atomic import atomic_path

        payload = {"latents": self.latents.snapshot(), "optim": self.optim.state_dict(),
                   "sched": self.sched.state_dict(), "data_gen": self.data_gen.get_state(),
                   "lam_gen": self.lam_gen.get_state(), "best": self.best, "step": self.step,
                   "start_val": self.result.start_val, "best_val": self.result.best_val,
                   "best_step": self.result.best_step, "bad": self.bad,
                   "log": self.result.log, "options": _comparable(opts) | self.setup}
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
        r = self.result
        r.start_val, r.best_val, r.best_step = st["start_val"], st["best_val"], st["best_step"]
        r.log = st["log"]
        return True


def _optimiser(latents: Latents, opts: LearnedMatchingOptions) -> torch.optim.Optimizer:
    """AdamW; the permutations' latents at ``perm_lr_scale`` of the learning rate."""
    perms = [p for m in latents.latents.values() if isinstance(m, PermutationLatent)
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
            st = torch.load(ckpt, weights_only=True)
            if not isinstance(st, dict):
                raise ValueError("not a learned-matching checkpoint")
        except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait
            st = {"error": f"{ckpt}: cannot read the checkpoint ({reason(e)}); start without "
                           "--resume"}
    st = distributed.from_main(st)
    if st is not None:
        if "error" in st:
            raise GlmcError(st["error"])
        if st.get("options") != _comparable(opts) | setup:
            raise GlmcError(f"{ckpt}: checkpoint was written with other options; start "
                            "without --resume or use the same options")
        if "latents" not in st:
            raise GlmcError(f"{ckpt}: not a learned-matching checkpoint; start without "
                            "--resume")
    return st


def learned_matching(
    a: CanonicalModel,
    b: CanonicalModel,
    data,
    init: Transform,
    opts: LearnedMatchingOptions | None = None,
    fix_ones: bool = True,
    progress=None,
    inner: str | None = None,
) -> LearnedResult:
    """Refine ``init`` (π with π(B) ≈ A, e.g. from weight matching) against the task loss.

    data: a glmc.data TextDataset or ImageDataset that fits the models.
    inner: the heads' inner maps: "invertible" (trained), "orthogonal" (trained), or
    "permutation" (kept; re-solved when heads are reassigned); None: "permutation" with a
    permutation residual map, else "invertible".
    progress: optional callable(step, loss, barrier estimate or None): the validation loss
    at the eval λs minus the endpoints' loss interpolated linearly (a barrier estimate).
    """
    opts = opts or LearnedMatchingOptions()
    inner = inner or default_inner(opts.residual)
    _check(opts)
    latents = Latents(a, b, init, opts.residual, inner, fix_ones)
    path = PathModel(a, b, latents, getattr(torch, opts.dtype))
    context = opts.context or a.task.context(a.config)
    val_batches = _validation_batches(data, opts, context)
    run = _Run.start(latents, init, opts, setup={"inner": inner, "fix_ones": fix_ones})
    ckpt = Path(opts.checkpoint) if opts.checkpoint else None
    resumed = run.resume(ckpt, opts)
    _evaluate_start(run, path, val_batches, opts, resumed)
    batches = data.batches("train", opts.batch_size, context, generator=run.data_gen)
    t0 = time.perf_counter()
    _train(run, path, batches, val_batches, opts, ckpt, progress)
    latents.restore(run.best)
    result = run.result
    result.transform = latents.transform()
    result.steps, result.seconds = len(result.log), time.perf_counter() - t0
    result.distance = distance(init, result.transform)
    return result


def _check(opts: LearnedMatchingOptions) -> None:
    """What the options cannot check alone: the batch splits over the processes."""
    world = distributed.world_size()
    if opts.batch_size % world:
        raise GlmcError(f"batch size {opts.batch_size} does not split over {world} processes")
    if opts.dtype not in ("float32", "float64"):
        raise GlmcError(f"dtype must be float32 or float64, got {opts.dtype!r}")


def _validation_batches(data, opts: LearnedMatchingOptions, context: int | None) -> list:
    """The fixed validation batches (``opts.eval_batches`` of them)."""
    batches = _take(data.eval_batches("val", opts.batch_size, context), opts.eval_batches)
    if not batches:
        raise GlmcError(f"dataset '{data.name}': the validation split is too small for one "
                        f"batch (context {context})")
    return batches


def _evaluate_start(run: _Run, path: PathModel, batches: list, opts: LearnedMatchingOptions,
                    resumed: bool) -> None:
    """The baseline (the endpoints' losses, interpolated linearly) and, unless resumed, the
    start's loss: the best so far, so the result is never worse than weight matching."""
    result = run.result
    with torch.no_grad():  # π(B) computes B's function, so λ = 0 needs no latent
        ends = {lam: path.evaluate(batches, (lam,)) for lam in (0.0, 1.0)}
        if not resumed:
            result.start_val = result.best_val = path.evaluate(batches, opts.eval_lambdas)
    result.baseline_val = sum(lam * ends[1.0] + (1 - lam) * ends[0.0]
                              for lam in opts.eval_lambdas) / len(opts.eval_lambdas)


def _train(run: _Run, path: PathModel, batches: Iterator, val_batches: list,
           opts: LearnedMatchingOptions, ckpt: Path | None, progress) -> None:
    """Steps until ``opts.steps`` (or ``opts.patience`` evaluations without a better one),
    validating every ``opts.eval_every``; rank 0 reports and writes the checkpoints."""
    sample_lam = _lambda_sampler(opts.lam)
    rank = distributed.rank()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        while run.step < opts.steps:
            row = _train_step(run, path, next(batches), sample_lam(run.lam_gen), opts, pool,
                              ckpt)
            last = run.step == opts.steps
            if run.step % opts.eval_every == 0 or last:
                row["val"] = _validate(run, path, val_batches, opts, pool)
            run.result.log.append(row)
            if progress is not None and rank == 0:
                val = row.get("val")
                progress(run.step, row["loss"],
                         None if val is None else val - run.result.baseline_val)
            stop = bool(opts.patience) and run.bad >= opts.patience
            if ckpt is not None and rank == 0 and (
                    (opts.checkpoint_every and run.step % opts.checkpoint_every == 0)
                    or last or stop):
                run.save(ckpt, opts)
            if stop:
                break


def _train_step(run: _Run, path: PathModel, batch: tuple, lam: float,
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
    return {"step": run.step, "loss": float(loss.detach()), "lambda": lam}


def _validate(run: _Run, path: PathModel, batches: list, opts: LearnedMatchingOptions,
              pool: ThreadPoolExecutor) -> float:
    """Validation loss of the hard elements; keep them if they are the best so far."""
    for p in run.latents.project(pool):
        run.optim.state.pop(p, None)
    val = path.evaluate(batches, opts.eval_lambdas)
    if val < run.result.best_val:
        run.result.best_val, run.result.best_step, run.bad = val, run.step, 0
        run.best = run.latents.snapshot()
    else:
        run.bad += 1
    return val


def _comparable(opts: LearnedMatchingOptions) -> dict:
    """Options that must match for a resumed run to continue the same run."""
    d = asdict(replace(opts))
    for k in ("checkpoint", "checkpoint_every", "resume"):
        d.pop(k)
    d["eval_lambdas"] = list(d["eval_lambdas"])
    return d


def _take(it, n: int) -> list:
    out = []
    for item in it:
        if len(out) >= n:
            break
        out.append(item)
    return out
