"""glmc canonicalize IN -o OUT: rewrite a model in canonical form and certify it."""

from __future__ import annotations

import argparse

from glmc.cli.common import add_allow_pickle, add_json, add_out, emit_json, print_notes
from glmc.cli.main import add_command


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "canonicalize",
        "Rewrite a model with LayerNorm as RMSNorm (writers centred, norm affine folded into "
        "readers), optionally with attention in circuit form; write it as a glmc folder (or "
        "back to the stock class with --stock) and report max |Δ logits| against the input.",
        "glmc canonicalize runs/gpt-a -o runs/gpt-a-canon --attention circuit")
    p.add_argument("model", help="model folder (Hugging Face or glmc)")
    add_out(p, "output folder (replaced atomically)")
    p.add_argument("--attention", choices=("heads", "circuit"), default="heads",
                   help="keep heads (head_dim) or rewrite each head as its QK/OV circuits")
    p.add_argument("--stock", action="store_true",
                   help="write the stock class when the result is representable")
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """OUT, before torch loads: neither the input, and free (or --force), writable and with
    room for the model's size."""
    from glmc.io.outputs import check_output, model_bytes, stored_params

    check_output(args.out, model_bytes(stored_params(args.model)), force=args.force,
                 inputs=(args.model,))


def run(args: argparse.Namespace) -> int:
    from glmc.api import save_canonical
    from glmc.io.folders import load_model

    m = load_model(args.model, allow_pickle=args.allow_pickle)
    report = save_canonical(m, args.out, attention=args.attention, stock=args.stock,
                            force=args.force)
    cert = report["certificate"]
    if args.json:
        emit_json(report)
    else:
        print(f"wrote {args.out} ({report['format']}); max |Δ logits| vs input = "
              f"{cert['max_abs_diff']:.3e}")
        print_notes(report)
    return 0 if cert["equal"] else 1
