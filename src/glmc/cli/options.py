"""Option groups shared by align, merge and barrier."""

from __future__ import annotations

import argparse
from pathlib import Path

from glmc.defaults import CORRECTIONS, MAX_POINTS
from glmc.errors import GlmcError
from glmc.matching.options import (
    NARROWER_LAMBDA,
    PAIR_LAMBDA,
    SCHEDULES,
    SELECTIONS,
    STARTS,
    STOPPING,
    WEIGHTINGS,
    LearnedMatchingOptions,
    WeightMatchingOptions,
    parse_lambda,
)

WM_DEFAULTS = WeightMatchingOptions()
#: Why learned matching stopped, as the commands print it.
STOPS = {"plateau": "stopped on a validation plateau", "max_steps": "reached --max-steps",
         "time_budget": "reached --time-budget"}


def add_alignment_options(p: argparse.ArgumentParser, residual: bool = True) -> None:
    g = p.add_argument_group("alignment")
    if residual:
        g.add_argument("--residual", choices=("orthogonal", "permutation", "none"),
                       default="orthogonal",
                       help="group of the residual-stream map (permutation: the paper's "
                       "ablation)")
    g.add_argument("--heads", choices=("inner", "circuit"), default="inner",
                   help="inner: keep head_dim, align each head's inner bases (stock export); "
                   "circuit: rewrite heads as QK/OV circuits first (glmc folder)")
    g.add_argument("--iters", type=int, default=WM_DEFAULTS.max_iter,
                   help="maximum weight-matching iterations")
    g.add_argument("--tol", type=float, default=WM_DEFAULTS.tol,
                   help="stop weight matching when an iteration lowers the distance by less "
                   "(relative)")
    g.add_argument("--stop", choices=STOPPING, default=WM_DEFAULTS.stop,
                   help="objective: stop at the first such iteration; fixed-point: only after "
                   "a full sweep that changed no assignment (slower, rarely a lower barrier)")
    g.add_argument("--select", choices=SELECTIONS, default=SELECTIONS[0],
                   help="with --data, which weight-matching iterate to keep: validation, the "
                   "one of lowest validation loss at learned matching's evaluation points "
                   "(its validation batches); last, the last")
    g.add_argument("--weighting", choices=WEIGHTINGS, default=WM_DEFAULTS.weighting,
                   help="how tensors count in weight matching's distance: tensor, each by its "
                   "mean squared difference (an embedding table as much as an MLP matrix); "
                   "layer, a bias as its layer's weight; none, every entry alike")
    g.add_argument("--token-counts", metavar="FILE",
                   help="token counts (.json list or {id: count}, .npy, or text): only "
                   "vocabulary rows of seen tokens count in the matching")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of learned matching (data order, λ draws); the image data split "
                   "is the models' (see --data-seed)")
    g.add_argument("--data-seed", type=int, default=None,
                   help="split seed of image data for models without a training record; "
                   "folders written by glmc train record theirs (glmc_train.json), which is "
                   "used, and a different --data-seed is refused (default: the record's, else "
                   "0; text ignores it)")


#: What --device moves to a GPU and what stays on the CPU (align, merge and barrier).
DEVICE_HELP = ("weight and learned matching run there: the products of the weights, the "
               "units' costs, the residual map's Procrustes and learned matching's steps; the "
               "assignments (scipy/lapx) stay on the CPU, and the results (the transform, B "
               "aligned or merged) come back to it, equal to the CPU's within rounding "
               "(docs/usage.md); activation matching and the universe frame's own steps stay "
               "on the CPU")


def add_device(p: argparse.ArgumentParser | argparse._ArgumentGroup, default: str = "cpu",
               what: str = "to compute") -> None:
    """--device: where the matching computes (``what``: what else runs there)."""
    p.add_argument("--device", default=default,
                   help=f"where {what}: cpu, cuda, cuda:N or auto (CUDA when available); "
                   + DEVICE_HELP)


def check_device(args: argparse.Namespace) -> None:
    """--device names a device this machine has (under torchrun: the CPU), checked before
    any model is read."""
    from glmc.devices import matching_device

    matching_device(args.device)


def add_correction(p: argparse.ArgumentParser) -> None:
    """--correction: what happens to the merged model's statistics (merge and barrier)."""
    p.add_argument("--correction", choices=CORRECTIONS, default="none",
                   help="after interpolating, on the training split of --data: reset: "
                   "recompute every BatchNorm's running statistics; repair: rescale every "
                   "unit to the interpolated endpoints' mean and spread (REPAIR); none: keep "
                   "the interpolated statistics")


