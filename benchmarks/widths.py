"""A narrower GPT-2 aligned to a wider one: the barrier against the width ratio.

A is the demo's GPT-2 (3 layers, d = 128, 4 heads, seed 0, from the demo's cache); each B is
the same recipe at residual width d_A/2, d_A/4, d_A/8 (MLP 4·d, heads of A's dimension where
they fit: 2 heads at d = 64, 1 below), seed 1. B is embedded exactly into A's shapes (zero
units and heads, the stream scaled; glmc.families.transformer.widen), then aligned by weight
matching and by learned matching (on the training split), and the loss barrier of the line
between A and B at A's width measured on ``--split`` as ``glmc barrier`` does. Prints a
table, writes JSON and (on the test split) a plot of the barriers against d_B/d_A.

``--variants`` screens choices on the validation split, each ``FILL:LAMBDA``: FILL ``fill``
(B's free entries take A's values: the library's way) or ``zeros`` (they stay zero, as B was
embedded); LAMBDA learned matching's λ distribution, or ``default`` (the library's).

    python benchmarks/widths.py                                    # the test split, defaults
    python benchmarks/widths.py --split val --variants zeros:uniform:0.4,0.6 fill:default \
        --run screen

Every run goes into benchmarks/results/widths.json under runs[--run] (default: the split's name).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from _common import HERE, RESULTS, machine, write_run

from glmc.barrier import run_barrier
from glmc.demo import model_folder, train_models
from glmc.demo import pairs as demo_pairs
from glmc.io.folders import canonical, load_model
from glmc.matching.options import LearnedMatchingOptions
from glmc.methods import AlignOptions
from glmc.model import CanonicalModel, fitted


def variant(spec: str) -> tuple[bool, str | None]:
    """``FILL:LAMBDA`` -> (fill, λ distribution or None for the library's default)."""
    fill, _, lam = spec.partition(":")
    if fill not in ("fill", "zeros") or not lam:
        raise argparse.ArgumentTypeError(f"bad variant {spec!r}: FILL:LAMBDA, FILL fill or "
                                         "zeros, LAMBDA a distribution or default")
    return fill == "fill", None if lam == "default" else lam


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=HERE.parent / "glmc-cache")
    ap.add_argument("--ratios", type=int, nargs="*", default=[2, 4, 8],
                    help="d_A / d_B of each B")
    ap.add_argument("--steps-learned", type=int, default=1000)
    ap.add_argument("--split", default="test", choices=("val", "test"))
    ap.add_argument("--variants", nargs="*", default=["fill:default"],
                    help="FILL:LAMBDA, each (see above)")
    ap.add_argument("--out", type=Path, default=RESULTS / "widths.json")
    ap.add_argument("--run", default=None,
                    help="the name of this run inside --out (default: the split's name)")
    args = ap.parse_args()
    variants = [(v, *variant(v)) for v in args.variants]
    demo = {p.key: p for p in demo_pairs(quick=False)}["shakespeare"]
    a = model_folder(args.cache, demo, 0)
    jobs = [(dataclasses.replace(demo.train, seed=0), a)]
    narrow = {}
    for r in args.ratios:
        d = demo.train.n_embd // r
        heads = max(1, d // (demo.train.n_embd // demo.train.n_head))
        cfg = dataclasses.replace(demo.train, n_embd=d, n_head=heads, seed=1)
        pair = dataclasses.replace(demo, key=f"{demo.key}-width{d}", train=cfg)
        narrow[r] = model_folder(args.cache, pair, 1)
        jobs.append((cfg, narrow[r]))
    train_models([(c, f) for c, f in jobs if not f.exists()], 2, print)
    rows = []
    for r, b in narrow.items():
        ma = canonical(load_model(a))
        embedded = fitted(ma, canonical(load_model(b)))
        for name, fill, lam in variants:
            mb = embedded if fill else CanonicalModel(embedded.config, embedded.state,
                                                      embedded.files)
            learned = LearnedMatchingOptions(steps=args.steps_learned, lam=lam)
            rep = run_barrier(load_model(a), mb, "shakespeare", methods=("weight", "learned"),
                              split=args.split, options=AlignOptions(learned=learned))
            w = rep.methods["weight"]
            row = {"ratio": 1 / r, "d_b": demo.train.n_embd // r, "b": str(b),
                   "variant": name, "lam": learned.lam_for(narrower=True),
                   "loss_a": w.loss_a, "loss_b": w.loss_b,
                   **{f"barrier_{m}": res.loss_barrier for m, res in rep.methods.items()},
                   "curves": {m: [x - (lam_ * res.loss_a + (1 - lam_) * res.loss_b)
                                  for lam_, x in zip(rep.lambdas, res.losses, strict=True)]
                              for m, res in rep.methods.items()},
                   "seconds_learned": rep.methods["learned"].align_seconds}
            rows.append(row)
            print(f"d_B = {row['d_b']} ({row['ratio']:g} of A), {name}: loss A "
                  f"{row['loss_a']:.3f}, B {row['loss_b']:.3f}; barrier weight "
                  f"{row['barrier_weight']:.3f}, learned {row['barrier_learned']:.3f}; "
                  "learned's curve " + " ".join(f"{x:.3f}" for x in row["curves"]["learned"]),
                  flush=True)
    print(f"| d_B / d_A | d_B | variant | loss A | loss B | weight matching | learned matching "
          f"| ({args.split} split) |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['ratio']:g} | {row['d_b']} | {row['variant']} | {row['loss_a']:.3f} | "
              f"{row['loss_b']:.3f} | {row['barrier_weight']:.3f} | "
              f"{row['barrier_learned']:.3f} |")
    write_run(args.out, args.run or args.split,
              {"machine": machine(), "split": args.split, "steps_learned": args.steps_learned,
               "a": str(a), "rows": rows})
    if args.split != "test" or len(variants) != 1:
        print(f"wrote {args.out}")
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    xs = [row["ratio"] for row in rows]
    for m, label in (("weight", "weight matching"), ("learned", "learned matching")):
        ax.plot(xs, [row[f"barrier_{m}"] for row in rows], "o-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("residual width of B / A")
    ax.set_ylabel("test loss barrier")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
