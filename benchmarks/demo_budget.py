"""The demo's budgets, chosen on validation data: what fits `glmc demo` into 10 minutes on
2 cores without changing what its figures say.

Two measurements, both on the **validation** split (11-point loss barrier, the library's
``run_barrier``), one thread per process:

- ``learned``: learned matching's steps, batch and learning rate on the demo's GPT-2 pair
  (its most expensive method on its most expensive pair);
- ``vit``: a ViT pair with 7x7 patches (17 tokens instead of 4x4's 50) trained for 600 steps,
  every demo method on it: the order of the methods must stay that of the 4x4 pair.

    python benchmarks/demo_budget.py                        # both (about 15 minutes here)
    python benchmarks/demo_budget.py --only learned --budgets 300x32x0.01,500x32x0.01
    python benchmarks/demo_budget.py --table                # print the table from the JSON

Writes benchmarks/results/demo_budget.json and its table in benchmarks/README.md (each row
with its run: commit, date, machine, threads).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import RESULTS, Section, machine, provenance, read_json, replace_section, write_json

OUT = RESULTS / "demo_budget.json"
VIT = dict(arch="vit", data="mnist5k", n_layer=3, n_embd=128, n_head=4, patch_size=7,
           steps=600, batch_size=64, lr=2e-3, eval_every=200, eval_batches=8,
           checkpoint_every=100, threads=1, data_seed=0)
METHODS = ("none", "activation", "weight", "weight-perm", "learned", "learned-perm")


def barriers(a: Path, b: Path, data: str, methods: tuple[str, ...], steps: int, batch: int,
             lr: float) -> list[dict]:
    """Validation barriers of ``methods`` on the pair, learned matching at the budget."""
    from glmc.barrier import run_barrier
    from glmc.matching.options import LearnedMatchingOptions
    from glmc.methods import AlignOptions

    lo = LearnedMatchingOptions(steps=steps, batch_size=batch, lr=lr,
                                eval_every=min(100, steps))
    rep = run_barrier(str(a), str(b), data, methods=methods, split="val",
                      options=AlignOptions(learned=lo))
    return [{"method": m, "steps": steps, "batch": batch, "lr": lr,
             "val_loss_barrier": r.loss_barrier, "acc_barrier": r.acc_barrier,
             "align_s": round(r.align_seconds, 1), **provenance()}
            for m, r in rep.methods.items()]


def learned_rows(cache: Path, budgets: list[tuple[int, int, float]]) -> list[dict]:
    from glmc.demo import model_folder, pairs

    gpt = next(p for p in pairs(quick=False) if p.key == "shakespeare")
    a, b = model_folder(cache, gpt, 0), model_folder(cache, gpt, 1)
    if not (a / "glmc_train.json").is_file() or not (b / "glmc_train.json").is_file():
        raise SystemExit(f"the demo's GPT-2 pair is not in {cache}: run glmc demo --cache "
                         f"{cache} first")
    rows = []
    for steps, batch, lr in budgets:
        rows += barriers(a, b, "shakespeare", ("learned",), steps, batch, lr)
        print(rows[-1], flush=True)
    return rows


def vit_rows(cache: Path) -> list[dict]:
    from glmc.training import TrainConfig, train

    folders = []
    for seed in (0, 1):
        folder = cache / f"demo-budget-vit-p7-seed{seed}"
        if not (folder / "glmc_train.json").is_file():
            t0 = time.perf_counter()
            train(TrainConfig(**VIT, seed=seed), folder, resume=True, progress=False)
            print(f"trained {folder} in {time.perf_counter() - t0:.0f} s", flush=True)
        folders.append(folder)
    rows = barriers(folders[0], folders[1], "mnist5k", METHODS, 400, 32, 1e-2)
    for r in rows:
        print(r, flush=True)
    return rows


def table(data: dict) -> str:
    lines = ["| pair | method | steps × batch, lr | validation loss barrier |", "|---|---|---|---|"]
    for part, title in (("learned", "GPT-2 demo pair"), ("vit", "ViT 7x7 patches, 600 steps")):
        for r in data.get(part, []):
            lines.append(f"| {title} | {r['method']} | {r['steps']} × {r['batch']}, {r['lr']:g} "
                         f"| {r['val_loss_barrier']:.3f} |")
    runs = {(r["commit"], r["date"][:10]) for part in ("learned", "vit")
            for r in data.get(part, [])}
    lines.append("")
    lines.append("Runs: " + "; ".join(f"commit {c}, {d}" for c, d in sorted(runs)) + ".")
    return "\n".join(lines)


SECTIONS = {"demo_budget": Section(lambda: table(read_json(OUT)), (OUT,))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, default=Path("glmc-cache"),
                   help="the demo's model cache (its GPT-2 pair must be there)")
    p.add_argument("--only", choices=("learned", "vit"), default=None)
    p.add_argument("--budgets", default="300x32x0.01,500x32x0.01,1000x32x0.01,"
                   "500x32x0.02,500x32x0.04", help="STEPSxBATCHxLR, comma-separated")
    p.add_argument("--table", action="store_true")
    args = p.parse_args()
    data = read_json(OUT) or {}
    if not args.table:
        import torch

        torch.set_num_threads(1)
        if args.only in (None, "learned"):
            budgets = [(int(s), int(b), float(lr)) for s, b, lr in
                       (x.split("x") for x in args.budgets.split(","))]
            data["learned"] = learned_rows(args.cache, budgets)
        if args.only in (None, "vit"):
            data["vit"] = vit_rows(args.cache)
        data["machine"] = machine()
        write_json(OUT, data)
    print(table(data))
    replace_section("demo_budget", table(data))


if __name__ == "__main__":
    main()