def check_at_least(args: argparse.Namespace, **minimums: int) -> None:
    """Each option named by its dest (``batch_size``: --batch-size), when given, at least its
    minimum; checked before any work."""
    for dest, low in minimums.items():
        value = getattr(args, dest)
        if value is not None and value < low:
            raise GlmcError(f"--{dest.replace('_', '-')} must be at least {low}, got {value}")


def check_points(args: argparse.Namespace) -> None:
    """--points: the λ grid, from 2 (the endpoints alone) to MAX_POINTS (each point is one
    evaluation of the split); checked before any work."""
    check_at_least(args, points=2)
    if args.points > MAX_POINTS:
        raise GlmcError(f"--points must be at most {MAX_POINTS}, got {args.points} (each point "
                        "evaluates the whole split once)")


def add_tokenizer(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--tokenizer: how text is encoded when the model folders hold no glmc_tokenizer.json."""
    p.add_argument("--tokenizer", choices=("char", "gpt2"), default=None,
                   help="tokenizer for text data when the model folders hold no "
                   "glmc_tokenizer.json (char: the text's sorted characters; gpt2: GPT-2's "
                   "BPE); its vocabulary must be the model's")


def add_learned_options(p: argparse.ArgumentParser, many: bool = False) -> None:
    """Learned matching's options (``many``: also those of N models' refinement)."""
    d = LearnedMatchingOptions()
    g = p.add_argument_group("learned matching (method learned)")
    g.add_argument("--max-steps", "--steps", dest="steps", type=int, default=d.steps,
                   help="the most optimisation steps (default: %(default)s; the run stops "
                   "earlier on a validation plateau, see --patience)")
    g.add_argument("--time-budget", type=float, default=d.time_budget, metavar="SECONDS",
                   help="stop once the steps have taken this long (default: no limit); the "
                   "result is the best point validated by then")
    g.add_argument("--start", choices=STARTS, default=d.start,
                   help="where a pair's maps start: weight matching's solution (weight), "
                   "activation matching's on the training data (activation), or the one of "
                   "the two with the lower validation loss (best; default: %(default)s)"
                   + ("; N models start from their frame" if many else ""))
    g.add_argument("--lr", type=float, default=d.lr, help="AdamW peak learning rate")
    g.add_argument("--perm-lr-scale", type=float, default=d.perm_lr_scale,
                   help="learning rate of the permutation latents as a fraction of --lr "
                   "(small: permutations stay near weight matching's, as in the paper)")
    g.add_argument("--train-batch-size", type=int, default=d.batch_size,
                   help="global batch (split over the ranks under torchrun)")
    g.add_argument("--lam", default=d.lam,
                   help="λ distribution: uniform:LO,HI or gaussian:MEAN,STD (default: the "
                   f"paper's {PAIR_LAMBDA}; {NARROWER_LAMBDA} for a narrower B, whose barrier "
                   "lies off the midpoint)"
                   + (" (two models; N models draw λ from a Dirichlet, and from this on "
                      "--edge-fraction of the steps)" if many else ""))
    if many:
        g.add_argument("--dirichlet-alpha", type=float, default=d.dirichlet_alpha,
                       help="three models or more: λ ~ Dirichlet(α, ..., α) on the simplex "
                       "at each step (default: %(default)s, chosen on validation sets; the "
                       "paper's: 0.1)")
        g.add_argument("--edge-fraction", type=float, default=d.edge_fraction,
                       help="three models or more: the share of steps drawn instead on a "
                       "random pair's edge, at the pair's λ (--lam); chosen on validation sets")
        g.add_argument("--edge-focus", type=float, default=d.edge_focus,
                       help="three models or more: draw the edges of the pairs with the "
                       "highest barrier at the last validation more often, with odds "
                       "exp(FOCUS·(barrier − worst)), barriers in nats (0: every pair alike; "
                       "default: %(default)s)")
        g.add_argument("--free-frame", action=argparse.BooleanOptionalAction,
                       default=d.free_frame,
                       help="three models or more: the first model's map trains too, so that "
                       "every pair has both its maps moving (the result is still in the first "
                       "model's coordinates; default: free when every model has the first's "
                       "width, anchored on the first otherwise)")
    g.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="validate every this many steps: at the fixed λ = 0.5"
                   + ("; N models at the centroid and every pair's midpoint" if many else ""))
    g.add_argument("--patience", type=int, default=d.patience,
                   help="validations without a new best that make a plateau: the learning "
                   f"rate is cut by {d.cut:g} at each of the first {d.cuts}, and the next one "
                   "stops the run (default: %(default)s; with --schedule cosine, the first "
                   "stops it, and 0 never does)")
    g.add_argument("--schedule", choices=SCHEDULES, default=d.schedule,
                   help="learning rate after the warm-up: constant and cut at each plateau "
                   "(plateau), or a cosine decay to 0 at --max-steps (cosine; default: "
                   "%(default)s)")
    g.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="write the latents beside OUT every this many steps (atomically); 0: "
                   "only when the run ends, so a run killed before then leaves nothing to "
                   "--resume")
    g.add_argument("--resume", action="store_true",
                   help="continue a killed learned-matching run from its checkpoint")


def learned_options(args: argparse.Namespace, out: str | Path | None) -> LearnedMatchingOptions:
    """The options of ``args``; the checkpoint sits beside the output (``.OUT.learned.pt``)."""
    try:  # (the library's message names the value; the user typed --lam)
        if args.lam is not None:
            parse_lambda(args.lam)
    except GlmcError as e:
        raise GlmcError(f"--lam: {e}") from None
    d = LearnedMatchingOptions
    ckpt = None
    if out is not None:
        out = Path(out)
        ckpt = str(out.with_name(f".{out.name}.learned.pt"))
    return LearnedMatchingOptions(
        steps=args.steps, lr=args.lr, perm_lr_scale=args.perm_lr_scale,
        batch_size=args.train_batch_size, lam=args.lam,
        dirichlet_alpha=getattr(args, "dirichlet_alpha", d.dirichlet_alpha),
        edge_fraction=getattr(args, "edge_fraction", d.edge_fraction),
        edge_focus=getattr(args, "edge_focus", d.edge_focus),
        free_frame=getattr(args, "free_frame", d.free_frame),
        eval_every=args.eval_every, patience=args.patience, schedule=args.schedule,
        time_budget=args.time_budget, start=args.start, seed=args.seed,
        residual=getattr(args, "residual", "orthogonal"), checkpoint=ckpt,
        checkpoint_every=args.checkpoint_every, resume=args.resume)


def alignment_options(args: argparse.Namespace, vocab_size: int | None = None, **extra):
    """The :class:`glmc.methods.AlignOptions` the parsed options name (those the command
    has), plus ``extra`` (progress callbacks, data); token counts are read against
    ``vocab_size``."""
    from glmc.api import read_token_counts
    from glmc.methods import AlignOptions

    counts = None
    if getattr(args, "token_counts", None):
        counts = read_token_counts(args.token_counts, vocab_size or 0)
    fields = {"residual": getattr(args, "residual", "orthogonal"), "heads": args.heads,
              "max_iter": args.iters, "tol": args.tol, "stop": args.stop,
              "select": getattr(args, "select", SELECTIONS[0]), "weighting": args.weighting,
              "token_counts": counts, "data": getattr(args, "data", None),
              "tokenizer": getattr(args, "tokenizer", None), "data_seed": args.data_seed,
              "learned": learned_options(args, getattr(args, "out", None)),
              "correction": getattr(args, "correction", "none")}
    return AlignOptions(**(fields | extra))


def check_many_method(args: argparse.Namespace) -> None:
    """Three models or more: a method for N models (none, or weight matching, then learned)
    with its data and options, one process, ``--weights`` parsed into ``args.weight_list``,
    and the memory they need (at least) available."""
    import os

    from glmc.matching.options import MANY_METHODS, simplex_weights

    n = len(args.models)
    if args.align not in MANY_METHODS:
        raise GlmcError(f"{n} models are averaged as loaded (--align none) or aligned by "
                        "weight matching, then optionally learned matching (--align "
                        f"{', '.join(MANY_METHODS)}), not --align {args.align}")
    if args.align.startswith("learned") and not args.data:
        raise GlmcError(f"--align {args.align} reads training data: give --data")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise GlmcError(f"{n} models are aligned in one process: run without torchrun")
    learned_options(args, getattr(args, "out", None))
    args.weight_list = None
    if args.weights is not None:
        try:
            args.weight_list = [float(x) for x in args.weights.split(",")]
        except ValueError:
            raise GlmcError(f"--weights {args.weights!r}: give numbers separated by commas, "
                            "e.g. 0.5,0.25,0.25") from None
        simplex_weights(args.weight_list, n, "--weights")
    from glmc.io.outputs import check_models_memory

    check_models_memory(args.models, getattr(args, "frame", "mergemany"))
