"""glmc demo: the paper's experiment end to end on embedded data."""

from __future__ import annotations

import argparse
import sys

from glmc.cli.common import add_json, emit_json, nonempty_path
from glmc.cli.main import add_command
from glmc.cli.options import check_at_least, check_points
from glmc.defaults import MAX_POINTS
from glmc.methods import METHODS as ALL_METHODS
from glmc.methods import get_method

#: What the cache may grow by: four models, each with a checkpoint in flight (the full
#: demo's models have about 0.6M parameters; --quick's about 30k).
CACHE_BYTES = {True: 5_000_000, False: 50_000_000}
#: Two plots, report.md and results.json.
OUT_BYTES = 4_000_000


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "demo",
        "Train (or reuse from the cache) two character-level GPT-2s on Tiny Shakespeare and two "
        "ViTs on MNIST with different seeds, align them with every method, and print the loss "
        "barriers in a table shaped like the paper's; plots, report.md and results.json go to "
        "the output folder.",
        "glmc demo --quick")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test of the pipeline: tiny models, few steps, seconds (its "
                   "numbers are not results)")
    p.add_argument("-o", "--out", default="glmc-demo", type=nonempty_path,
                   help="output folder (plots, report)")
    p.add_argument("--force", action="store_true",
                   help="write into an existing non-empty output folder, replacing its report, "
                   "results and plots (without it, one is refused before any work)")
    p.add_argument("--cache", default="glmc-cache", type=nonempty_path,
                   help="trained models are kept here and reused by later runs")
    p.add_argument("--align", action="append", metavar="METHOD", dest="methods",
                   help=f"alignment methods, repeatable (available: {', '.join(ALL_METHODS)}; "
                   "default: all)")
    p.add_argument("--points", type=int, default=11,
                   help=f"λ grid size: 2 to {MAX_POINTS} (each point evaluates the test split "
                   "once)")
    p.add_argument("--learned-steps", type=int, default=None,
                   help="learned matching steps (default: 500, half the library's 1,000, so that "
                   "the demo fits 10 minutes on 2 cores; 40 with --quick)")
    p.add_argument("--parallel", type=int, default=None,
                   help="models trained at once, one thread each (default: min(2, CPUs))")
    add_json(p)
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks that need no torch, before it loads: methods, option values, the output
    folder and the cache."""
    from glmc.io.outputs import check_output

    for m in dict.fromkeys(args.methods or ()):
        get_method(m)
    check_points(args)
    check_at_least(args, learned_steps=1, parallel=1)
    check_output(args.out, OUT_BYTES, force=args.force, into=True)
    check_output(args.cache, CACHE_BYTES[args.quick], force=True, into=True,  # (reused)
                 option="--cache")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from glmc.cli.common import console
    from glmc.demo import (
        METHOD_TITLES,
        METHODS,
        SMOKE_NOTE,
        endpoint_rows,
        run_demo,
        table_rows,
    )

    methods = tuple(dict.fromkeys(args.methods or METHODS))

    def note(msg: str) -> None:
        if not args.json:
            console.print(msg)

    with console.status("demo") as status:

        def progress(method: str, stage: str, done: int, total: int) -> None:
            what = "aligning" if stage == "align" else f"evaluating {done}/{total}"
            status.update(f"{METHOD_TITLES.get(method, method)}: {what}")

        demo = run_demo(args.out, args.cache, quick=args.quick, methods=methods,
                           points=args.points, learned_steps=args.learned_steps,
                           parallel=args.parallel, note=note, progress=progress)
    results, experiments, reports = demo.results, demo.experiments, demo.reports
    if args.json:
        emit_json(results)
        return 0
    out = Console() if sys.stdout.isatty() else Console(width=120)
    quick = results["quick"]
    t = Table(title="test-loss barrier" + (" (SMOKE TEST)" if quick
                                            else " (paper's figure in brackets)"))
    t.add_column("method")
    for p in experiments:
        t.add_column(p.title, justify="right")
    for row in table_rows(experiments, reports, paper=not quick):
        t.add_row(*row)
    out.print(t)
    e = Table(title="endpoints (test)")
    for c in ("experiment", "loss A / B", "accuracy A / B"):
        e.add_column(c)
    for row in endpoint_rows(experiments, reports):
        e.add_row(*row)
    out.print(e)
    if quick:
        print(f"note: {SMOKE_NOTE}")
    print(f"wrote {args.out}/report.md, results.json and plots "
          f"({results['seconds']['total']} s, training {results['seconds']['training']} s)")
    return 0
