"""The criterion every speed change to weight matching is held to: on the held-out suite's
pairs (trained by code other than glmc's, ``heldout.py``), weight matching's test-loss barrier
after the change may not exceed the one before by more than 1% (relative), pair by pair.

"before" is weight matching as it was (its options given explicitly, :data:`VARIANTS`),
"after" the library's defaults; both are measured in one run of the current code by
``run_barrier`` (test split, 11 points), as the held-out table is. The table records the
barrier, the iterations and weight matching's seconds of each (the pairs are small: their
seconds say little of speed, which ``align_end_to_end.py`` measures).

    python benchmarks/heldout.py --train-only --part test          # the models, once
    python benchmarks/wm_criterion.py --cache CACHE                # every test pair
    python benchmarks/wm_criterion.py --cache CACHE --pairs t-gpt2-2l --out a.json & ...
    python benchmarks/wm_criterion.py --merge a.json b.json        # rows into the results

Writes benchmarks/results/wm_criterion.json and its table in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import RESULTS, Section, read_json, replace_section, write_json
from heldout import measure, suite

OUT = RESULTS / "wm_criterion.json"
#: Weight matching's options as they were before the speed changes (what "before" runs),
#: and the defaults (after).
BEFORE = {"tol": 1e-5, "max_iter": 15, "stop": "fixed-point"}
FREE = {"init": "embeddings"}  # (data-free: what glmc align does without --data)
VARIANTS: dict[str, dict] = {"before": BEFORE, "after": {}, "before, data-free": BEFORE | FREE,
                             "after, data-free": FREE}
#: The validation screen the default was chosen on (``--part val --screen``): the stop at the
#: first full sweep gaining less than ``tol``, at several tols, and one iteration alone.
SCREEN: dict[str, dict] = {
    "before": BEFORE, "tol 1e-3": {"tol": 1e-3}, "tol 1e-2 (after)": {"tol": 1e-2},
    "tol 3e-2": {"tol": 3e-2}, "one iteration": {"max_iter": 1},
    "before, data-free": BEFORE | FREE, "tol 1e-2, data-free (after)": {"tol": 1e-2} | FREE,
    "tol 3e-2, data-free": {"tol": 3e-2} | FREE}
LIMIT = 1.01  # after / before, at most


def run(pairs: list[str] | None, part: str, variants: dict[str, dict], cache: Path,
        out: Path) -> None:
    chosen = [q for q in suite() if q.part == part and (pairs is None or q.key in pairs)]
    for pair in chosen:
        for variant, options in variants.items():
            row = measure(pair, cache, ["weight"], options)
            results = read_json(out) or {"pairs": {}}
            results["pairs"].setdefault(pair.key, {})[variant] = row
            write_json(out, results)
            w = row["methods"]["weight"]
            print(f"{pair.key} {variant}: {w['loss_barrier']:.4f}, {w['iterations']} "
                  f"iterations, {w['align_seconds']:.1f} s", flush=True)


def table(results: dict, part: str = "test") -> str:
    """Rows: pairs of ``part``; a column per variant: the barrier, (the iterations; the
    barrier over its "before": with data, or data-free)."""
    pairs = {k: r for k, r in results.get("pairs", {}).items()
             if next(iter(r.values()))["part"] == part}
    names = list(dict.fromkeys(v for r in pairs.values() for v in r))
    lines = ["| pair | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    runs = set()
    for key, row in pairs.items():
        cells = []
        for v in names:
            if v not in row:
                cells.append("–")
                continue
            w = row[v]["methods"]["weight"]
            base = "before, data-free" if "data-free" in v else "before"
            note = str(w["iterations"])
            if v != base and base in row:
                ratio = w["loss_barrier"] / row[base]["methods"]["weight"]["loss_barrier"]
                note += f"; {ratio:.3f}" + (", above" if ratio > LIMIT else "")
            cells.append(f"{w['loss_barrier']:.4f} ({note})")
            r = row[v]["run"]
            runs.add((r["commit"], r["dirty"], r["machine"]))
        title = next(iter(row.values()))["title"]
        lines.append(f"| `{key}`: {title} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: the test-loss barrier (iterations; its ratio to the same start's "
              "before). Runs: " + "; ".join(f"commit {c}{' with changes' if d else ''}, {m}"
                                              for c, d, m in sorted(runs)) + "."]
    return "\n".join(lines)


SECTIONS = {f"wm_criterion_{part}": Section(lambda part=part: table(read_json(OUT), part),
                                            (OUT,)) for part in ("val", "test")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="*", default=None, choices=[q.key for q in suite()])
    p.add_argument("--part", choices=("val", "test"), default="test")
    p.add_argument("--screen", action="store_true", help="the validation screen's variants")
    p.add_argument("--variant", nargs=2, action="append", metavar=("NAME", "JSON"),
                   help="weight matching's options of a variant, as AlignOptions JSON "
                   "(repeated; default: before and after, VARIANTS)")
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                   help="add the pairs of these results files to wm_criterion.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.merge:
        results = read_json(OUT) or {"pairs": {}}
        for f in args.merge:
            results["pairs"].update(read_json(f)["pairs"])
        write_json(OUT, results)
    else:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        variants = ({n: json.loads(j) for n, j in args.variant} if args.variant
                    else SCREEN if args.screen else VARIANTS)
        run(args.pairs, args.part, variants, Path(args.cache), out)
    if out == OUT or args.merge:
        for part in ("val", "test"):
            md = table(read_json(OUT), part)
            print(md)
            replace_section(f"wm_criterion_{part}", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
