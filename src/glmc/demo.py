"""The paper's experiment end to end on embedded data: ``glmc demo``.

Two character-level GPT-2s on Tiny Shakespeare and two ViTs on MNIST (different seeds) are
trained, or reused from a cache folder; B is aligned to A with every method; the test loss is
measured along θ(λ) = λ·θ_A + (1 − λ)·π(θ_B); a table shaped like the paper's (rows: methods,
columns: datasets, cells: loss barrier) is printed, and plots, a Markdown report and the numbers
as JSON go to the output folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from glmc.barrier import AlignOptions, BarrierReport, run_barrier
from glmc.data import load_dataset
from glmc.io.atomic import write_text
from glmc.io.folders import write_json
from glmc.matching.learned import LearnedMatchingOptions
from glmc.plots import plot_barriers
from glmc.training import TrainConfig, train

#: The paper's test-loss barriers (mean of runs) for the columns the demo reproduces.
PAPER = {
    "none": {"shakespeare": 2.02, "mnist": 1.69},
    "weight": {"shakespeare": 0.34, "mnist": 0.36},
    "learned-perm": {"shakespeare": 0.63, "mnist": 0.45},
    "learned": {"shakespeare": 0.02, "mnist": 0.00},
}
PAPER_NOTE = ("paper: GPT-2 on Tiny Shakespeare; ViT on CIFAR-10 (the MNIST column lists the "
              "paper's CIFAR-10 figures for scale)")
METHOD_TITLES = {
    "none": "vanilla averaging",
    "weight": "weight matching (orthogonal residual)",
    "weight-perm": "weight matching, permutations only",
    "learned": "learned matching (full group)",
    "learned-perm": "learned matching, permutations only",
}
METHODS = ("none", "weight", "weight-perm", "learned", "learned-perm")


@dataclass(frozen=True)
class DemoPair:
    key: str
    title: str
    train: TrainConfig  # the seed is set per model


@dataclass
class DemoResult:
    experiments: list[DemoPair]
    reports: dict[str, BarrierReport]
    results: dict  # the JSON written to results.json


def pairs(quick: bool) -> list[DemoPair]:
    """The two experiments; ``quick`` shrinks everything to about a minute in total."""
    if quick:
        gpt = TrainConfig(arch="gpt2", data="shakespeare", n_layer=1, n_embd=32, n_head=2,
                          context=32, steps=60, batch_size=16, lr=3e-3, eval_every=0,
                          eval_batches=2, checkpoint_every=0, threads=1)
        vit = TrainConfig(arch="vit", data="mnist5k", n_layer=1, n_embd=32, n_head=2,
                          patch_size=7, steps=60, batch_size=32, lr=3e-3, eval_every=0,
                          eval_batches=2, checkpoint_every=0, threads=1)
    else:
        gpt = TrainConfig(arch="gpt2", data="shakespeare", n_layer=3, n_embd=128, n_head=4,
                          context=64, steps=1000, batch_size=32, lr=3e-3, eval_every=250,
                          eval_batches=8, checkpoint_every=100, threads=1)
        vit = TrainConfig(arch="vit", data="mnist5k", n_layer=3, n_embd=128, n_head=4,
                          patch_size=4, steps=1000, batch_size=64, lr=2e-3, eval_every=250,
                          eval_batches=8, checkpoint_every=100, threads=1)
    return [DemoPair("shakespeare", "GPT-2 / Tiny Shakespeare", gpt),
            DemoPair("mnist", "ViT / MNIST (5k)", vit)]


def _digest(cfg: TrainConfig) -> str:
    d = dataclasses.asdict(cfg)
    for k in ("threads", "device", "checkpoint_every"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def model_folder(cache: Path, pair: DemoPair, seed: int) -> Path:
    cfg = dataclasses.replace(pair.train, seed=seed)
    return cache / f"{pair.train.arch}-{pair.key}-{_digest(cfg)}-seed{seed}"


def _train_one(cfg: TrainConfig, folder: str) -> dict:
    """Train (or finish, or reuse) one model; runs in a worker process with one thread."""
    import torch

    torch.set_num_threads(1)
    return train(cfg, folder, resume=True, progress=False)


def train_models(jobs: list[tuple[TrainConfig, Path]], parallel: int,
                 note: Callable[[str], None]) -> None:
    """Train what the cache lacks, ``parallel`` models at a time (one thread each)."""
    todo = [(c, f) for c, f in jobs if not (f / "glmc_train.json").is_file()]
    for c, f in jobs:
        if (c, f) not in todo:
            note(f"reusing {f}")
    if not todo:
        return
    note(f"training {len(todo)} model(s), {parallel} at a time "
         "(an interrupted run resumes from its checkpoint)")
    if parallel <= 1:
        for c, f in todo:
            _train_one(c, str(f))
            note(f"trained {f}")
        return
    with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_train_one, c, str(f)): f for c, f in todo}
        for fut, f in futures.items():
            fut.result()
            note(f"trained {f}")


def run_demo(
    out: str | Path = "glmc-demo",
    cache: str | Path = "glmc-cache",
    *,
    quick: bool = False,
    methods: tuple[str, ...] = METHODS,
    points: int = 11,
    learned_steps: int | None = None,
    parallel: int | None = None,
    note: Callable[[str], None] = print,
    progress=None,
) -> DemoResult:
    """Train (or reuse) the demo models, measure every method's barrier, write the report.

    Returns the reports and the results (also written to ``out/results.json``).
    """
    t0 = time.perf_counter()
    out, cache = Path(out), Path(cache)
    experiments = pairs(quick)
    for p in experiments:  # a missing dataset fails here, before any training
        load_dataset(p.train.data, seed=p.train.data_seed)
    jobs = [(dataclasses.replace(p.train, seed=s), model_folder(cache, p, s))
            for p in experiments for s in (0, 1)]
    parallel = parallel or min(2, os.cpu_count() or 1)
    train_models(jobs, parallel, note)
    t_train = time.perf_counter() - t0
    steps = learned_steps or (40 if quick else 300)
    learned = LearnedMatchingOptions(steps=steps, batch_size=16 if quick else 32,
                                     eval_every=max(10, steps // 10), patience=4)
    reports: dict[str, BarrierReport] = {}
    for p in experiments:
        a, b = model_folder(cache, p, 0), model_folder(cache, p, 1)
        note(f"{p.title}: aligning and measuring {', '.join(methods)}")
        options = AlignOptions(learned=learned)
        rep = run_barrier(a, b, p.train.data, methods=methods, points=points,
                          options=options, seed=p.train.data_seed, label=p.title,
                          max_batches=4 if quick else None, progress=progress)
        reports[p.key] = rep
    out.mkdir(parents=True, exist_ok=True)
    plots = {k: plot_barriers(r, out / f"barrier-{k}.png", title=r.label)
             for k, r in reports.items()}
    results = {
        "quick": quick, "seconds": {"total": round(time.perf_counter() - t0, 1),
                                    "training": round(t_train, 1)},
        "models": {p.key: {"a": str(model_folder(cache, p, 0)),
                           "b": str(model_folder(cache, p, 1)),
                           "train": dataclasses.asdict(p.train)} for p in experiments},
        "barriers": {k: r.to_json() for k, r in reports.items()},
        "plots": {k: str(v) for k, v in plots.items()},
    }
    write_json(out / "results.json", results)
    write_text(out / "report.md", markdown_report(experiments, reports, results))
    return DemoResult(experiments, reports, results)


def table_rows(experiments: list[DemoPair], reports: dict[str, BarrierReport]) -> list[list[str]]:
    """Rows: methods; columns: test-loss barrier per experiment (paper's figure beside it)."""
    rows = []
    methods = list(next(iter(reports.values())).methods)
    for m in methods:
        row = [METHOD_TITLES.get(m, m)]
        for p in experiments:
            r = reports[p.key].methods[m]
            paper = PAPER.get(m, {}).get(p.key)
            row.append(f"{r.loss_barrier:.3f}" + (f" ({paper:.2f})" if paper is not None else ""))
        rows.append(row)
    return rows


def endpoint_rows(experiments: list[DemoPair],
                  reports: dict[str, BarrierReport]) -> list[list[str]]:
    rows = []
    for p in experiments:
        r = next(iter(reports[p.key].methods.values()))
        acc = (f"{100 * r.acc_a:.1f}% / {100 * r.acc_b:.1f}%"
               if r.acc_a is not None and r.acc_b is not None else "-")
        rows.append([p.title, f"{r.loss_a:.3f} / {r.loss_b:.3f}", acc])
    return rows


def markdown_report(experiments: list[DemoPair], reports: dict[str, BarrierReport],
                    results: dict) -> str:
    head = ["method"] + [p.title for p in experiments]
    n = len(next(iter(reports.values())).lambdas)
    lines = ["# glmc demo", "",
             f"Test-loss barrier on the line θ(λ) = λ·A + (1−λ)·π(B), {n} points; in brackets "
             "the paper's figure (" + PAPER_NOTE + ").", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(experiments, reports)]
    lines += ["", "Endpoints (test): loss A / B, accuracy A / B", "",
              "| experiment | loss A / B | accuracy A / B |", "|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in endpoint_rows(experiments, reports)]
    lines += ["", "Models:", ""]
    for p in experiments:
        t = p.train
        lines.append(f"- {p.title}: {t.n_layer} layers, d={t.n_embd}, {t.n_head} heads, "
                     f"MLP {t.n_inner or 4 * t.n_embd}, {t.steps} steps of batch {t.batch_size}"
                     f" ({results['models'][p.key]['a']}, {results['models'][p.key]['b']})")
    lines += ["", f"Total time {results['seconds']['total']} s (training "
              f"{results['seconds']['training']} s).", ""]
    lines += [f"![{k}]({Path(v).name})" for k, v in results["plots"].items()]
    return "\n".join(lines) + "\n"
