"""glmc barrier A B --data D: loss and accuracy barriers on the line between A and aligned B."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from glmc.cli.common import add_allow_pickle, add_json, emit_json, print_warnings
from glmc.cli.main import add_command
from glmc.cli.options import (
    add_alignment_options,
    add_correction,
    add_device,
    add_learned_options,
    add_tokenizer,
    alignment_options,
    check_at_least,
    check_many_method,
    check_points,
    learned_options,
)
from glmc.data.catalog import DATASETS
from glmc.defaults import (
    DEFAULT_IMAGE_BATCH,
    DEFAULT_TEXT_TOKENS,
    MAX_POINTS,
    TEXT_LOGITS_BUDGET,
)
from glmc.errors import GlmcError
from glmc.matching.options import FRAMES
from glmc.methods import METHODS, get_method

if TYPE_CHECKING:
    from rich.console import Console

    from glmc.barrier import BarrierReport

DEFAULT_METHODS = ("none", "weight")


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "barrier",
        "Measure the loss (and accuracy) barrier on the straight line between A and B, for "
        "each alignment method: θ(λ) = λ·A + (1 − λ)·π(B) on a grid of λ. With three "
        "models or more: all brought into one frame by weight matching (--frame; --align "
        "learned refines it on the simplex), the "
        "merged model (uniform, and --weights) beside each model and their mean, and every "
        "pair's barrier in the joint frame beside its barrier aligned on its own; --align "
        "none adds the vanilla rows (the weights averaged as loaded, every pair's barrier "
        "unaligned), or gives them alone.",
        "glmc barrier runs/vit-a runs/vit-b --data mnist5k --align none --align weight "
        "--plot barrier.png\n  glmc barrier runs/a runs/b runs/c --data mnist5k\n"
        "  glmc barrier runs/a runs/b runs/c --data mnist5k --align learned\n"
        "  glmc barrier runs/a runs/b runs/c --data mnist5k --align none --align weight")
    p.add_argument("models", nargs="+", metavar="M",
                   help="model folders A (λ = 1, the reference) and B (λ = 0, aligned to "
                   "A), or M1 M2 ... Mn")
    p.add_argument("--weights", default=None, metavar="W1,...,Wn",
                   help="three models or more: weights of a second merged model")
    p.add_argument("--frame", choices=FRAMES, default="mergemany",
                   help="three models or more: how they are brought into one frame "
                   "(mergemany: each in turn to the mean of the others; star: each to the "
                   "first; universe: every map at once, by Frank-Wolfe)")
    p.add_argument("--data", required=True,
                   help=f"dataset name ({', '.join(DATASETS)}) or a text file, a .tsv of "
                   "labelled text (LABEL<TAB>TEXT, for sequence classifiers), .npz or IDX "
                   "folder; text is encoded with the models' glmc_tokenizer.json (or "
                   "tokenizer.json)")
    p.add_argument("--align", action="append", metavar="METHOD", dest="methods",
                   help="alignment method, repeatable (available: "
                   f"{', '.join(METHODS)}; default: {' and '.join(DEFAULT_METHODS)}). "
                   "none: the paper's vanilla average of the stock weights as loaded (Hugging "
                   "Face folders); canonical: averaging in canonical coordinates (after the "
                   "exact RMSNorm rewrite), no alignment")
    p.add_argument("--points", type=int, default=11,
                   help=f"λ grid size, evenly spaced in [0, 1]: 2 to {MAX_POINTS} (each point "
                   "evaluates the split once; 2, the endpoints alone, gives a barrier of 0)")
    p.add_argument("--split", choices=("train", "val", "test"), default="test",
                   help="the evaluated split")
    g = p.add_argument_group("evaluation")
    g.add_argument("--context", type=int, default=None,
                   help="text window length (default: the model's n_positions)")
    g.add_argument("--batch-size", type=int, default=None,
                   help=f"windows or images per batch (default: {DEFAULT_IMAGE_BATCH} images; for "
                   f"text as many windows as keep the logits under {TEXT_LOGITS_BUDGET:,} "
                   "floats, at most 64)")
    g.add_argument("--max-batches", type=int, default=None,
                   help="evaluate at most this many batches, 0 for the whole split (default: "
                   f"whole split for images, the first {DEFAULT_TEXT_TOKENS:,} tokens for text)")
    add_device(g, "auto", "two models are evaluated and aligned")
    add_tokenizer(g)
    add_alignment_options(p, residual=False)
    add_correction(p)
    add_learned_options(p, many=True)
    p.add_argument("--plot", metavar="FILE.png",
                   help="write the curves of every method as a PNG")
    p.add_argument("--title", help="plot title (default: A, B, data and split)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing --plot FILE (without it, one is refused before "
                   "any work)")
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run, check=check)


#: Under a table whose barriers have no standard error (the evaluation is one batch).
NO_SE = ("(one evaluation batch: no standard error to give; a --batch-size under the split's "
         "windows or images gives one)")


def _fmt(x: float | None, percent: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "n/a" if x is None else str(x)
    return f"{100 * x:.2f}" if percent else f"{x:.4f}"


def print_table(report: BarrierReport, out: Console) -> None:
    """Method, loss barrier, accuracy barrier, endpoint losses (and accuracies)."""
    from rich.table import Table

    cls = report.is_classifier
    t = Table(title=f"{report.split} barriers, {len(report.lambdas)} points, "
                    f"{report.count:,} {report.targets}")
    t.add_column("method", no_wrap=True)
    with_se = any(m.loss_barrier_se is not None for m in report.methods.values())
    t.add_column("loss barrier (± s.e.)" if with_se else "loss barrier", justify="right",
                 no_wrap=True)
    if cls:
        t.add_column("acc. barrier (pts)", justify="right", no_wrap=True)
    t.add_column("loss A (λ=1)", justify="right")
    t.add_column("loss B (λ=0)", justify="right")
    if cls:
        t.add_column("acc. A (%)", justify="right")
        t.add_column("acc. B (%)", justify="right")
    t.add_column("max at λ", justify="right")
    t.add_column("seconds", justify="right")
    for name, m in report.methods.items():
        row = [name, _pm(m.loss_barrier, m.loss_barrier_se, 4)]
        if cls:
            row.append(_fmt(m.acc_barrier, percent=True))
        row += [_fmt(m.loss_a), _fmt(m.loss_b)]
        if cls:
            row += [_fmt(m.acc_a, True), _fmt(m.acc_b, True)]
        where = f"{m.loss_barrier_lambda:g}" if m.loss_barrier > 0 else "-"
        row += [where, f"{m.align_seconds + m.eval_seconds:.1f}"]
        t.add_row(*row)
    out.print(t)
    if not with_se:
        out.print(NO_SE)
    if report.scoring:
        out.print(f"({report.scoring})")


def tokenizer_warnings(args: argparse.Namespace, a: Any, b: Any, data: Any) -> list[str]:
    """A named text dataset read with its own tokenizer, the folders holding none: the
    vocabulary sizes agree (checked), but only training on that dataset makes the ids the
    models'."""
    from glmc.data import TOKENIZER_FILE, TextDataset

    if (args.tokenizer is not None or not isinstance(data, TextDataset)
            or any(TOKENIZER_FILE in m.canonical.files for m in (a, b))):
        return []
    return [f"{args.a} and {args.b} hold no {TOKENIZER_FILE}; {args.data} was encoded with "
            f"its own {data.tokenizer.kind} tokenizer, whose size matches the models' "
            "vocabulary: right only if they were trained on it"]


