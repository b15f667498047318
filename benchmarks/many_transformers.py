"""Three transformers in one frame: the merged model and the pairwise barriers, after weight
matching (MergeMany) and after learned refinement over the simplex.

The sets are the quality suite's demo pairs (``gpt2-demo``, ``vit-demo``) with a third seed:
seeds 0..N-1 of the same training config, trained with glmc's trainer and cached in the
quality suite's cache (seeds 0 and 1 are its pairs). For each set and method
(``weight``: MergeMany, and universe matching; ``learned``: MergeMany, then learned refinement
with λ ~ Dirichlet(α)),
:func:`glmc.many.many_barrier` on the test split reports each model's loss, their mean, the
uniformly merged model, and every pair's barrier in the joint frame beside the pair aligned
alone by the same method. The issue's targets: after learned refinement, the merged test loss
within 0.1 of the models' mean, and pairwise barriers in the joint frame at most 10% above
the pair's own.

    python benchmarks/many_transformers.py                       # both sets, both methods
    python benchmarks/many_transformers.py --sets vit-demo --methods weight
    python benchmarks/many_transformers.py --screen-edge-fraction 0 0.5 0.9 --run edges
    python benchmarks/many_transformers.py --screen-steps 1000 3000 --screen-alone --run steps
    python benchmarks/many_transformers.py --methods learned --learned-with steps=6000 \
        edge_fraction=0.9 edge_focus=100 --run 6000_focus
    python benchmarks/many_transformers.py --sets gpt2-demo --screen-seed 1 2 --alone-seeds 1 2 \
        --screen-with steps=6000 edge_fraction=0.9 edge_focus=100 --run seeds_gpt2

Every run goes into benchmarks/results/many_transformers.json under runs[--run] (default
"default"), with its commit, machine and command.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from pathlib import Path

from _common import HERE, RESULTS, machine, write_run
from quality import suite

from glmc.demo import train_models
from glmc.many import many_barrier
from glmc.matching.options import FRAMES, LearnedMatchingOptions
from glmc.methods import AlignOptions

SETS = ("gpt2-demo", "vit-demo")


def folders(cache: Path, key: str, n: int) -> tuple[list[Path], str]:
    """The set's model folders (trained where missing) and its dataset."""
    from quality import _folder

    pair = {p.key: p for p in suite()}[key]
    jobs = [(dataclasses.replace(pair.train, seed=s), _folder(cache, pair, s)) for s in range(n)]
    train_models(jobs, 1, lambda msg: print(msg, file=sys.stderr, flush=True))
    return [f for _, f in jobs], pair.train.data


def measure(models: list[Path], data: str, method: str, max_batches: int | None,
            frame: str = "mergemany", learned: dict | None = None, alone_seed: int = 0) -> dict:
    """The set merged and its pairs by ``method``; ``learned``: learned matching's options for
    the joint frame only (each pair alone keeps the library's defaults, with ``alone_seed``)."""
    t0 = time.perf_counter()
    r = many_barrier(models, data, method=method, max_batches=max_batches, frame=frame,
                     options=AlignOptions(seed=0).updated(**(learned or {})),
                     alone=AlignOptions(seed=alone_seed))
    out = r.to_json()
    out["alone_seed"] = alone_seed
    out["joint_learned_options"] = learned or {}
    if out["frame"].get("learned"):  # (the steps' log: every λ drawn; kept out of the record)
        out["frame"]["learned"].pop("log", None)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["merged_minus_mean"] = r.merged["loss"] - r.mean_loss
    out["worst_pair_ratio"] = max((p["ratio"] for p in r.pairs if p["ratio"] is not None),
                                  default=None)
    return out


def _point_barriers(models: list[Path], frame, data: str) -> dict:
    """Validation barriers of a frame: the centroid's loss minus the models' mean, and each
    pair's midpoint minus the pair's mean (one evaluation per point, on the val split)."""
    from glmc.evaluate import evaluate
    from glmc.io.folders import load_model
    from glmc.matching.many import weighted_mean

    moved = frame.moved([load_model(m).canonical for m in models])
    n = len(moved)
    ends = [evaluate(m, data, "val").loss for m in moved]

    def at(weights):
        return evaluate(moved[0].with_state(weighted_mean([m.state for m in moved], weights)),
                        data, "val").loss

    out = {"centroid": at([1 / n] * n) - sum(ends) / n}
    for i in range(n):
        for j in range(i + 1, n):
            w = [0.5 if k in (i, j) else 0.0 for k in range(n)]
            out[f"{i + 1}-{j + 1}"] = at(w) - (ends[i] + ends[j]) / 2
    return out


