"""Learned matching (DESIGN.md §6): train the alignment against the task loss on the path.

Both models are frozen; only one latent per space trains (see ``parametrize``). Each step
samples λ, builds θ(λ) = λ·θ_A + (1 − λ)·π(θ_B) functionally (torch.func.functional_call on
one module, no surgery) and minimises the task loss on training data. AdamW with linear
warm-up and cosine decay, gradient clipping, early stopping on the validation loss at fixed
λs, the best latents kept. Runs data-parallel under torchrun: each rank takes a shard of the
global batch and the latents' gradients are averaged with an all-reduce.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.func import functional_call

from glmc import distributed
from glmc.errors import GlmcError
from glmc.matching.options import LearnedMatchingOptions, parse_lambda
from glmc.matching.parametrize import OrthogonalLatent, PermutationLatent, project_all
from glmc.matching.weight import realign_inner
from glmc.models.model import CanonicalModel
from glmc.symmetry.groups import Element, Matrix, Permutation
from glmc.symmetry.transform import Transform, apply_axes

StateDict = dict[str, torch.Tensor]


@dataclass
class LearnedResult:
    transform: Transform
    log: list[dict] = field(default_factory=list)
    best_val: float = math.inf
    best_step: int = 0
    steps: int = 0
    seconds: float = 0.0
    distance: dict = field(default_factory=dict)  # from the initial (weight-matching) transform
    #: Validation loss on the straight line between the endpoints at the eval λs: the
    #: midpoint barrier estimate is best_val minus this.
    baseline_val: float = math.nan

    def to_json(self) -> dict:
        return {"best_val": self.best_val, "best_step": self.best_step, "steps": self.steps,
                "barrier_estimate": self.best_val - self.baseline_val,
                "seconds": round(self.seconds, 3), "distance_from_init": self.distance,
                "log": self.log}


# -- pieces -------------------------------------------------------------------------------


def _lambda_sampler(spec: str):
    """λ ~ the distribution ``spec`` ("uniform:LO,HI" or "gaussian:MEAN,STD", clipped)."""
    kind, lo, hi = parse_lambda(spec)
    if kind == "uniform":
        return lambda g: lo + (hi - lo) * float(torch.rand((), generator=g, dtype=torch.float64))
    return lambda g: min(1.0, max(0.0, lo + hi * float(torch.randn((), generator=g,
                                                                    dtype=torch.float64))))


def make_latents(model: CanonicalModel, init: Transform, residual: str,
                 fix_ones: bool) -> tuple[torch.nn.ModuleDict, dict[str, Element]]:
    """Trainable latents per space, and the spaces that stay fixed (heads' inner bases)."""
    spec = model.spec
    latents, fixed = {}, {}
    for s, g in spec.spaces.items():
        e = init.elements.get(s, g.identity())
        role = spec.roles.get(s)
        if role == "residual":
            if residual == "orthogonal":
                latents[s] = OrthogonalLatent(e, fix_ones)
            elif residual == "permutation":
                if not isinstance(e, Permutation):
                    raise GlmcError("the permutation-only ablation needs a permutation start "
                                    "(weight matching with residual=permutation)")
                latents[s] = PermutationLatent(e)
            else:
                fixed[s] = e
        elif g.kind == "permutation":
            if not isinstance(e, Permutation):
                raise GlmcError(f"space {s}: expected a permutation in the initial transform")
            latents[s] = PermutationLatent(e)
        else:
            fixed[s] = e
    return torch.nn.ModuleDict({k.replace(".", "_"): v for k, v in latents.items()}), fixed


def _names(spec_spaces) -> dict[str, str]:
    return {k.replace(".", "_"): k for k in spec_spaces}


def task_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; logits (..., classes), y (...) class ids."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class PathModel:
    """θ(λ) = λ·θ_A + (1 − λ)·π(θ_B) evaluated with one module, π from the latents."""

    def __init__(self, a: CanonicalModel, b: CanonicalModel, latents: torch.nn.ModuleDict,
                 fixed: dict[str, Element], dtype: torch.dtype = torch.float32) -> None:
        self.spec = a.spec
        self.a = {k: v.to(dtype) for k, v in a.state.items()}
        self.b = {k: v.to(dtype) for k, v in b.state.items()}
        self.module = a.module(dtype)
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.latents, self.fixed = latents, fixed
        self.space_of = _names(self.spec.spaces)

    def elements(self) -> dict[str, Element]:
        els = dict(self.fixed)
        for key, lat in self.latents.items():
            els[self.space_of[key]] = Matrix(lat.matrix(), orthogonal=True)
        return els

    def state(self, lam: float) -> StateDict:
        els = self.elements()
        out = {}
        for n, xa in self.a.items():
            tags = self.spec.axes.get(n)
            xb = apply_axes(self.b[n], tags, els) if tags else self.b[n]
            out[n] = lam * xa + (1 - lam) * xb
        return out

    def loss(self, lam: float, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        state = self.state(lam)
        return task_loss(functional_call(self.module, state, (_cast(x, state),)), y)


def _cast(x: torch.Tensor, state: StateDict) -> torch.Tensor:
    """Images in the models' dtype (token ids stay integers)."""
    return x.to(next(iter(state.values())).dtype) if x.is_floating_point() else x


def _save(path: Path, payload: dict) -> None:
    from glmc.io.atomic import atomic_path

    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def distance(init: Transform, learned: Transform) -> dict:
    """How far learned matching moved from its start: units reassigned, rotation angles."""
    out = {}
    for s, e in learned.elements.items():
        e0 = init.elements.get(s)
        if isinstance(e, Permutation) and isinstance(e0, Permutation):
            out[s] = {"changed": int((e.perm != e0.perm).sum()), "of": e.perm.numel()}
        elif isinstance(e, Matrix) and e0 is not None:
            r = e.matrix(torch.float64) @ e0.matrix(torch.float64).T
            angles = torch.linalg.eigvals(r).angle().abs().rad2deg()
            out[s] = {"max_angle_deg": float(angles.max()), "mean_angle_deg": float(angles.mean()),
                      "frobenius": float(torch.linalg.matrix_norm(r - torch.eye(r.shape[0],
                                                                        dtype=r.dtype)))}
    return out


# -- the loop -----------------------------------------------------------------------------


def learned_matching(
    a: CanonicalModel,
    b: CanonicalModel,
    data,
    init: Transform,
    opts: LearnedMatchingOptions | None = None,
    fix_ones: bool = True,
    progress=None,
) -> LearnedResult:
    """Refine ``init`` (π with π(B) ≈ A, e.g. from weight matching) against the task loss.

    data: a glmc.data TextDataset or ImageDataset that fits the models.
    progress: optional callable(step, loss, barrier estimate or None): the validation loss
    at the eval λs minus the endpoints' loss interpolated linearly (a barrier estimate).
    """
    opts = opts or LearnedMatchingOptions()
    rank, world = distributed.rank(), distributed.world_size()
    if opts.batch_size % world:
        raise GlmcError(f"batch size {opts.batch_size} does not split over {world} processes")
    sample_lam = _lambda_sampler(opts.lam)
    latents, fixed = make_latents(a, init, opts.residual, fix_ones)
    if opts.dtype not in ("float32", "float64"):
        raise GlmcError(f"dtype must be float32 or float64, got {opts.dtype!r}")
    path = PathModel(a, b, latents, fixed, getattr(torch, opts.dtype))
    params = [p for p in latents.parameters()]
    if not params:
        raise GlmcError("nothing to learn: the spec has no permutation or residual space")
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay)

    def schedule(step: int) -> float:
        if step < opts.warmup:
            return (step + 1) / opts.warmup
        t = (step - opts.warmup) / max(1, opts.steps - opts.warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, schedule)
    data_gen = torch.Generator().manual_seed(opts.seed)
    lam_gen = torch.Generator().manual_seed(opts.seed + 1)
    context = opts.context or (a.config.n_positions if a.config.task == "causal_lm" else None)
    val_batches = list(_take(data.eval_batches("val", opts.batch_size, context),
                             opts.eval_batches))
    if not val_batches:
        raise GlmcError(f"dataset '{data.name}': the validation split is too small for one "
                        f"batch (context {context})")
    result = LearnedResult(transform=init)
    best = {k: v.detach().clone() for k, v in latents.state_dict().items()}
    start_step, bad_evals = 0, 0
    ckpt = Path(opts.checkpoint) if opts.checkpoint else None
    st = None
    if rank == 0 and opts.resume and ckpt is not None and ckpt.is_file():
        try:
            st = torch.load(ckpt, weights_only=True)
        except Exception as e:  # (every rank must hear of it, not wait for the state)
            st = {"error": f"{ckpt}: cannot read the checkpoint ({type(e).__name__}: {e}); "
                           "start without --resume"}
    # Only rank 0 writes checkpoints, so on several machines only its own may hold one.
    st = distributed.from_main(st)
    if st is not None:
        if "error" in st:
            raise GlmcError(st["error"])
        if st.get("options") != _comparable(opts):
            raise GlmcError(f"{ckpt}: checkpoint was written with other options; "
                            "start without --resume or use the same options")
        latents.load_state_dict(st["latents"])
        optim.load_state_dict(st["optim"])
        sched.load_state_dict(st["sched"])
        data_gen.set_state(st["data_gen"])
        lam_gen.set_state(st["lam_gen"])
        best, start_step = st["best"], st["step"]
        result.best_val, result.best_step, bad_evals = st["best_val"], st["best_step"], st["bad"]
        result.log = st["log"]
    with torch.no_grad():  # π(B) computes B's function, so λ = 0 needs no latent
        ends = {lam: _evaluate(path, val_batches, (lam,)) for lam in (0.0, 1.0)}
    result.baseline_val = sum(lam * ends[1.0] + (1 - lam) * ends[0.0]
                              for lam in opts.eval_lambdas) / len(opts.eval_lambdas)
    batches = data.batches("train", opts.batch_size, context, generator=data_gen)
    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    step = start_step
    try:
        for step in range(start_step, opts.steps):
            x, y = next(batches)
            lam = sample_lam(lam_gen)
            shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
            project_all(latents, pool)
            optim.zero_grad(set_to_none=True)
            loss = path.loss(lam, x[shard], y[shard])
            if not torch.isfinite(loss):
                kept = f"; the last good checkpoint {ckpt} is kept" if ckpt else ""
                raise GlmcError(f"learned matching: loss is {float(loss)} at step {step}{kept}")
            loss.backward()
            if world > 1:
                for p in params:
                    torch.distributed.all_reduce(p.grad)
                    p.grad /= world
            torch.nn.utils.clip_grad_norm_(params, opts.clip)
            optim.step()
            sched.step()
            row = {"step": step + 1, "loss": float(loss.detach()), "lambda": lam}
            val = None
            last = step + 1 == opts.steps
            if (step + 1) % opts.eval_every == 0 or last:
                project_all(latents, pool)
                val = _evaluate(path, val_batches, opts.eval_lambdas)
                row["val"] = val
                if val < result.best_val:
                    result.best_val, result.best_step, bad_evals = val, step + 1, 0
                    best = {k: v.detach().clone() for k, v in latents.state_dict().items()}
                else:
                    bad_evals += 1
            result.log.append(row)
            if progress is not None and rank == 0:
                progress(step + 1, row["loss"],
                         None if val is None else val - result.baseline_val)
            stop = opts.patience and bad_evals >= opts.patience
            if ckpt is not None and rank == 0 and (
                    (opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0)
                    or last or stop):
                _save(ckpt, {"latents": latents.state_dict(), "optim": optim.state_dict(),
                             "sched": sched.state_dict(), "data_gen": data_gen.get_state(),
                             "lam_gen": lam_gen.get_state(), "best": best, "step": step + 1,
                             "best_val": result.best_val, "best_step": result.best_step,
                             "bad": bad_evals, "log": result.log,
                             "options": _comparable(opts)})
            if stop:
                break
    finally:
        pool.shutdown()
    latents.load_state_dict(best)
    els = dict(fixed)
    names = _names(a.spec.spaces)
    for key, lat in latents.items():
        els[names[key]] = lat.element()
    result.transform = Transform(els)
    moved_heads = [s for s in spaces_with_role(a, "heads")
                   if not torch.equal(els[s].perm, init.elements[s].perm)]
    if moved_heads:  # their inner bases were aligned to the heads they used to pair with
        result.transform = realign_inner(a, b, result.transform, moved_heads)
    result.steps = len(result.log)
    result.seconds = time.perf_counter() - t0
    result.distance = distance(init, result.transform)
    return result


def spaces_with_role(model: CanonicalModel, role: str) -> list[str]:
    return [s for s, r in model.spec.roles.items() if r == role]


def _comparable(opts: LearnedMatchingOptions) -> dict:
    """Options that must match for a resumed run to continue the same run."""
    d = asdict(opts)
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


@torch.no_grad()
def _evaluate(path: PathModel, batches: list, lambdas: tuple[float, ...]) -> float:
    total = 0.0
    for lam in lambdas:
        state = path.state(lam)
        total += sum(float(task_loss(functional_call(path.module, state, (_cast(x, state),)), y))
                     for x, y in batches) / len(batches)
    return total / len(lambdas)
