"""What weight matching of the current objective cannot go below on this machine.

A run's result is fixed by the spaces it solves: every MLP space it solves needs its n x n
cross-correlation (the products) and a linear assignment on it, whatever else is made faster.
This script measures those two on the pair ``benchmarks/weight_matching.py`` aligns (two
independently initialised GPT-2s of the given size), every MLP space at the run's start, two
at once on the two workers (one thread each) as the run solves them:

- the products as the run makes them (one product per tensor, summed), and as one product of
  the operands concatenated beforehand by torch and by numpy's own BLAS (the concatenation
  not timed: lower bounds);
- the assignment by each solver installed (scipy's, lapx's ``lapjvh`` in float64 and
  ``lapjvs`` in float32), the fastest counted.

The floor is then (fastest products + fastest assignment per MLP solve) x the MLP solves of a
run (``unit_solves`` in ``--run``, the weight-matching benchmark's results) / the workers:
wall seconds that no implementation with the same solves can beat on these cores, before the
heads, the residual steps and moving any tensor are counted.

    python benchmarks/weight_matching_floor.py                 # gpt2-small
    python benchmarks/weight_matching_floor.py --run benchmarks/results/weight_matching.json
"""

from __future__ import annotations

import os

# One thread per product everywhere (numpy's BLAS included), before any of them is imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

from _common import RESULTS, machine, provenance, write_json  # noqa: E402
from weight_matching import SIZES, independent_pair  # noqa: E402


def _time(fn, repeats: int = 2) -> tuple[float, object]:
    """Best wall seconds of ``fn()`` over ``repeats`` runs, and its last value."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(name: str) -> list[dict]:
    """Every MLP space's products and assignments at the run's start, two spaces at once."""
    import numpy as np
    import torch
    from scipy.optimize import linear_sum_assignment

    from glmc.matching import solvers
    from glmc.matching.descent import Descent
    from glmc.matching.problem import Problem, WeightMatchingOptions, angle_cost, cross, fixes_ones
    from glmc.symmetry.transform import unapply_axes
    from glmc.tensors import axis_first

    a, b = independent_pair(name)
    prob = Problem(a, b, WeightMatchingOptions(fix_ones=fixes_ones(a, b)))
    descent = Descent.start(prob, a.dtype)
    spec, el = prob.spec, descent.el
    mlp = [u for u in prob.units if u not in prob.head_units]

    solvers_ = {"scipy": lambda c: linear_sum_assignment(np.negative(c))}
    if solvers._LAP is not None:
        lap = solvers._LAP
        solvers_["lapjvh"] = lambda c: lap.lapjvh(np.negative(c))
        solvers_["lapjvs"] = lambda c: lap.lapjvs(np.negative(c, dtype=np.float32))

    def one(unit: str) -> dict:
        torch.set_num_threads(1)
        names = sorted({n for n, _, _ in spec.occurrences(unit)})
        descent.cache.refresh(names, el)
        bt = {n: unapply_axes(descent.bt_all[n], spec.axes[n], {unit: el[unit]})
              for n in names}
        run_s, c = _time(lambda: cross(prob, unit, el, bt, unweighted=True).clone())
        ops = [(axis_first(prob.A[n], ax) * prob.raw(n), axis_first(bt[n], ax))
               for n, ax, _ in spec.occurrences(unit)]
        x = torch.cat([p[0] for p in ops], 1).contiguous()
        y = torch.cat([p[1] for p in ops], 1).contiguous()
        one_s, _ = _time(lambda: x @ y.T)
        xn, yn = x.numpy(), y.numpy()
        numpy_s, _ = _time(lambda: xn @ yn.T)  # (numpy's own BLAS, OpenBLAS in its wheels)
        na, nb = prob.unit_norms(unit)
        cost = angle_cost(c, na, nb).numpy().copy()
        assign = {k: round(_time(lambda f=f: f(cost), 1)[0], 4) for k, f in solvers_.items()}
        return {"unit": unit, "n": int(c.shape[0]), "features": int(x.shape[1]),
                "gflop": round(2 * x.shape[0] * y.shape[0] * x.shape[1] / 1e9, 2),
                "products_s": round(run_s, 4), "products_one_gemm_s": round(one_s, 4),
                "products_numpy_s": round(numpy_s, 4),
                "assignment_s": assign}

    with ThreadPoolExecutor(max_workers=2) as pool:  # (both cores busy, as in the run)
        return list(pool.map(one, mlp))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="gpt2-small", choices=sorted(SIZES))
    p.add_argument("--run", default=str(RESULTS / "weight_matching.json"),
                   help="the weight-matching benchmark's results (the run's MLP solves)")
    p.add_argument("--out", default=str(RESULTS / "weight_matching_floor.json"))
    args = p.parse_args()
    data = json.loads(Path(args.run).read_text())
    runs = data["runs"]["default"]["results"] if "runs" in data else data["results"]
    run = next((r for r in runs if r["size"] == args.size and "unit_solves" in r), None)
    if run is None:
        raise SystemExit(f"{args.run}: no {args.size} row with unit_solves; run "
                         f"benchmarks/weight_matching.py --sizes {args.size} first")
    solves = run["unit_solves"]["mlp"]
    rows = measure(args.size)
    prod = statistics.median(min(r["products_s"], r["products_one_gemm_s"],
                                 r["products_numpy_s"]) for r in rows)
    assign = statistics.median(min(r["assignment_s"].values()) for r in rows)
    workers = 2
    floor = (prod + assign) * solves / workers
    summary = {"mlp_solves": solves, "products_s": round(prod, 4),
               "assignment_s": round(assign, 4), "workers": workers,
               "floor_s": round(floor, 1), "run_total_s": run["total_s"],
               "run_commit": run["commit"]}
    print(f"{'space':<10} {'n':>5} {'GFLOP':>6} {'products':>9} {'one GEMM':>9} "
          f"{'numpy':>9}  assignment")
    for r in rows:
        print(f"{r['unit']:<10} {r['n']:>5} {r['gflop']:>6} {r['products_s']:>8.3f}s "
              f"{r['products_one_gemm_s']:>8.3f}s {r['products_numpy_s']:>8.3f}s  "
              + "  ".join(f"{k} {v:.3f}s" for k, v in r["assignment_s"].items()))
    print(f"floor: ({prod:.3f} + {assign:.3f}) s x {solves} MLP solves / {workers} workers = "
          f"{floor:.1f} s  (the run: {run['total_s']} s)")
    report = {"machine": machine(threads=1), "run": provenance(), "options": vars(args),
              "summary": summary, "rows": rows}
    print(f"wrote {write_json(args.out, report)}")


if __name__ == "__main__":
    main()
