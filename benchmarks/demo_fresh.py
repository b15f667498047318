"""``glmc demo`` on a fresh machine: from an empty cache, training included.

The README's main command, run as a new user runs it: ``HOME``, ``XDG_CACHE_HOME`` and the
working folder are new empty folders, so every model is trained. Wall time and peak RSS of
the command's process (``os.wait4``), the demo's own figures (``--json``), and the machine's
float32 matrix-product throughput (on both cores and on one: the figure that tells machines
apart), appended to ``results/demo_fresh.json`` (one run per machine and commit).

    python benchmarks/demo_fresh.py            # about 6-20 minutes, by the machine
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, machine, provenance, read_json, write_json


def gemm_gflops(threads: int, n: int = 4096, reps: int = 5) -> float:
    """Float32 GFLOP/s of n x n products on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return round(reps * 2 * n**3 / (time.perf_counter() - t0) / 1e9, 1)


def glmc_command() -> list[str]:
    script = Path(sys.executable).with_name("glmc")
    return [str(script)] if script.is_file() else [
        sys.executable, "-c", "import sys; from glmc.cli.main import main; "
        "sys.exit(main(sys.argv[1:]))"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS / "demo_fresh.json")
    args = p.parse_args()
    flops = {"two_threads": gemm_gflops(2), "one_thread": gemm_gflops(1)}
    print(f"float32 products: {flops['two_threads']} GFLOP/s on 2 threads, "
          f"{flops['one_thread']} on one", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        home, cache, cwd = (Path(tmp) / d for d in ("home", "cache", "cwd"))
        for d in (home, cache, cwd):
            d.mkdir()
        env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(cache))
        started = time.perf_counter()
        with open(Path(tmp) / "out.json", "w+") as out:
            proc = subprocess.Popen([*glmc_command(), "demo", "--json"], cwd=cwd, env=env,
                                    stdout=out)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - started
            if os.waitstatus_to_exitcode(status) != 0:
                raise SystemExit("glmc demo failed")
            out.seek(0)
            results = json.load(out)
    barriers = {data: {m: round(r["loss_barrier"], 3) for m, r in v["methods"].items()}
                for data, v in results["barriers"].items()}
    run = {"provenance": provenance(), "machine": machine(), "gemm_gflops": flops,
           "wall_s": round(wall, 1), "max_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3),
           "seconds": results["seconds"], "loss_barriers": barriers, "results": results}
    print(f"glmc demo from an empty cache: {run['wall_s']} s wall "
          f"({results['seconds']['training']} s training), {run['max_rss_gb']} GB")
    for data, row in barriers.items():
        print(f"  {data}: {row}")
    runs = read_json(args.out).get("runs", [])
    write_json(args.out, {"benchmark": "demo_fresh", "how": "glmc demo --json from an "
                          "empty cache: HOME, XDG_CACHE_HOME and the working folder new",
                          "runs": [*runs, run]})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
