"""Weight-matching benchmark: time per iteration and in total, split by space kind, peak RSS.

Each size runs in its own process (so peak RSS is that size's own) on a pair of independently
initialised GPT-2 models of the given shape, in float32, on the CPU.

    python benchmarks/weight_matching.py                      # paper, d384, gpt2-small
    python benchmarks/weight_matching.py --sizes gpt2-medium --run gpt2_medium  # one size
    python benchmarks/weight_matching.py --iters 15 --tol 1e-5 --stop fixed-point  # as before

Every run goes into benchmarks/results/weight_matching.json under runs[--run] (default
"default"), with its commit, machine and command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from _common import RESULTS, machine, provenance, write_run

from glmc.matching.options import STOPPING, WeightMatchingOptions

WM = WeightMatchingOptions()  # (the library's defaults: the run measures them unless told)

SIZES = {
    # name: (n_layer, n_embd, n_head, n_inner, vocab, context)
    "paper": (6, 256, 4, 1024, 65, 256),  # GPT-2 of the paper (Tiny Shakespeare, char-level)
    "d384": (6, 384, 6, 1536, 65, 256),
    "gpt2-small": (12, 768, 12, 3072, 50257, 1024),
    "gpt2-medium": (24, 1024, 16, 4096, 50257, 1024),
}


def independent_pair(name: str):
    """Two independently initialised GPT-2s of size ``name`` (seeds 0 and 1), canonical."""
    import torch
    from transformers import GPT2Config

    from glmc.families import IMPORTERS

    n_layer, d, h, f, vocab, ctx = SIZES[name]
    cfg = GPT2Config(n_layer=n_layer, n_embd=d, n_head=h, n_inner=f, vocab_size=vocab,
                     n_positions=ctx, bos_token_id=None, eos_token_id=None)
    imp = IMPORTERS["gpt2"]
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        stock = imp.stock_model(cfg)
        models.append(imp.to_canonical(cfg, dict(stock.state_dict())))
        del stock
    return models[0], models[1]


def run_one(name: str, iters: int, tol: float, residual: str, stop: str) -> dict:
    import torch

    from glmc.matching.weight import WeightMatchingOptions, weight_matching

    torch.set_num_threads(int(os.environ.get("GLMC_THREADS", os.cpu_count() or 1)))
    a, b = independent_pair(name)
    t0 = time.perf_counter()
    result = weight_matching(a, b, WeightMatchingOptions(max_iter=iters, tol=tol,
                                                         residual=residual, stop=stop))
    total = time.perf_counter() - t0
    phases: dict[str, float] = {}  # wall seconds
    kinds: dict[str, float] = {}  # the unit workers' seconds (they run in parallel)
    solves: dict[str, float] = {}  # units solved, per kind
    for row in result.trace:
        for key, into in (("seconds", phases), ("unit_seconds", kinds),
                          ("unit_solves", solves)):
            for k, v in row[key].items():
                into[k] = into.get(k, 0.0) + v
    n_it = len(result.trace)
    return {
        "size": name, "params": a.n_params(), "iterations": n_it, "converged": result.converged,
        "total_s": round(total, 2), "per_iteration_s": round(sum(phases.values()) / n_it, 3),
        "setup_s": round(total - sum(phases.values()), 2),
        "phases_s": {k: round(v, 2) for k, v in phases.items()},
        "unit_worker_s": {k: round(v, 2) for k, v in kinds.items()},
        "unit_solves": solves,
        "relative_init": round(result.to_json()["init_relative"], 6),
        "relative_final": round(result.relative, 6),
        "trace": [(r["relative"], r["units_solved"], r["units_changed"]) for r in result.trace],
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "loadavg": os.getloadavg(), **provenance(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["paper", "d384", "gpt2-small"],
                   choices=sorted(SIZES))
    p.add_argument("--iters", type=int, default=WM.max_iter)
    p.add_argument("--tol", type=float, default=WM.tol)
    p.add_argument("--stop", choices=STOPPING, default=WM.stop)
    p.add_argument("--residual", default="orthogonal")
    p.add_argument("--out", default=str(RESULTS / "weight_matching.json"))
    p.add_argument("--run", default="default", help="the name of this run inside --out")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.iters, args.tol, args.residual, args.stop)))
        return
    rows = []
    for name in args.sizes:
        cmd = [sys.executable, __file__, "--one", name, "--iters", str(args.iters),
               "--tol", str(args.tol), "--residual", args.residual, "--stop", args.stop]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{r['size']:<12} {r['params'] / 1e6:7.1f}M  it={r['iterations']:<2} "
              f"total={r['total_s']:7.2f}s  per-it={r['per_iteration_s']:6.2f}s  "
              f"rss={r['peak_rss_gb']:5.2f}GB  relative D {r['relative_init']:.4f}->"
              f"{r['relative_final']:.4f}  {r['phases_s']}", flush=True)
    report = {"machine": machine(), "options": vars(args), "results": rows}
    print(f"wrote {write_run(args.out, args.run, report)}")


if __name__ == "__main__":
    main()
