"""The screen that chooses weight matching's defaults: its options one at a time, on pairs the
results table never reports, measured on the validation split.

The pairs differ from the quality suite's (benchmarks/quality.py) in seeds, shapes and
recipes: GPT-2s of 2 to 6 layers, ViTs, a Llama and a GPT-NeoX, trained by glmc's trainer
with other learning rates, batch sizes and step counts, and some trained by a plain
transformers training loop in this script ("other code": AdamW at a constant rate after a
warm-up, no weight decay on anything, no gradient clipping). Each variant's barrier is the
validation loss barrier on an 11-point grid (the library's canonical evaluation of A and
π(B)), and variants are ranked by the geometric mean, over the pairs, of their barrier
relative to vanilla averaging's on the same pair. A variant replaces the defaults of
``glmc.matching.options.WeightMatchingOptions`` only where its geometric mean is lower by at
least :data:`ADOPT_MARGIN` (a smaller difference is well inside the spread of the per-pair
ratios, which the verdict line reports); that line says which variant, if any, did.

    python benchmarks/screen.py --train-only      # train the screen's pairs (about 40 min)
    python benchmarks/screen.py                   # every pair, every variant
    python benchmarks/screen.py --table           # the table again from screen.json

Writes benchmarks/results/screen.json (every row with its commit, date, machine, threads)
and the table in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

from _common import RESULTS, Section, provenance, read_json, replace_section, write_json

from glmc.training import TrainConfig

OUT = RESULTS / "screen.json"
#: How much lower (relatively) a variant's geometric mean must be to replace the defaults.
ADOPT_MARGIN = 0.05
#: name -> weight-matching options (the defaults first).
VARIANTS: dict[str, dict] = {
    "defaults": {},
    "unit cost: distance": {"unit_cost": "distance"},
    "weighting: layer": {"weighting": "layer"},
    "weighting: none": {"weighting": "none"},
    "bias weight 1.0": {"bias_weight": 1.0},
    "bias weight 0.1": {"bias_weight": 0.1},
    "qk weight 0.5": {"role_weights": {"qk": 0.5}},
    "qk weight 0.25": {"role_weights": {"qk": 0.25}},
    "inner maps: orthogonal": {"inner": "orthogonal"},
    "start: spectral": {"init": "spectral"},
    "start: identity": {"init": "identity"},
    "40 iterations, no tolerance": {"max_iter": 40, "tol": -1.0},
}


@dataclasses.dataclass(frozen=True)
class ScreenPair:
    key: str
    train: TrainConfig
    other_code: bool = False  # trained by this script's plain loop, not glmc's trainer


def _cfg(**kw) -> TrainConfig:
    base = dict(data="shakespeare", eval_every=0, eval_batches=4, checkpoint_every=0,
                threads=1)
    return TrainConfig(**(base | kw))


def pairs() -> list[ScreenPair]:
    return [
        ScreenPair("gpt2-2l-lr1e-3", _cfg(arch="gpt2", n_layer=2, n_embd=64, n_head=2,
                                          context=64, steps=2000, batch_size=16, lr=1e-3)),
        ScreenPair("gpt2-3l-other", _cfg(arch="gpt2", n_layer=3, n_embd=96, n_head=4,
                                         context=64, steps=800, batch_size=32, lr=3e-3),
                   other_code=True),
        ScreenPair("gpt2-4l-bs64", _cfg(arch="gpt2", n_layer=4, n_embd=128, n_head=4,
                                        context=64, steps=600, batch_size=64, lr=2e-3)),
        ScreenPair("gpt2-6l-other", _cfg(arch="gpt2", n_layer=6, n_embd=64, n_head=4,
                                         context=64, steps=1000, batch_size=32, lr=1e-3),
                   other_code=True),
        ScreenPair("vit-2l", _cfg(arch="vit", data="mnist5k", n_layer=2, n_embd=64, n_head=4,
                                  patch_size=7, steps=1000, batch_size=64, lr=1e-3)),
        ScreenPair("vit-4l-other", _cfg(arch="vit", data="mnist5k", n_layer=4, n_embd=96,
                                        n_head=4, patch_size=4, steps=600, batch_size=128,
                                        lr=3e-3), other_code=True),
        ScreenPair("llama-3l", _cfg(arch="llama", n_layer=3, n_embd=96, n_head=4, context=64,
                                    steps=800, batch_size=32, lr=3e-3)),
        ScreenPair("neox-2l", _cfg(arch="gpt-neox", n_layer=2, n_embd=96, n_head=4,
                                   context=64, steps=800, batch_size=32, lr=2e-3)),
    ]


#: The screen's seeds: never the quality suite's (0 and 1).
SEEDS = (100, 101)


def folder(cache: Path, pair: ScreenPair, seed: int) -> Path:
    return cache / f"screen-{pair.key}-seed{seed}"


def train_other(cfg: TrainConfig, out: Path) -> None:
    """A plain transformers training loop (not glmc's trainer): the stock class from the same
    config, AdamW at ``cfg.lr`` after a linear warm-up of 50 steps, no weight decay, no
    clipping; the data's train split in random batches. Saves a Hugging Face folder with the
    data's tokenizer beside it."""
    import torch

    from glmc.data import save_tokenizer
    from glmc.families import arch_named
    from glmc.training.config import load_training_data

    torch.manual_seed(cfg.seed)
    ds = load_training_data(cfg)
    arch = arch_named(cfg.arch)
    hf = arch.model_config(cfg, ds)
    model = arch.build(hf).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    text = hasattr(ds, "tokenizer")
    g = torch.Generator().manual_seed(cfg.seed)
    batches = ds.batches("train", cfg.batch_size, cfg.context if text else None, generator=g)
    for _ in range(cfg.steps):
        x, y = next(batches)
        logits = arch.logits(model, x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    out.mkdir(parents=True, exist_ok=True)
    arch.save(model.eval(), hf, out)
    if text:
        save_tokenizer(out, ds.tokenizer)


def train_all(chosen: list[ScreenPair], cache: Path) -> None:
    import torch

    from glmc.training import train

    torch.set_num_threads(1)
    for pair in chosen:
        for seed in SEEDS:
            out = folder(cache, pair, seed)
            if (out / "config.json").is_file():
                continue
            t0 = time.perf_counter()
            cfg = dataclasses.replace(pair.train, seed=seed)
            if pair.other_code:
                train_other(cfg, out)
            else:
                train(cfg, out, progress=False)
            print(f"trained {out} in {time.perf_counter() - t0:.0f} s", flush=True)


def measure(pair: ScreenPair, cache: Path) -> dict:
    """Every variant's validation barrier on one pair (and vanilla averaging's)."""
    import glmc
    from glmc.barrier import barrier, barrier_batches, lambda_grid, run_barrier
    from glmc.evaluate import Evaluator

    a, b = (str(folder(cache, pair, s)) for s in SEEDS)
    data = pair.train.data
    none = run_barrier(a, b, data, methods=("none",), split="val").methods["none"]
    ma, mb, batches = barrier_batches(a, b, data, split="val")
    ev, grid = Evaluator(ma.config, batches), lambda_grid(11)
    rows = {"vanilla": {"loss_barrier": none.loss_barrier, **provenance()}}
    for name, kw in VARIANTS.items():
        t0 = time.perf_counter()
        al = glmc.align(ma, mb, **kw)
        seconds = time.perf_counter() - t0
        losses = [r.loss for r in ev.evaluate_path(ma.state, al.aligned.state, grid)]
        rows[name] = {"options": kw, "loss_barrier": barrier(grid, losses),
                      "ratio": barrier(grid, losses) / max(none.loss_barrier, 1e-9),
                      "relative_distance": al.match.relative, "align_seconds": round(seconds, 2),
                      **provenance()}
        print(f"{pair.key}: {name}: {rows[name]['loss_barrier']:.3f} "
              f"({rows[name]['ratio']:.3f} of vanilla {none.loss_barrier:.3f})", flush=True)
    return rows


def ranking(run: dict) -> list[tuple[str, float]]:
    """One run's variants by the geometric mean of their ratio to vanilla (lower is better)."""
    out = []
    for name in VARIANTS:
        ratios = [r[name]["ratio"] for r in run["pairs"].values() if name in r]
        if ratios:
            out.append((name, math.exp(sum(math.log(max(x, 1e-6)) for x in ratios)
                                       / len(ratios))))
    return sorted(out, key=lambda kv: kv[1])


def paired(results: dict, name: str) -> list[float]:
    """Per pair of every run, the log of variant ``name``'s ratio over the defaults'."""
    return [math.log(r[name]["ratio"] / r["defaults"]["ratio"])
            for run in results["runs"] for r in run["pairs"].values() if name in r]


def verdict(results: dict) -> str:
    """One sentence: the variant that replaces the defaults, or why none does, from every
    run's pairs together (a run on another machine trains other models from the same
    recipes: more pairs, not the same ones again), with the paired evidence (per pair, the
    log of the variant's ratio over the defaults')."""
    logs = {name: paired(results, name) for name in VARIANTS if name != "defaults"}
    means = {name: sum(x) / len(x) for name, x in logs.items() if x}
    best = min(means, key=means.get)
    x, mean = logs[best], means[best]
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / max(len(x) - 1, 1))
    runs = len({run["machine"] for run in results["runs"]
                if any(best in r for r in run["pairs"].values())})
    evidence = (f"better on {sum(v < 0 for v in x)} of {len(x)} pairs of {runs} run"
                f"{'s' if runs > 1 else ''}; per pair the log ratio to the defaults is "
                f"{mean:+.3f} on average, standard deviation {sd:.3f}")
    gain = 1 - math.exp(mean)
    if gain >= ADOPT_MARGIN:
        return (f"**{best}** lowers the geometric mean by {gain:.1%} (at least "
                f"{ADOPT_MARGIN:.0%} needed; {evidence}): it replaces the defaults.")
    return (f"The best variant over every run's pairs, {best}, lowers the geometric mean by "
            f"{max(gain, 0):.1%} ({evidence}), less than the {ADOPT_MARGIN:.0%} a variant "
            f"needs to replace the defaults: they stay.")


def table(results: dict) -> str:
    """The latest run's table, each variant's change over every run's pairs beside it, the
    verdict, and the runs."""
    run = results["runs"][-1]
    keys = list(run["pairs"])
    geo = dict(ranking(run))
    lines = ["| weight matching (validation barrier / vanilla) | " + " | ".join(keys)
             + " | geomean | every run: geomean vs defaults (pairs) |",
             "|---|" + "---|" * (len(keys) + 2)]
    lines.append("| vanilla averaging (barrier) | " + " | ".join(
        f"{run['pairs'][k]['vanilla']['loss_barrier']:.3f}" for k in keys) + " | – | – |")
    for name in VARIANTS:
        cells = [f"{run['pairs'][k][name]['ratio']:.3f}" if name in run["pairs"][k]
                 else "–" for k in keys]
        logs = paired(results, name)
        pooled = (f"{math.exp(sum(logs) / len(logs)) - 1:+.1%} ({len(logs)})"
                  if name != "defaults" and logs else "–")
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {geo.get(name, math.nan):.3f} | {pooled} |")
    lines += ["", verdict(results), ""]
    for i, r in enumerate(results["runs"]):
        first = next(iter(next(iter(r["pairs"].values())).values()))
        what = "The table's run" if i == len(results["runs"]) - 1 else f"Run {i + 1}"
        lines.append(f"{what}: commit {first['commit']}"
                     f"{' (with changes)' if first['dirty'] else ''}, {first['date']} UTC, "
                     f"{r['machine']}, {first['threads']} thread(s); geomean of the defaults "
                     f"{dict(ranking(r))['defaults']:.3f}.")
    return "\n".join(lines)


def with_run(results: dict, run: dict) -> dict:
    """``results`` (every run so far; the file's older one-run form read as one run) with
    ``run`` added, replacing a run of the same machine (the same models again)."""
    runs = results.get("runs") or ([{"pairs": results["pairs"], "machine": next(iter(
        next(iter(results["pairs"].values())).values()))["machine"]}]
        if "pairs" in results else [])
    runs = [r for r in runs if r["machine"] != run["machine"]] + [run]
    for r in runs:
        r["ranking"] = ranking(r)
    return {"runs": runs}


SECTIONS = {"screen": Section(lambda: table(read_json(OUT)), (OUT,))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="*", default=None, choices=[q.key for q in pairs()])
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--train-only", action="store_true")
    p.add_argument("--table", action="store_true",
                   help="print and write the table from screen.json, measuring nothing")
    args = p.parse_args(argv)
    if args.table:
        md = table(read_json(OUT))
        print(md)
        replace_section("screen", md)
        return 0
    import torch

    torch.set_num_threads(args.threads)
    chosen = [q for q in pairs() if args.pairs is None or q.key in args.pairs]
    cache = Path(args.cache)
    train_all(chosen, cache)
    if args.train_only:
        return 0
    run = {"pairs": {pair.key: measure(pair, cache) for pair in chosen},
           "machine": provenance()["machine"]}
    results = with_run(read_json(OUT), run)
    write_json(OUT, results)
    md = table(results)
    print(md)
    replace_section("screen", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
