"""glmc merge A B -o OUT: the model alpha·A + (1 − alpha)·π(B)."""

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
    add_alignment_options,
    add_correction,
    add_learned_options,
    add_tokenizer,
    alignment_options,
)
from glmc.errors import GlmcError
from glmc.methods import METHODS


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "merge",
        "Merge two models: alpha·A + (1 − alpha)·π(B), with B aligned to A first "
        "(--align weight or learned) or not (--align none: the stock weights averaged as "
        "loaded; --align canonical: averaged in canonical coordinates). alpha = 1 is A.",
        "glmc merge runs/gpt-a runs/gpt-b -o runs/merged --alpha 0.5 --align weight")
    p.add_argument("a", help="model folder A (alpha = 1)")
    p.add_argument("b", help="model folder B (alpha = 0)")
    add_out(p, "output folder (written atomically)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of model A")
    p.add_argument("--align", choices=tuple(METHODS), default="weight",
                   help="how to align B to A before averaging. none: no alignment, the "
                   "paper's vanilla average of the stock weights as loaded (Hugging Face "
                   "folders; written as is in the stock class); canonical: no alignment, "
                   "averaging in canonical coordinates (after the exact RMSNorm rewrite); "
                   "the other methods align first (see glmc align --help)")
    p.add_argument("--data", help="training data for --align activation or learned and for "
                   "--correction (name or path)")
    add_correction(p)
    add_tokenizer(p)
    p.add_argument("--no-stock", action="store_true",
                   help="always write a glmc folder, even when the stock class could hold it")
    add_alignment_options(p)
    add_learned_options(p)
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks that need no torch, before it loads (see :func:`check_pair_options`)."""
    if not 0.0 <= args.alpha <= 1.0:  # (the library checks it again)
        raise GlmcError(f"--alpha must lie in [0, 1], got {args.alpha}")
    if args.align == "none" and args.heads != "inner":
        raise GlmcError("--heads circuit does not apply to --align none (the stock weights "
                        "are averaged as loaded); use --align canonical --heads circuit")
    check_pair_options(args)


def run(args: argparse.Namespace) -> int:
    from glmc.distributed import process_group

    with process_group():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from glmc.api import merge_pair
    from glmc.distributed import is_main

    t0 = time.perf_counter()
    a, b = load_pair(args, keep_stock=args.align == "none")
    if args.align != "none":
        b.stock_state = None  # (the merge needs both in canonical form only)
    with alignment_progress(args) as callbacks:
        options = alignment_options(args, getattr(a.canonical.config, "vocab_size", None),
                                    **callbacks)
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
