"""Linear-assignment solvers on cost matrices shaped like glmc's MLP-unit steps.

For each size a random A (n x 3d, float32) and B = A[perm] + noise * N(0, 1) (A's entries have
unit variance, so ``noise`` is relative to them); the cost to maximise is m = A @ B.T (n x n,
float32), as glmc's correlation of MLP units. ``inf`` as a noise level: B independent of A (two
independently initialised models). Every solver goes from the float32 matrix m to a
permutation, conversion included: scipy exactly as ``glmc.matching.solvers.assignment`` calls
it (negated into float64), lapx's solvers (``import lap``) on the negated matrix. One thread.
Each size runs in its own process; per solve: wall time (best of ``--repeats``, one run from
n = 11008 up), peak extra RSS (VmHWM reset before the solve, Linux only), the total of
Σ m[i, perm[i]] in float64 against scipy's, and whether the permutation is scipy's.

    python benchmarks/assignment.py                     # n = 3072, 5632, 11008; noise 0.1 1 10 inf
    python benchmarks/assignment.py --mistral           # also n = 14336 (slow)
    python benchmarks/assignment.py --sizes gpt2-small --noise 0.1 1.0 inf
    python benchmarks/assignment.py --solvers scipy lapjvs
"""

from __future__ import annotations

import os

# One thread everywhere, before numpy (and its BLAS) is imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
             "VECLIB_MAXIMUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from _common import RESULTS, machine, provenance, write_json  # noqa: E402

SIZES = {
    # name: (n MLP units, model width d); the cost sums over 3d features (gate, up, down)
    "gpt2-small": (3072, 768),
    "tinyllama": (5632, 2048),
    "llama-7b": (11008, 4096),
    "mistral-7b": (14336, 4096),
}
DEFAULT_SIZES = ["gpt2-small", "tinyllama", "llama-7b"]
SINGLE_RUN_FROM = 11008  # n from which every solve runs once


def lapx_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lapx")
    except PackageNotFoundError:
        return None


def solvers() -> dict[str, Callable]:
    """name -> f(m), m a float32 (n, n) ndarray: cols (int64, n) maximising Σ m[i, cols[i]]."""
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    def scipy_(m):  # glmc.matching.solvers.assignment, as it is
        rows, cols = linear_sum_assignment(np.negative(m, dtype=np.float64))
        assert (rows == np.arange(len(rows))).all()
        return np.asarray(cols, dtype=np.int64)

    out = {"scipy": scipy_}
    try:
        import lap
    except ImportError:
        return out

    def lapjv(m):  # the original lap's JV, float64 (it would convert to float64 itself)
        x, _ = lap.lapjv(np.negative(m, dtype=np.float64), return_cost=False)
        return np.asarray(x, dtype=np.int64)

    def lapjvs(m):  # default: float32 kernel
        x, _ = lap.lapjvs(np.negative(m), return_cost=False, jvx_like=False)
        return np.asarray(x, dtype=np.int64)

    def lapjvs_f64(m):
        x, _ = lap.lapjvs(np.negative(m, dtype=np.float64), return_cost=False, jvx_like=False,
                          prefer_float32=False)
        return np.asarray(x, dtype=np.int64)

    def lapjvh(m):  # float32 costs, float64 potentials and distances (its square path)
        rows, cols = lap.lapjvh(np.negative(m), return_cost=False)
        assert (rows == np.arange(len(rows))).all()
        return np.asarray(cols, dtype=np.int64)

    def lapjvh_f64(m):
        rows, cols = lap.lapjvh(np.negative(m, dtype=np.float64), return_cost=False)
        assert (rows == np.arange(len(rows))).all()
        return np.asarray(cols, dtype=np.int64)

    out |= {"lapjv": lapjv, "lapjvs": lapjvs, "lapjvs-f64": lapjvs_f64}
    if hasattr(lap, "lapjvh"):  # lapx >= 0.11
        out |= {"lapjvh": lapjvh, "lapjvh-f64": lapjvh_f64}
    return out


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:  # give freed heap back first, so that a reused buffer still counts as extra
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def solve_once(fn: Callable, m) -> tuple[float, float | None, object]:
    """(seconds, peak extra MB or None, cols) of one solve."""
    gc.collect()
    ok = _reset_peak()
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    cols = fn(m)
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    extra = (peak - before) / 1024 if ok and peak is not None and before is not None else None
    return seconds, extra, cols


