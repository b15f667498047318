"""glmc verify A B: do two model folders compute the same function?"""

from __future__ import annotations

import argparse

from glmc.cli.common import add_allow_pickle, add_json, emit_json
from glmc.cli.main import add_command
from glmc.cli.options import check_at_least
from glmc.errors import GlmcError


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "verify", "Run two model folders on the same random inputs and report "
                    "max |Δ logits|; exit 0 when within tolerance, 1 when not.",
                    "glmc verify runs/gpt-a runs/aligned-b --json")
    p.add_argument("a", help="model folder (Hugging Face or glmc)")
    p.add_argument("b", help="model folder (Hugging Face or glmc)")
    p.add_argument("--tol", type=float, default=None,
                   help="absolute tolerance (default: 1e-4 x max(1, max |logits of A|))")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--batch", type=int, default=4, help="number of random inputs")
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from glmc.io.folders import load_model
    from glmc.verify import certify, folder_logits, random_inputs, same_interface

    check_at_least(args, batch=1)
    if args.tol is not None and not args.tol >= 0:
        raise GlmcError(f"--tol must be >= 0, got {args.tol}")
    a = load_model(args.a, allow_pickle=args.allow_pickle)
    b = load_model(args.b, allow_pickle=args.allow_pickle)
    same_interface(a.canonical.config, b.canonical.config, f"{args.a} vs {args.b}")
    x = random_inputs(a.canonical.config, n=args.batch, seed=args.seed)
    cert = certify(folder_logits(a), folder_logits(b), x, tol=args.tol)
    if args.json:
        emit_json(cert.to_json())
    else:
        verdict = "same function" if cert.equal else "DIFFERENT functions"
        print(f"max |Δ logits| = {cert.max_abs_diff:.3e} (tol {cert.tol:.1e}): {verdict}")
    return 0 if cert.equal else 1
