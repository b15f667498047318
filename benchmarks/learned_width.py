"""Learned matching's barrier against the models' width, on pairs trained by other code.

The held-out suite's 2-layer GPT-2 recipe on Python's standard library source
(``v-gpt2-2l-py``: ``heldout_train.py``, seeds 200 and 201) at wider residual streams, the
MLP four times as wide and four heads, as there (and as the paper's d = 256 GPT-2s): d = 64 is
the validation pair itself, d = 128 and 256 are trained here. Each pair is measured by
``heldout.measure`` (the library's ``run_barrier``, test split, 11 points) for vanilla
averaging, weight and learned matching at their defaults: what a pair's width does to the
floor learned matching leaves (nothing is chosen here).

    python benchmarks/learned_width.py                    # train where missing, then measure
    python benchmarks/learned_width.py --widths 128       # one width

Writes benchmarks/results/learned_width.json (each row with commit, machine and command).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import heldout
from _common import RESULTS, read_json, write_json

OUT = RESULTS / "learned_width.json"
METHODS = ["none", "weight", "learned"]


def pair_at(d: int) -> heldout.Pair:
    """The validation recipe ``v-gpt2-2l-py`` at residual width ``d`` (the pair itself at 64)."""
    base = next(q for q in heldout.suite() if q.key == "v-gpt2-2l-py")
    if d == base.shape["d"]:
        return base
    return dataclasses.replace(base, key=f"w-gpt2-2l-py-d{d}", part="width",
                               shape={**base.shape, "d": d})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    cache = Path(args.cache)
    pairs = [pair_at(d) for d in args.widths]
    heldout.train_all(pairs, cache, parallel=1)
    for pair in pairs:
        row = heldout.measure(pair, cache, METHODS)
        results = read_json(args.out) or {"pairs": {}}
        results["pairs"][str(pair.shape["d"])] = row
        write_json(args.out, results)
        print(f"d={pair.shape['d']}: " + ", ".join(
            f"{k} {v['loss_barrier']:.3f}" for k, v in row["methods"].items())
            + f" ({row['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
