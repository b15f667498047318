"""Weight matching's options, one at a time, on the quality suite's pairs: what each variant
leaves, beside the defaults (the record of what was tried where a target is missed).

Same models, test split and 11-point grid as ``quality.py`` (the library's canonical
evaluation of A and π(B)); heads in head form. Needs the pairs in the cache
(``python benchmarks/quality.py --train-only``).

    python benchmarks/variants.py                          # gpt2-demo and vit-demo
    python benchmarks/variants.py --pairs gpt2-2l --cache glmc-cache

Writes benchmarks/results/variants.json and its table in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _common import RESULTS, machine, read_json, replace_section, write_json
from quality import folders, suite

#: name -> weight-matching options (the defaults first).
VARIANTS: dict[str, dict] = {
    "defaults": {},
    "unit cost: distance": {"unit_cost": "distance"},
    "weighting: layer": {"weighting": "layer"},
    "bias weight 1.0": {"bias_weight": 1.0},
    "bias weight 0.1": {"bias_weight": 0.1},
    "inner maps: orthogonal": {"inner": "orthogonal"},
    "start: spectral": {"init": "spectral"},
    "start: identity": {"init": "identity"},
    "40 iterations, no tolerance": {"max_iter": 40, "tol": -1.0},
}
OUT = RESULTS / "variants.json"


def measure(pair, cache: Path) -> dict:
    import glmc
    from glmc.barrier import barrier, barrier_batches, lambda_grid
    from glmc.evaluate import Evaluator

    a, b = folders(cache, pair)
    ma, mb, batches = barrier_batches(str(a), str(b), pair.train.data)
    ev, grid = Evaluator(ma.config, batches), lambda_grid(11)
    rows = {}
    for name, kw in VARIANTS.items():
        t0 = time.perf_counter()
        al = glmc.align(ma, mb, **kw)
        seconds = time.perf_counter() - t0
        losses = [r.loss for r in ev.evaluate_path(ma.state, al.aligned.state, grid)]
        rows[name] = {"options": kw, "loss_barrier": barrier(grid, losses),
                      "relative_distance": al.match.relative, "align_seconds": round(seconds, 2)}
        print(f"{pair.key}: {name}: {rows[name]['loss_barrier']:.3f} "
              f"(relative D {al.match.relative:.4f})", flush=True)
    return rows


def table(results: dict) -> str:
    keys = [k for k in results.get("pairs", {})]
    lines = ["| weight matching | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name in VARIANTS:
        cells = []
        for k in keys:
            r = results["pairs"][k].get(name)
            cells.append("–" if r is None else
                         f"{r['loss_barrier']:.3f} (D {r['relative_distance']:.3f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="*", default=["gpt2-demo", "vit-demo"],
                   choices=[q.key for q in suite()])
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    for pair in [q for q in suite() if q.key in args.pairs]:
        a, b = folders(Path(args.cache), pair)
        if not (a / "glmc_train.json").is_file() or not (b / "glmc_train.json").is_file():
            print(f"{pair.key}: not trained yet (python benchmarks/quality.py --train-only)")
            continue
        rows = measure(pair, Path(args.cache))
        results = read_json(OUT) or {"pairs": {}}
        results["pairs"][pair.key] = rows
        results["machine"] = machine()
        write_json(OUT, results)
    md = table(read_json(OUT) or {"pairs": {}})
    print(md)
    replace_section("variants", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
