"""The README's demo table, rendered from what `glmc demo -o docs/demo` wrote.

    glmc demo -o docs/demo --force && python benchmarks/demo_table.py

Rewrites the README's ``demo`` section from docs/demo/results.json (benchmarks/figures.py
checks that the two agree).
"""

from __future__ import annotations

import sys

from _common import HERE, Section, read_json, replace_section

OUT = HERE.parent / "docs" / "demo" / "results.json"


def table(results: dict) -> str:
    """Test-loss barrier per method and experiment, the paper's figure in brackets; the
    endpoints; the run's commit, machine and time."""
    from glmc.demo import METHOD_TITLES, PAPER, pairs

    experiments = [p for p in pairs(quick=False) if p.key in results["barriers"]]
    barriers = {p.key: results["barriers"][p.key]["methods"] for p in experiments}
    lines = ["| method | " + " | ".join(p.title for p in experiments) + " |",
             "|---|" + "---|" * len(experiments)]
    for m in barriers[experiments[0].key]:
        cells = []
        for p in experiments:
            paper = PAPER.get(m, {}).get(p.key)
            cells.append(f"{barriers[p.key][m]['loss_barrier']:.3f}"
                         + (f" ({paper:.2f})" if paper is not None else ""))
        lines.append(f"| {METHOD_TITLES.get(m, m)} | " + " | ".join(cells) + " |")
    ends = []
    for p in experiments:
        r = next(iter(barriers[p.key].values()))
        acc = (f", accuracy {100 * r['acc_a']:.1f}% / {100 * r['acc_b']:.1f}%"
               if r["acc_a"] is not None else "")
        ends.append(f"{p.title} loss {r['loss_a']:.3f} / {r['loss_b']:.3f}{acc}")
    run, seconds = results["provenance"], results["seconds"]
    lines += ["", "Endpoints (test): " + "; ".join(ends) + ".", "",
              f"Run: commit {run['commit']}{' (changed)' if run['dirty'] else ''}, "
              f"{run['machine']}, {seconds['total']} s ({seconds['training']} s of it "
              "training)."]
    return "\n".join(lines)


SECTIONS = {"demo": Section(lambda: table(read_json(OUT)), (OUT,))}


def main() -> int:
    md = SECTIONS["demo"]()
    print(md)
    replace_section("demo", md, readme=HERE.parent / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