def run_one(name: str, noises: list[float], names: list[str], repeats: int, seed: int) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    n, d = SIZES[name]
    k = 3 * d
    available = solvers()
    chosen = {s: available[s] for s in names if s in available}
    cases = []
    for noise in noises:
        gen = torch.Generator().manual_seed(seed)
        t0 = time.perf_counter()
        a = torch.randn(n, k, generator=gen)
        perm = torch.randperm(n, generator=gen)
        if np.isinf(noise):
            b = torch.randn(n, k, generator=gen)
        else:
            b = a[perm].add_(torch.randn(n, k, generator=gen), alpha=noise)
        m = (a @ b.T).numpy()  # float32, rows: A's units, columns: B's
        del a, b
        build_s = time.perf_counter() - t0
        planted = torch.argsort(perm).numpy()  # A's unit i is B's unit planted[i]
        runs = 1 if n >= SINGLE_RUN_FROM else repeats
        m64_rows = np.arange(n)
        case = {"size": name, "n": n, "features": k,
                "noise": "inf" if np.isinf(noise) else noise,  # JSON has no infinity
                "build_s": round(build_s, 2),
                "runs": runs, "solvers": {}}
        ref_cols = ref_total = None
        for sname, fn in chosen.items():
            times, extras = [], []
            for _ in range(runs):
                seconds, extra, cols = solve_once(fn, m)
                times.append(seconds)
                extras.append(extra)
            cols = np.asarray(cols, dtype=np.int64)
            is_perm = cols.shape == (n,) and bool((np.bincount(cols, minlength=n) == 1).all())
            total = float(m[m64_rows, cols].astype(np.float64).sum())
            if ref_cols is None:  # scipy first: the reference
                ref_cols, ref_total = cols, total
                row_max = m.argmax(1)
                case |= {"rows_at_row_max": round(float((row_max == cols).mean()), 4),
                         "planted_recovered": round(float((planted == cols).mean()), 4),
                         "total": total}
            gap = ref_total - total  # > 0: worse than scipy
            case["solvers"][sname] = {
                "seconds": round(min(times), 3), "all_seconds": [round(t, 3) for t in times],
                "peak_extra_mb": (None if extras[0] is None
                                  else round(max(e for e in extras if e is not None))),
                "is_permutation": is_perm, "total": total, "gap": gap,
                "relative_gap": gap / abs(ref_total) if ref_total else 0.0,
                "same_total": abs(gap) <= 1e-6 * abs(ref_total),
                "rows_differing": int((cols != ref_cols).sum()),
                "same_permutation": bool((cols == ref_cols).all()),
            }
            print(f"# {name} noise={noise} {sname}: {min(times):.3f}s", file=sys.stderr,
                  flush=True)
        cases.append(case)
        del m
    return {"size": name, "cases": cases, "threads": torch.get_num_threads()}


def print_case(c: dict) -> None:
    ref = c["solvers"].get("scipy", {}).get("seconds")
    print(f"n={c['n']:<6} noise={c['noise']:<4} rows at row max {c['rows_at_row_max']:.3f}  "
          f"planted recovered {c['planted_recovered']:.3f}  (build {c['build_s']:.1f}s, "
          f"{'best of ' + str(c['runs']) if c['runs'] > 1 else '1 run'})", flush=True)
    for s, r in c["solvers"].items():
        speed = f"{ref / r['seconds']:6.2f}x" if ref and r["seconds"] > 0 else "     - "
        mem = "-" if r["peak_extra_mb"] is None else f"{r['peak_extra_mb']:6d}"
        ok = "yes" if r["same_total"] and r["is_permutation"] else "NO"
        print(f"    {s:<11} {r['seconds']:9.3f}s {speed}  peak +{mem:>6} MB  "
              f"same total {ok:<3} (rel gap {r['relative_gap']:+.1e})  "
              f"same perm {'yes' if r['same_permutation'] else 'no':<3} "
              f"({r['rows_differing']} rows differ)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, choices=list(SIZES))
    p.add_argument("--mistral", action="store_true", help="also n = 14336 (Mistral-7B MLP)")
    p.add_argument("--noise", nargs="+", type=float, default=[0.1, 1.0, 10.0, float("inf")],
                   help="relative noise levels; inf: B independent of A")
    p.add_argument("--solvers", nargs="+",
                   default=["scipy", "lapjv", "lapjvs", "lapjvs-f64", "lapjvh"])
    p.add_argument("--repeats", type=int, default=2, help="best of, below n = 11008")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS / "assignment.json"))
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    names = ["scipy"] + [s for s in args.solvers if s != "scipy"]  # scipy: the reference
    if args.one:
        print(json.dumps(run_one(args.one, args.noise, names, args.repeats, args.seed)))
        return
    sizes = args.sizes + (["mistral-7b"] if args.mistral and "mistral-7b" not in args.sizes
                          else [])
    t_all = time.perf_counter()
    rows = []
    for name in sizes:
        cmd = [sys.executable, __file__, "--one", name, "--noise", *map(str, args.noise),
               "--solvers", *names, "--repeats", str(args.repeats), "--seed", str(args.seed)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        for case in rows[-1]["cases"]:
            print_case(case)
    import numpy
    import scipy

    available = [s for s in names if s == "scipy" or lapx_version()]
    report = {"machine": machine(threads=1, numpy=numpy.__version__, scipy=scipy.__version__,
                                 lapx=lapx_version()),
              "run": provenance(threads=1),
              "options": vars(args) | {"solvers": available, "sizes": sizes,
                                       "noise": [str(x) if x == float("inf") else x
                                                 for x in args.noise]},
              "total_s": round(time.perf_counter() - t_all, 1), "results": rows}
    print(f"wrote {write_json(args.out, report)}")


if __name__ == "__main__":
    main()
