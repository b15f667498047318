"""glmc merge A B -o OUT: the model alpha·A + (1 − alpha)·π(B); glmc merge M1 ... Mn -o OUT:
the N models in one frame (MergeMany), averaged."""

from __future__ import annotations

import argparse
import time

from glmc.cli.align import (
    alignment_progress,
    check_pair_options,
    drop_checkpoint,
    load_pair,
)
from glmc.cli.common import (
    add_allow_pickle,
    add_json,
    add_out,
    emit_json,
    print_notes,
    print_warnings,
)
from glmc.cli.main import add_command
from glmc.cli.options import (
    STOPS,
    add_alignment_options,
    add_correction,
    add_device,
    add_learned_options,
    add_tokenizer,
    alignment_options,
    check_at_least,
    check_device,
    check_many_method,
)
from glmc.errors import GlmcError
from glmc.matching.options import FRAMES
from glmc.methods import METHODS


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "merge",
        "Merge two models: alpha·A + (1 − alpha)·π(B), with B aligned to A first "
        "(--align weight or learned) or not (--align none: the stock weights averaged as "
        "loaded; --align canonical: averaged in canonical coordinates). alpha = 1 is A. "
        "Three models or more are averaged as loaded with --align none (the vanilla "
        "baseline), or brought into one frame by weight matching (--frame "
        "mergemany: each in turn aligned to the mean of the others; star: each to the "
        "first; universe: every map at once, by Frank-Wolfe), refined by learned matching over "
        "the simplex with --align learned, and averaged with --weights (uniform by default), "
        "in M1's coordinates.",
        "glmc merge runs/gpt-a runs/gpt-b -o runs/merged --alpha 0.5 --align weight\n"
        "  glmc merge runs/a runs/b runs/c -o runs/merged3 --weights 0.5,0.25,0.25\n"
        "  glmc merge runs/a runs/b runs/c -o runs/vanilla3 --align none\n"
        "  glmc merge runs/a runs/b runs/c -o runs/merged3 --frame universe\n"
        "  glmc merge runs/a runs/b runs/c -o runs/merged3 --align learned --data shakespeare")
    p.add_argument("models", nargs="+", metavar="M",
                   help="model folders: A B (alpha = 1 is A), or M1 M2 ... Mn")
    add_out(p, "output folder (written atomically)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of model A (two models)")
    p.add_argument("--weights", default=None, metavar="W1,...,Wn",
                   help="three models or more: their weights, >= 0 and summing to 1 "
                   "(default: uniform)")
    p.add_argument("--frame", choices=FRAMES, default="mergemany",
                   help="three models or more: how they are brought into one frame "
                   "(mergemany: each in turn to the mean of the others; star: each to the "
                   "first; universe: every map at once, by Frank-Wolfe)")
    p.add_argument("--rounds", type=int, default=10,
                   help="three models or more: MergeMany's most rounds")
    p.add_argument("--align", choices=tuple(METHODS), default="weight",
                   help="how to align B to A before averaging. none: no alignment, the "
                   "paper's vanilla average of the stock weights as loaded (Hugging Face "
                   "folders; written as is in the stock class; also of three models or "
                   "more, with --weights); canonical: no alignment, "
                   "averaging in canonical coordinates (after the exact RMSNorm rewrite); "
                   "the other methods align first (see glmc align --help)")
    p.add_argument("--data", help="training data for --align activation or learned and for "
                   "--correction (name or path)")
    add_correction(p)
    add_tokenizer(p)
    p.add_argument("--no-stock", action="store_true",
                   help="always write a glmc folder, even when the stock class could hold it")
    add_alignment_options(p)
    add_device(p)
    add_learned_options(p, many=True)
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks that need no torch, before it loads (see :func:`check_pair_options`)."""
    if len(args.models) < 2:
        raise GlmcError(f"merge needs at least two models, got {len(args.models)}")
    args.a, args.b = args.models[:2]
    if len(args.models) > 2:
        check_many(args)
        return
    if args.weights is not None:
        raise GlmcError("--weights is for three models or more; two are merged with --alpha")
    if not 0.0 <= args.alpha <= 1.0:  # (the library checks it again)
        raise GlmcError(f"--alpha must lie in [0, 1], got {args.alpha}")
    if args.align == "none" and args.heads != "inner":
        raise GlmcError("--heads circuit does not apply to --align none (the stock weights "
                        "are averaged as loaded); use --align canonical --heads circuit")
    check_pair_options(args)


def check_many(args: argparse.Namespace) -> None:
    """Three models or more: a method for N models, its data given, the weights parsed, OUT
    free."""
    from glmc.io.outputs import check_output, model_bytes, stored_params

    check_many_method(args)
    check_at_least(args, iters=1, rounds=1)
    check_output(args.out, model_bytes(stored_params(args.models[0])), force=args.force,
                 inputs=tuple(args.models))


def run(args: argparse.Namespace) -> int:
    from glmc.distributed import process_group

    if len(args.models) > 2:
        check_device(args)
        return _run_many(args)
    with process_group():
        check_device(args)
        return _run(args)


def _run_many(args: argparse.Namespace) -> int:
    from glmc.api import merge_many
    from glmc.io.folders import load_model

    t0 = time.perf_counter()
    models = [load_model(m, allow_pickle=args.allow_pickle) for m in args.models]
    if args.align != "none":
        for m in models:
            m.stock_state = None  # (merged in canonical form)
    with alignment_progress(args, many=True) as callbacks:
        options = alignment_options(args, getattr(models[0].canonical.config, "vocab_size",
                                                  None), device=args.device, **callbacks)
        out = merge_many(models, weights=args.weight_list, frame=args.frame,
                         method=args.align, max_rounds=args.rounds, options=options)
    report = out.save(args.out, force=args.force, stock=not args.no_stock,
                      report={"models": [str(m) for m in args.models]}, started=t0)
    drop_checkpoint(args)
    print_warnings(report.get("warnings", []))
    if args.json:
        emit_json(report)
        return 0
    w = out.settings["weights"]
    frame = out.frame
    if frame.method == "none":  # (the vanilla average: no frame)
        print(f"wrote {args.out} ({report['format']}): "
              + " + ".join(f"{x:g}·M{i + 1}" for i, x in enumerate(w)))
    else:
        print(f"wrote {args.out} ({report['format']}): "
              + " + ".join(f"{x:g}·π{i + 1}(M{i + 1})" for i, x in enumerate(w))
              + f"; frame {frame.method}, {len(frame.rounds)} round(s)"
              + ("" if frame.converged else " (not converged)"))
    cycle = out.settings.get("cycle_error_pairwise")
    if cycle:
        print(f"pairwise weight matching vs the frame: cycle-consistency error "
              f"{cycle['mean']:.3g} (mean), {cycle['max']:.3g} (max)")
    learned = out.settings.get("learned")
    if learned:
        print(f"learned refinement: {learned['steps']} steps "
              f"({STOPS[learned['stop_reason']]}), validation barrier estimate "
              f"{learned['start_barrier_estimate']:.4f} -> {learned['barrier_estimate']:.4f} "
              f"(best step {learned['best_step']})")
    print_notes(report)
    return 0


def _run(args: argparse.Namespace) -> int:
    from glmc.api import merge_pair
    from glmc.distributed import is_main

    t0 = time.perf_counter()
    a, b = load_pair(args, keep_stock=args.align == "none")
    if args.align != "none":
        b.stock_state = None  # (the merge needs both in canonical form only)
    with alignment_progress(args) as callbacks:
        options = alignment_options(args, getattr(a.canonical.config, "vocab_size", None),
                                    device=args.device, **callbacks)
        out = merge_pair(a, b, alpha=args.alpha, method=args.align, options=options)
    if not is_main():
        return 0
    report = out.save(args.out, force=args.force, stock=not args.no_stock,
                      report={"a": str(args.a), "b": str(args.b)}, started=t0)
    drop_checkpoint(args)
    print_warnings(report.get("warnings", []))
    if args.json:
        emit_json(report)
    else:
        print(f"wrote {args.out} ({report['format']}): {args.alpha}·A + {1 - args.alpha:g}·"
              f"{'π(B)' if out.alignment is not None else 'B'}")
        print_notes(report)
    return 0
