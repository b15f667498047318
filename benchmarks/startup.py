"""Start-up benchmark: wall time of short ``glmc`` commands, each in a fresh process.

``glmc --help``, ``glmc verify --help`` and ``glmc --version`` build the parser without importing
torch; ``glmc verify`` on a missing folder runs a command (it imports torch and transformers,
then fails on the folder) and shows what a command costs before any work. ``python -c pass`` is
the interpreter alone.

    python benchmarks/startup.py                     # median of 7 runs per command
    python benchmarks/startup.py --runs 15
    python benchmarks/startup.py --src /tmp/old/src  # another checkout's code, for comparison
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import RESULTS, machine, write_json

CASES = {
    # name: (glmc arguments, expected exit code); None: the interpreter alone
    "python -c pass": (None, 0),
    "glmc --help": (["--help"], 0),
    "glmc verify --help": (["verify", "--help"], 0),
    "glmc --version": (["--version"], 0),
    "glmc verify (missing folder)": (["verify", "no-such-model-a", "no-such-model-b"], 2),
}


def command(args: list[str] | None, src: str | None) -> list[str]:
    """The process to time: the installed ``glmc`` script, or ``entry()`` of ``src``'s code."""
    if args is None:
        return [sys.executable, "-c", "pass"]
    script = Path(sys.executable).with_name("glmc")
    if src is None and script.is_file():
        return [str(script), *args]
    return [sys.executable, "-c", "from glmc.cli.main import entry; entry()", *args]


def time_case(args: list[str] | None, expect: int, runs: int, src: str | None) -> list[float]:
    """Wall seconds of ``runs`` runs (after one untimed warm-up run)."""
    env = dict(os.environ, PYTHONPATH=src) if src else None
    cmd = command(args, src)
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        elapsed = time.perf_counter() - t0
        if done.returncode != expect:
            raise RuntimeError(f"exit {done.returncode}, expected {expect}: "
                               f"{done.stderr.strip().splitlines()[-1:]}")
        if i:  # the first run warms the file cache
            times.append(elapsed)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=7, help="timed runs per command (median kept)")
    p.add_argument("--src", help="time this source folder's glmc (PYTHONPATH) instead")
    p.add_argument("--out", default=str(RESULTS / "startup.json"))
    args = p.parse_args()
    rows = []
    print(f"{'command':<30} {'median':>8} {'min':>8} {'max':>8}")
    for name, (glmc_args, expect) in CASES.items():
        try:
            times = time_case(glmc_args, expect, args.runs, args.src)
        except RuntimeError as error:  # e.g. an older checkout without --version
            rows.append({"command": name, "error": str(error)})
            print(f"{name:<30} {error}", flush=True)
            continue
        rows.append({"command": name, "median_s": round(statistics.median(times), 3),
                     "min_s": round(min(times), 3), "max_s": round(max(times), 3),
                     "runs": len(times)})
        r = rows[-1]
        print(f"{name:<30} {r['median_s']:7.3f}s {r['min_s']:7.3f}s {r['max_s']:7.3f}s",
              flush=True)
    # Start-up depends on the interpreter and its site-packages as much as on the CPU.
    report = {"machine": machine(), "options": vars(args), "results": rows}
    print(f"wrote {write_json(args.out, report)}")


if __name__ == "__main__":
    main()
