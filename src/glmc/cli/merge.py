"""glmc merge A B -o OUT: the model alpha·A + (1 − alpha)·π(B)."""

from __future__ import annotations

import argparse
import time

from glmc.cli.align import drop_checkpoint, load_pair, run_alignment, write_output
from glmc.cli.common import add_allow_pickle, add_json, add_out, emit_json
from glmc.cli.main import add_command
from glmc.cli.options import (
    add_alignment_options,
    add_correction,
    add_learned_options,
    add_tokenizer,
)
from glmc.defaults import MERGE_METHODS
from glmc.errors import GlmcError


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
    p.add_argument("--align", choices=MERGE_METHODS, default="weight",
                   help="how to align B to A before averaging. none: no alignment, the "
                   "paper's vanilla average of the stock weights as loaded (Hugging Face "
                   "folders; written as is in the stock class); canonical: no alignment, "
                   "averaging in canonical coordinates (after the exact RMSNorm rewrite); "
                   "weight, activation, learned: align first")
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from glmc.distributed import process_group

    with process_group():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch

    from glmc.api import (
        correction_data,
        interpolate,
        prepare_pair,
        statistics_batches,
        stock_pair,
        write_report,
    )
    from glmc.correction import correct, statistics_note
    from glmc.distributed import is_main

    if not 0.0 <= args.alpha <= 1.0:
        raise GlmcError(f"--alpha must lie in [0, 1], got {args.alpha}")
    if args.align == "none" and args.heads != "inner":
        raise GlmcError("--heads circuit does not apply to --align none (the stock weights "
                        "are averaged as loaded); use --align canonical --heads circuit")
    t0 = time.perf_counter()
    a, b = load_pair(args, keep_stock=args.align == "none")
    data = None
    if args.correction != "none":  # (checked before any matching)
        data = correction_data(a, b, args.correction, args.data, args.tokenizer, args.data_seed)
        args.data = data
    if args.align != "none":
        b.stock_state = None  # (the merge needs both in canonical form only)
    report: dict = {"command": "merge", "a": str(args.a), "b": str(args.b),
                    "alpha": args.alpha, "align": args.align, "correction": args.correction}
    transform = stock_state = None
    if args.align == "none" and a.canonical.family.canonical_is_stock:
        ca, cb = prepare_pair(a, b)  # (the weights as loaded are the canonical ones)
        if not is_main():
            return 0
    elif args.align == "none":  # the stock weights averaged as loaded, written as they are
        ca, _ = prepare_pair(a, b)  # (the checks, and the shared tokenizer)
        pair = stock_pair(a, b)
        if not is_main():
            return 0
        stock_state = (pair.hf_config, pair.state_at(args.alpha))
        merged = pair.model_at(args.alpha).with_files(ca.files)
    elif args.align == "canonical":
        ca, cb = prepare_pair(a, b, args.heads)
        if not is_main():
            return 0
    else:
        al = run_alignment(args, a, b, args.align)
        if not is_main():
            return 0
        ca, cb, transform = al.a, al.aligned, al.transform
        report |= {"residual": args.residual, "heads": args.heads,
                   "matching": al.match.to_json() if al.match else None,
                   "learned": al.learned.to_json() if al.learned else None}
    if args.align != "none" or ca.family.canonical_is_stock:
        merged = ca.with_state(interpolate(ca.state, cb.state, args.alpha))
    if data is not None:
        merged = correct(merged, ca, cb, args.alpha, statistics_batches(ca, data),
                         args.correction)
        stock_state = None  # (the corrected model, not the stock average, is written)
    note = statistics_note(merged, args.correction)
    if note is not None:
        report["statistics"] = note
    fmt, out = write_output(args.out, merged.to(torch.float32), not args.no_stock, report,
                            transform, stock_state)
    report["format"] = fmt
    drop_checkpoint(args, args.align)
    report["seconds"] = round(time.perf_counter() - t0, 3)
    write_report(out, report)
    if args.json:
        emit_json(report)
    else:
        print(f"wrote {out} ({fmt}): {args.alpha}·A + {1 - args.alpha:g}·"
              f"{'π(B)' if transform is not None else 'B'}")
    return 0
