"""A narrower MLP aligned to a wider one: the barrier against the width ratio (convnet
family).

A is Git Re-Basin's MLP (3 hidden layers of 512, no norm; MNIST 5k, 1,000 steps, seed 0: the
many-models benchmark's first model, from its cache); each B is the same recipe with 256,
128 or 64 units per layer, seed 1. B is embedded exactly into A's shapes with zero units
(glmc.families.convnet.widen), then averaged as it is (``canonical``) or after weight,
activation or learned matching (the library's defaults), and the test-loss barrier of the
line between A and B at A's width measured as ``glmc barrier`` does. ``--variants fill
zeros``: B's free entries (its extra units' weights) take A's values once aligned (the
library's way), or stay zero as embedded. Prints a table, writes JSON.

    python benchmarks/widths_mlp.py --cache /work/cache/many
    python benchmarks/widths_mlp.py --variants fill zeros
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import HERE, RESULTS, machine, provenance, write_json

from glmc.barrier import run_barrier
from glmc.io.folders import canonical, load_model
from glmc.methods import AlignOptions
from glmc.model import CanonicalModel, fitted
from glmc.training import TrainConfig, train

METHODS = ("canonical", "weight", "activation", "learned")


def trained(cache: Path, units: int, seed: int, steps: int) -> Path:
    """The many-models benchmark's recipe at ``units`` per layer (its folder name at 512)."""
    name = f"mlp512-mnist5k-{steps}-seed{seed}" if units == 512 else (
        f"mlp{units}-mnist5k-{steps}-seed{seed}")
    folder = cache / name
    if not (folder / "glmc_train.json").is_file():
        cfg = TrainConfig(arch="mlp", data="mnist5k", norm="none", base=units, steps=steps,
                          batch_size=64, lr=1e-3, seed=seed, eval_every=0, eval_batches=1,
                          checkpoint_every=0, threads=1)
        train(cfg, folder, progress=False)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, default=HERE.parent / "glmc-cache" / "many")
    ap.add_argument("--units", type=int, nargs="*", default=[256, 128, 64],
                    help="B's units per layer (A has 512)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="*", default=["fill"], choices=("fill", "zeros"))
    ap.add_argument("--out", type=Path, default=RESULTS / "widths_mlp.json")
    args = ap.parse_args()
    import torch

    a = trained(args.cache, 512, 0, args.steps)
    torch.set_num_threads(args.threads)
    rows = []
    for units, variant in ((u, v) for u in args.units for v in args.variants):
        b = trained(args.cache, units, 1, args.steps)
        torch.set_num_threads(args.threads)
        mb = fitted(canonical(load_model(a)), canonical(load_model(b)))
        if variant == "zeros":
            mb = CanonicalModel(mb.config, mb.state, mb.files)
        rep = run_barrier(str(a), mb, "mnist5k", methods=METHODS, options=AlignOptions(seed=0))
        first = rep.methods["weight"]
        row = {"ratio": units / 512, "units_b": units, "variant": variant, "b": str(b),
               "loss_a": first.loss_a,
               "loss_b": first.loss_b,
               **{f"barrier_{m}": res.loss_barrier for m, res in rep.methods.items()},
               **{f"acc_barrier_{m}": res.acc_barrier for m, res in rep.methods.items()}}
        rows.append(row)
        print(f"B {units} units ({row['ratio']:g} of A), {variant}: loss A {row['loss_a']:.3f}, B "
              f"{row['loss_b']:.3f}; barriers "
              + ", ".join(f"{m} {row[f'barrier_{m}']:.3f}" for m in METHODS), flush=True)
    print("| B / A | B's units | variant | loss A | loss B | " + " | ".join(METHODS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(METHODS))
    for row in rows:
        print(f"| {row['ratio']:g} | {row['units_b']} | {row['variant']} | {row['loss_a']:.3f} | "
              f"{row['loss_b']:.3f} | "
              + " | ".join(f"{row[f'barrier_{m}']:.3f}" for m in METHODS) + " |")
    write_json(args.out, {"benchmark": "widths_mlp", "machine": machine(),
                          "run": provenance(threads=args.threads), "a": str(a), "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