def check(args: argparse.Namespace) -> None:
    """The checks that need no torch, before it loads: the methods, the option values and
    the --plot file."""
    from glmc.io.outputs import SMALL_OUTPUT, check_output, check_plot_path

    if len(args.models) < 2:
        raise GlmcError(f"barrier needs at least two models, got {len(args.models)}")
    args.a, args.b = args.models[:2]
    if len(args.models) > 2:
        methods = list(dict.fromkeys(args.methods or ["weight"]))
        aligning = [m for m in methods if m != "none"]
        if len(aligning) > 1 or args.plot:
            raise GlmcError(f"{len(args.models)} models are brought into one frame by one "
                            "method: give at most one --align besides --align none (the "
                            "vanilla rows), and no --plot")
        args.methods, args.align = methods, (aligning or ["none"])[0]
        check_many_method(args)
    elif args.weights is not None:
        raise GlmcError("--weights is for three models or more")
    for name in dict.fromkeys(args.methods or DEFAULT_METHODS):
        get_method(name)
    check_points(args)
    check_at_least(args, iters=1, batch_size=1, context=1, max_batches=0)
    learned_options(args, None)
    if args.plot:
        check_plot_path(args.plot)
        check_output(args.plot, SMALL_OUTPUT, force=args.force, option="--plot")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from glmc.barrier import prepare_barrier, run_barrier
    from glmc.cli.common import console
    from glmc.evaluate import resolve_device
    from glmc.io.folders import load_model
    from glmc.io.outputs import output_errors
    from glmc.plots import plot_barriers

    if len(args.models) > 2:
        return run_many(args)
    methods = list(dict.fromkeys(args.methods or DEFAULT_METHODS))
    resolve_device(args.device)
    a = load_model(args.a, allow_pickle=args.allow_pickle)
    b = load_model(args.b, allow_pickle=args.allow_pickle)
    # Every check on the data before any long work (run_barrier repeats them, and reads the
    # data again: a second or so, and the report gets the split seed it used).
    _, _, data, _ = prepare_barrier(a, b, args.data, methods=methods, split=args.split,
                                    context=args.context, tokenizer=args.tokenizer,
                                    data_seed=args.data_seed)
    options = alignment_options(args, getattr(a.canonical.config, "vocab_size", None),
                                seed=args.seed)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    # A bar per method, advanced at every point, on a terminal (off one a transient bar shows
    # nothing and leaves a blank line on stderr; under --json stderr keeps to warnings).
    with Progress(*columns, console=console, transient=True,
                  disable=args.json or not console.is_terminal) as bar:
        tasks = {m: bar.add_task(f"{m}: waiting", total=args.points) for m in methods}

        def progress(method: str, stage: str, done: int, total: int) -> None:
            if stage == "align":
                what = "aligning" if done < total else "evaluating"
                bar.update(tasks[method], description=f"{method}: {what}")
            else:
                bar.update(tasks[method], completed=done, description=f"{method}: evaluating")

        report = run_barrier(a, b, args.data, methods=methods, points=args.points,
                             split=args.split, context=args.context, batch_size=args.batch_size,
                             max_batches=args.max_batches, device=args.device,
                             tokenizer=args.tokenizer, seed=args.seed,
                             data_seed=args.data_seed, options=options, progress=progress)
    report.data = str(args.data)
    report.warnings[:0] = tokenizer_warnings(args, a, b, data)
    print_warnings(report.warnings)
    plot_path = None
    if args.plot:
        with output_errors(args.plot):
            plot_path = plot_barriers(report, args.plot, title=args.title)
    if args.json:
        out = report.to_json()
        out["plot"] = str(plot_path) if plot_path else None
        emit_json(out)
    else:
        print_table(report, Console() if sys.stdout.isatty() else Console(width=120))
        if plot_path:
            print(f"wrote {plot_path}")
    return 0