def _alone_barriers(models: list[Path], data: str, seed: int = 0) -> dict:
    """Validation barrier at the midpoint of each pair aligned alone by learned matching (the
    library's defaults but ``seed``), minus the pair's mean: what the joint frame's pairs are
    held to."""
    from glmc.api import align
    from glmc.evaluate import evaluate
    from glmc.io.folders import load_model
    from glmc.matching.many import weighted_mean

    canon = [load_model(m).canonical for m in models]
    out = {}
    for i in range(len(canon)):
        for j in range(i + 1, len(canon)):
            t0 = time.perf_counter()
            b = align(canon[i], canon[j], method="learned", data=data,
                      options=AlignOptions(seed=seed)).aligned
            ends = [evaluate(m, data, "val").loss for m in (canon[i], b)]
            mid = evaluate(b.with_state(weighted_mean([canon[i].state, b.state], [0.5, 0.5])),
                           data, "val").loss
            out[f"{i + 1}-{j + 1}"] = mid - sum(ends) / 2
            print(f"pair {i + 1}-{j + 1} alone (seed {seed}): validation midpoint barrier "
                  f"{out[f'{i + 1}-{j + 1}']:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def screen(models: list[Path], data: str, settings: list[dict],
           frame: str = "mergemany") -> list[dict]:
    """Learned refinement from ``frame``'s weight matching for each setting (e.g. the Dirichlet
    α, the edge fraction), chosen on validation only: the refinement's own estimate (its
    validation loss at the centroid and the pairs' midpoints minus the endpoints' line there),
    and each point's validation barrier; no test data read."""
    from glmc.api import merge_many

    rows = []
    for setting in settings:
        t0 = time.perf_counter()
        out = merge_many(models, method="learned", data=data, frame=frame,
                         options=AlignOptions(seed=0).updated(**setting))
        ln = out.settings["learned"]
        rows.append({**setting, "val_barrier_start": ln["start_barrier_estimate"],
                     "val_barrier": ln["barrier_estimate"], "best_step": ln["best_step"],
                     "val_points": _point_barriers(models, out.frame, data),
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{setting}: validation barrier {ln['start_barrier_estimate']:.4f} -> "
              f"{ln['barrier_estimate']:.4f} (best step {ln['best_step']}); points "
              f"{ {k: round(v, 3) for k, v in rows[-1]['val_points'].items()} }", flush=True)
    return rows


def screens(args) -> tuple[str, list[dict]] | None:
    """The screen asked for, if any: its name and one options' update per setting."""
    for name, key, values in (("alpha", "dirichlet_alpha", args.screen_alpha),
                              ("edge_fraction", "edge_fraction", args.screen_edge_fraction),
                              ("steps", "steps", args.screen_steps),
                              ("edge_focus", "edge_focus", args.screen_edge_focus),
                              ("seed", "seed", args.screen_seed)):
        if values:
            shared = learned_options(args.screen_with, "--screen-with")
            return name, [{**shared, key: v} for v in values]
    return None


def _pm(x: float | None, se: float | None) -> str:
    return "-" if x is None else f"{x:.2f}" + ("" if se is None else f" ± {se:.2f}")


def learned_options(items: list[str], flag: str) -> dict:
    """Learned matching's options from NAME=VALUE ``items`` (read before any model loads)."""
    defaults, out = LearnedMatchingOptions(), {}
    declared = typing.get_type_hints(LearnedMatchingOptions)
    for w in items:
        k, _, v = w.partition("=")
        if not hasattr(defaults, k):
            raise SystemExit(f"{flag} {w}: learned matching has no option {k!r}")
        kind = type(getattr(defaults, k))
        if getattr(defaults, k) is None:  # (an option whose default is None: its declared type)
            if v.lower() == "none":
                out[k] = None
                continue
            kind = next(t for t in typing.get_args(declared[k]) if t is not type(None))
        if kind is bool and v.lower() not in ("true", "false"):
            raise SystemExit(f"{flag} {w}: {k} is true or false")
        out[k] = v.lower() == "true" if kind is bool else kind(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    ap.add_argument("--methods", nargs="+", default=["weight", "learned"])
    ap.add_argument("--weight-frames", nargs="+", default=["mergemany", "universe"],
                    help="the frames weight matching is measured in (learned refinement "
                    "starts from --learned-frame's)")
    ap.add_argument("--learned-frame", choices=FRAMES, default="mergemany",
                    help="the weight-matching frame learned refinement starts from, in the "
                    "screens too (default: %(default)s)")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batches", type=int, default=None,
                    help="evaluation batches (default: the barrier command's)")
    ap.add_argument("--cache", type=Path, default=HERE.parent / "glmc-cache")
    ap.add_argument("--train-only", action="store_true")
    ap.add_argument("--screen-alpha", type=float, nargs="+", default=None, metavar="ALPHA",
                    help="instead: learned refinement for each α, on validation data only")
    ap.add_argument("--screen-edge-fraction", type=float, nargs="+", default=None,
                    metavar="F", help="instead: learned refinement for each edge fraction "
                    "(the default α), on validation data only")
    ap.add_argument("--screen-steps", type=int, nargs="+", default=None, metavar="S",
                    help="instead: learned refinement for each number of steps, on "
                    "validation data only")
    ap.add_argument("--screen-edge-focus", type=float, nargs="+", default=None,
                    metavar="F", help="instead: learned refinement for each edge focus (edges "
                    "drawn by the pairs' last validation barriers), on validation data only")
    ap.add_argument("--screen-seed", type=int, nargs="+", default=None, metavar="SEED",
                    help="instead: the joint frame for each seed (MergeMany's order, the data "
                    "order, the λ and edge draws), on validation data only: the run-to-run "
                    "spread")
    ap.add_argument("--screen-with", nargs="+", default=[], metavar="NAME=VALUE",
                    help="with a screen: learned matching's options every setting shares "
                    "(e.g. steps=3000)")
    ap.add_argument("--screen-alone", action="store_true",
                    help="with a screen: also each pair aligned alone by learned matching, "
                    "its validation midpoint barrier")
    ap.add_argument("--alone-seeds", type=int, nargs="+", default=[], metavar="SEED",
                    help="with a screen: also each pair aligned alone with each of these seeds "
                    "(the spread of what the joint frame's pairs are held to)")
    ap.add_argument("--alone-seed", type=int, default=0,
                    help="the seed each pair aligned alone is given (default: %(default)s)")
    ap.add_argument("--learned-with", nargs="+", default=[], metavar="NAME=VALUE",
                    help="learned refinement's options for the joint frame (e.g. steps=6000); "
                    "each pair alone keeps the library's defaults")
    ap.add_argument("--out", type=Path, default=RESULTS / "many_transformers.json")
    ap.add_argument("--run", default="default",
                    help="the name of this run inside --out (default: %(default)s)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    results: dict = {}
    screened = screens(args)
    joint_learned = learned_options(args.learned_with, "--learned-with")
    for key in args.sets:
        models, data = folders(args.cache, key, args.n)
        if args.train_only:
            continue
        if screened:
            name, rows = screened
            results[key] = {f"screen_{name}": screen(models, data, rows, args.learned_frame),
                            "learned_frame": args.learned_frame}
            if args.screen_alone:
                results[key]["val_points_alone"] = _alone_barriers(models, data)
            for seed in args.alone_seeds:
                results[key].setdefault("val_points_alone_by_seed", {})[str(seed)] = \
                    _alone_barriers(models, data, seed)
            continue
        results[key] = {}
        runs = [(m, f) for m in args.methods
                for f in (args.weight_frames if m == "weight" else [args.learned_frame])]
        for method, frame in runs:
            r = measure(models, data, method, args.max_batches, frame,
                        joint_learned if method.startswith("learned") else None,
                        args.alone_seed)
            method = method if frame == "mergemany" else f"{method} ({frame})"
            results[key][method] = r
            pairs = ", ".join(f"{p['pair'][0]}-{p['pair'][1]} {p['barrier_joint']:.3f} vs "
                              f"{p['barrier_pairwise']:.3f} "
                              f"(ratio {_pm(p['ratio'], p['ratio_se'])})" for p in r["pairs"])
            print(f"{key} {method}: models {[round(e['loss'], 3) for e in r['endpoints']]} "
                  f"mean {r['endpoints_mean_loss']:.3f}, merged {r['merged']['loss']:.3f} "
                  f"(+{r['merged_minus_mean']:.3f}); pairs joint vs alone: {pairs}; "
                  f"{r['seconds']} s", flush=True)
    if args.train_only:
        return
    if screened:
        name = screened[0]
        write_run(args.out, args.run, {"screen": name, "machine": machine(), "n": args.n,
                                       "results": results})
        print(f"wrote {args.out}")
        return
    print("| set | method | models' mean loss | merged | merged − mean | worst pair ratio |")
    print("|---|---|---|---|---|---|")
    for key, by in results.items():
        for method, r in by.items():
            ratio = r["worst_pair_ratio"]
            print(f"| {key} | {method} | {r['endpoints_mean_loss']:.3f} | "
                  f"{r['merged']['loss']:.3f} | {r['merged_minus_mean']:.3f} | "
                  f"{'-' if ratio is None else f'{ratio:.2f}'} |")
    write_run(args.out, args.run, {"machine": machine(), "n": args.n, "results": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
