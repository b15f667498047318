"""N models merged in one frame: time and merged accuracy beside the models' own.

Trains N MLPs of Git Re-Basin's shape (3 hidden layers of 512, no norm) on MNIST 5k from seeds
0..N-1 (cached under ``--cache``), then merges them with uniform weights: averaged as they are
(no alignment), after the star alignment (each to the first), after MergeMany (each in turn
to the mean of the others) and after universe matching (every map at once, Frank-Wolfe),
timing each alignment and recording the cycle error of the pairs' own matchings against
each frame. Prints a table and writes JSON.

    python benchmarks/many_models.py                    # N = 8
    python benchmarks/many_models.py --n 4 --steps 300 --out /tmp/many.json
    python benchmarks/many_models.py --screen-start     # run 'start' of many_models.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _common import HERE, RESULTS, machine, write_run

from glmc.api import merge_many
from glmc.evaluate import evaluate
from glmc.io.folders import load_model
from glmc.matching.many import weighted_mean
from glmc.training import TrainConfig, train


def trained(cache: Path, n: int, steps: int, threads: int) -> list[Path]:
    folders = []
    for seed in range(n):
        folder = cache / f"mlp512-mnist5k-{steps}-seed{seed}"
        if not folder.exists():
            cfg = TrainConfig(arch="mlp", data="mnist5k", norm="none", steps=steps,
                              batch_size=64, lr=1e-3, seed=seed, eval_every=0, eval_batches=1,
                              checkpoint_every=0, threads=threads)
            train(cfg, folder, progress=False)
        folders.append(folder)
    return folders


def screen_start(models: list) -> list[dict]:
    """Universe matching's start chosen on validation data alone: the merged model's
    validation loss from each start (the star and MergeMany frames beside), for the first 3
    models and for all."""
    from glmc.matching.frames import find_frame
    from glmc.matching.universe import universe

    rows = []
    for n in sorted({3, len(models)}):
        subset = models[:n]
        runs = {"star": lambda s=subset: find_frame("star", s),
                "mergemany": lambda s=subset: find_frame("mergemany", s),
                "universe from the star": lambda s=subset: universe(s, start="star"),
                "universe from the barycenter": lambda s=subset: universe(s,
                                                                          start="barycenter")}
        for what, run in runs.items():
            t0 = time.perf_counter()
            frame = run()
            seconds = time.perf_counter() - t0
            moved = frame.moved(subset)
            merged = subset[0].with_state(weighted_mean([m.state for m in moved], [1 / n] * n))
            r = evaluate(merged, "mnist5k", "val")
            rows.append({"n": n, "what": what, "val_loss": r.loss, "val_accuracy": r.accuracy,
                         "seconds": round(seconds, 2), "iterations": len(frame.trace) or None})
            print(f"N = {n}, {what}: validation loss {r.loss:.4f} ({100 * r.accuracy:.1f}%), "
                  f"{seconds:.1f} s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=HERE.parent / "glmc-cache" / "many")
    ap.add_argument("--out", type=Path, default=RESULTS / "many_models.json")
    ap.add_argument("--screen-start", action="store_true",
                    help="instead: universe matching's start, on validation data only")
    ap.add_argument("--run", default=None, help="the name of this run inside --out "
                    "(default: 'start' with --screen-start, else 'default')")
    args = ap.parse_args()
    run = args.run or ("start" if args.screen_start else "default")
    import torch

    torch.set_num_threads(args.threads)
    folders = trained(args.cache, args.n, args.steps, args.threads)
    models = [load_model(f).canonical for f in folders]
    if args.screen_start:
        write_run(args.out, run, {"machine": machine(), "n": args.n, "steps": args.steps,
                                  "rows": screen_start(models)})
        print(f"wrote {args.out}")
        return
    alone = [evaluate(m, "mnist5k") for m in models]
    rows = [{"what": f"model {i + 1} alone", "loss": r.loss, "accuracy": r.accuracy}
            for i, r in enumerate(alone)]
    vanilla = models[0].with_state(weighted_mean([m.state for m in models],
                                                 [1 / len(models)] * len(models)))
    r = evaluate(vanilla, "mnist5k")
    rows.append({"what": "averaged as they are", "loss": r.loss, "accuracy": r.accuracy})
    for frame in ("star", "mergemany", "universe"):
        t0 = time.perf_counter()
        out = merge_many(models, frame=frame)
        seconds = time.perf_counter() - t0
        r = evaluate(out.model, "mnist5k")
        rows.append({"what": f"merged after {frame}", "loss": r.loss, "accuracy": r.accuracy,
                     "seconds": round(seconds, 2), "rounds": len(out.frame.rounds),
                     "iterations": len(out.frame.trace) or None,
                     "converged": out.frame.converged,
                     "cycle_error_pairwise": out.settings["cycle_error_pairwise"]})
    mean_acc = sum(x.accuracy for x in alone) / len(alone)
    print(f"{args.n} MLPs (3x512), MNIST 5k test split; models' mean accuracy "
          f"{100 * mean_acc:.1f}%")
    print("| what | test loss | accuracy | alignment s |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['what']} | {row['loss']:.3f} | {100 * row['accuracy']:.1f}% | "
              f"{row.get('seconds', '')} |")
    write_run(args.out, run, {"machine": machine(), "n": args.n, "steps": args.steps,
                              "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