def run_many(args: argparse.Namespace) -> int:
    """Three models or more (see :mod:`glmc.many`): a table of the models and the merges,
    then one of the pairs."""
    from rich.console import Console
    from rich.table import Table

    from glmc.io.folders import load_model
    from glmc.many import many_barrier

    models = [load_model(m, allow_pickle=args.allow_pickle) for m in args.models]
    options = alignment_options(args, getattr(models[0].canonical.config, "vocab_size", None),
                                seed=args.seed)
    report = many_barrier(models, args.data, weights=args.weight_list, frame=args.frame,
                          method=args.align, vanilla="none" in args.methods,
                          points=args.points, split=args.split, max_batches=args.max_batches,
                          batch_size=args.batch_size, tokenizer=args.tokenizer,
                          options=options)
    print_warnings(report.warnings)
    if args.json:
        emit_json(report.to_json())
        return 0
    out = Console() if sys.stdout.isatty() else Console(width=120)
    acc = report.endpoints[0]["accuracy"] is not None
    how = ", ".join((["vanilla"] if report.vanilla else [])
                    + ([report.frame["method"]] if report.frame else []))
    t = Table(title=f"{report.split}: {len(report.models)} models and their merge "
                    f"({how}), {report.count:,} {report.targets}")
    t.add_column("model")
    t.add_column("loss", justify="right")
    if acc:
        t.add_column("acc. (%)", justify="right")

    def row(name: str, r: dict) -> None:
        t.add_row(name, _fmt(r["loss"]), *([_fmt(r["accuracy"], True)] if acc else []))

    for name, r in zip(report.models, report.endpoints, strict=True):
        row(name, r)
    t.add_row("mean of the models", _fmt(report.mean_loss), *([""] if acc else []))
    if report.vanilla is not None:
        row("vanilla average (none), uniform weights", report.vanilla["merged"])
        if report.vanilla["merged_weighted"] is not None:
            row(f"vanilla average (none), weights {args.weights}",
                report.vanilla["merged_weighted"])
    if report.merged is not None:
        row("merged, uniform weights", report.merged)
    if report.merged_weighted is not None:
        row(f"merged, weights {args.weights}", report.merged_weighted)
    out.print(t)
    print_pairs(report, out)
    return 0


