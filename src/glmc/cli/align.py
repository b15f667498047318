"""glmc align A B -o OUT: B aligned to A (same function as B), its transform and a report."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch

from glmc.api import Alignment, align, read_token_counts
from glmc.cli.common import add_allow_pickle, add_json, console, emit_json
from glmc.cli.main import add_command
from glmc.io.atomic import atomic_dir
from glmc.io.folders import LoadedModel, load_model, write_json, write_model
from glmc.models.model import CanonicalModel
from glmc.verify import certify, folder_logits, random_inputs, same_interface

REPORT = "glmc_report.json"
TRANSFORM = "transform.safetensors"


def add_alignment_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("alignment")
    g.add_argument("--residual", choices=("orthogonal", "permutation", "none"),
                   default="orthogonal",
                   help="group of the residual-stream map (permutation: the paper's ablation)")
    g.add_argument("--heads", choices=("inner", "circuit"), default="inner",
                   help="inner: keep head_dim, align each head's inner bases (stock export); "
                   "circuit: rewrite heads as QK/OV circuits first (glmc folder)")
    g.add_argument("--iters", type=int, default=15, help="maximum coordinate-descent iterations")
    g.add_argument("--tol", type=float, default=1e-5,
                   help="stop when an iteration improves the objective by less (relative)")
    g.add_argument("--token-counts", metavar="FILE",
                   help="token counts (.json list or {id: count}, .npy, or text): only "
                        "vocabulary rows of seen tokens count in the matching")


def load_pair(args: argparse.Namespace) -> tuple[LoadedModel, LoadedModel]:
    a = load_model(args.a, allow_pickle=args.allow_pickle)
    b = load_model(args.b, allow_pickle=args.allow_pickle)
    same_interface(a.canonical.config, b.canonical.config, f"{args.a} vs {args.b}")
    return a, b


def run_alignment(args: argparse.Namespace, a: LoadedModel, b: LoadedModel) -> Alignment:
    counts = None
    if args.token_counts:
        counts = read_token_counts(args.token_counts, a.canonical.config.vocab_size)
    quiet = getattr(args, "json", False)
    ctx = contextlib.nullcontext() if quiet else console.status("weight matching...")
    with ctx as status:

        def progress(it: int, obj: float) -> None:
            if status is not None:
                status.update(f"weight matching: iteration {it}, objective {obj:.6f}")

        return align(a.canonical, b.canonical, residual=args.residual, heads=args.heads,
                     max_iter=args.iters, tol=args.tol, token_counts=counts,
                     progress=progress)


def write_output(out: str, model: CanonicalModel, stock: bool, extra: dict,
                 transform=None) -> tuple[str, Path]:
    """Write the model folder atomically with the report (and transform) beside the weights."""
    with atomic_dir(out) as tmp:
        fmt = write_model(tmp, model, stock=stock)
        if transform is not None:
            transform.save(tmp / TRANSFORM)
        write_json(tmp / REPORT, {"format": fmt, **extra})
    return fmt, Path(out)


def certify_folder(out: Path, reference: LoadedModel) -> dict:
    """max |Δ logits| between the folder as written and ``reference`` (float64)."""
    written = load_model(out)
    x = random_inputs(reference.canonical.config)
    return certify(folder_logits(reference), folder_logits(written), x).to_json()


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "align",
        "Align model B to model A modulo weight symmetries (data-free weight matching) and "
        "write B aligned (the same function as B) with the transform and a report.",
        "glmc align runs/gpt-a runs/gpt-b -o runs/b-aligned --residual orthogonal")
    p.add_argument("a", help="reference model folder (Hugging Face or glmc)")
    p.add_argument("b", help="model folder to align to A")
    p.add_argument("-o", "--out", required=True, help="output folder (written atomically)")
    p.add_argument("--method", choices=("weight",), default="weight", help="alignment method")
    p.add_argument("--no-stock", action="store_true",
                   help="always write a glmc folder, even when the stock class could hold it")
    add_alignment_options(p)
    add_json(p)
    add_allow_pickle(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    a, b = load_pair(args)
    al = run_alignment(args, a, b)
    report = {"command": "align", "a": str(args.a), "b": str(args.b), "method": args.method,
              "residual": args.residual, "heads": args.heads,
              "matching": al.match.to_json() if al.match else None}
    fmt, out = write_output(args.out, al.aligned.to(torch.float32), not args.no_stock, report,
                            al.transform)
    report["certificate"] = certify_folder(out, b)
    report["seconds"] = round(time.perf_counter() - t0, 3)
    report["format"] = fmt
    write_json(out / REPORT, report)
    ok = report["certificate"]["equal"]
    if args.json:
        emit_json(report)
    else:
        m = al.match
        last = m.trace[-1]["normalized"] if m and m.trace else float("nan")
        print(f"aligned {args.b} to {args.a}: {len(m.trace) if m else 0} iterations, "
              f"objective {m.init_objective / m.norm if m and m.norm else 0:.4f} -> "
              f"{last:.4f}")
        print(f"wrote {out} ({fmt}); aligned B vs B: max |Δ logits| = "
              f"{report['certificate']['max_abs_diff']:.3e} ({'ok' if ok else 'MISMATCH'})")
    return 0 if ok else 1
