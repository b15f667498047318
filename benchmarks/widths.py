"""A narrower GPT-2 aligned to a wider one: the barrier against the width ratio.

A is the demo's GPT-2 (3 layers, d = 128, 4 heads, seed 0, from the demo's cache); each B is
the same recipe at residual width d_A/2, d_A/4, d_A/8 (MLP 4·d, heads of A's dimension where
they fit: 2 heads at d = 64, 1 below), seed 1. B is embedded exactly into A's shapes (zero
units and heads, the stream scaled; glmc.families.transformer.widen), then aligned by weight
matching and by learned matching (the library's defaults, on the training split), and the
test-loss barrier of the line between A and B at A's width measured as ``glmc barrier`` does.
Prints a table, writes JSON and a plot of the barriers against d_B/d_A.

    python benchmarks/widths.py --cache /work/cache
    python benchmarks/widths.py --ratios 2 --steps-learned 200 --out /tmp/widths.json
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from _common import HERE, RESULTS, machine, provenance, write_json

from glmc.barrier import run_barrier
from glmc.demo import model_folder, train_models
from glmc.demo import pairs as demo_pairs
from glmc.matching.options import LearnedMatchingOptions
from glmc.methods import AlignOptions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=HERE.parent / "glmc-cache")
    ap.add_argument("--ratios", type=int, nargs="*", default=[2, 4, 8],
                    help="d_A / d_B of each B")
    ap.add_argument("--steps-learned", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=RESULTS / "widths.json")
    args = ap.parse_args()
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
    learned = LearnedMatchingOptions(steps=args.steps_learned)
    rows = []
    for r, b in narrow.items():
        rep = run_barrier(str(a), str(b), "shakespeare", methods=("weight", "learned"),
                          options=AlignOptions(learned=learned))
        row = {"ratio": 1 / r, "d_b": demo.train.n_embd // r, "b": str(b),
               "loss_a": rep.methods["weight"].loss_a, "loss_b": rep.methods["weight"].loss_b,
               **{f"barrier_{m}": res.loss_barrier for m, res in rep.methods.items()}}
        rows.append(row)
        print(f"d_B = {row['d_b']} ({row['ratio']:g} of A): loss A {row['loss_a']:.3f}, B "
              f"{row['loss_b']:.3f}; barrier weight {row['barrier_weight']:.3f}, learned "
              f"{row['barrier_learned']:.3f}", flush=True)
    print("| d_B / d_A | d_B | loss A | loss B | weight matching | learned matching |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['ratio']:g} | {row['d_b']} | {row['loss_a']:.3f} | {row['loss_b']:.3f} "
              f"| {row['barrier_weight']:.3f} | {row['barrier_learned']:.3f} |")
    write_json(args.out, {"benchmark": "widths", "machine": machine(), "run": provenance(),
                          "a": str(a), "rows": rows})
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