def print_pairs(report: Any, out: Console) -> None:
    """The pairs of a :class:`~glmc.many.ManyReport`: the vanilla barrier (none), the barrier
    in the joint frame, the pair aligned alone, the excess and the ratio (those measured)."""
    from rich.table import Table

    columns = {"pair": lambda r: f"{r['pair'][0]}-{r['pair'][1]}"}
    if report.vanilla is not None:
        columns["vanilla (none)"] = lambda r: _pm(r["barrier_vanilla"],
                                                  r["barrier_vanilla_se"], 4)
    if report.merged is not None:
        columns |= {
            "joint frame": lambda r: _pm(r["barrier_joint"], r["barrier_joint_se"], 4),
            "pair alone": lambda r: _pm(r["barrier_pairwise"], r["barrier_pairwise_se"], 4),
            "joint − alone": lambda r: _pm(r["excess"], r["excess_se"], 4),
            "ratio": lambda r: _pm(r["ratio"], r["ratio_se"], 2)}
    with_se = any(v is not None for r in report.pairs for k, v in r.items()
                  if k.endswith("_se"))
    p = Table(title="pairwise loss barriers: " + ", ".join(
        (["as loaded (vanilla)"] if report.vanilla is not None else [])
        + (["in the joint frame, and the pair aligned alone"] if report.merged is not None
           else [])) + ("; ± a standard error over the evaluation batches" if with_se else ""))
    for col in columns:
        p.add_column(col, justify="right")
    for r in report.pairs:
        p.add_row(*(cell(r) for cell in columns.values()))
    out.print(p)
    if not with_se:
        out.print(NO_SE)


def _pm(x: float | None, se: float | None, digits: int) -> str:
    """``x ± se`` (``x`` alone without a standard error; "-" without ``x``)."""
    if x is None:
        return "-"
    return f"{x:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")
