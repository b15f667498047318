"""The paper's experiment end to end on embedded data: ``glmc demo``.

Two character-level GPT-2s on Tiny Shakespeare and two ViTs on MNIST (different seeds) are
trained, or reused from a cache folder, with Git Re-Basin's MNIST MLP beside them (3 hidden
layers of 512: permutations only, where the methods reduce to Git Re-Basin's); B is aligned
to A with every method; the test loss is measured along θ(λ) = λ·θ_A + (1 − λ)·π(θ_B); a
table shaped like the paper's (rows: methods, columns: datasets, cells: loss barrier) is
printed. The report also reproduces the paper's two
findings about the methods (:mod:`glmc.findings`): the barrier after k weight-matching
iterations for an orthogonal and a permutation-only residual map, and how far learned matching
moves from weight matching. Plots, a Markdown report and the numbers as JSON go to the output
folder. ``quick`` is a smoke test of the pipeline: its models are barely trained, and its
numbers are not comparable with the paper's (the report says so).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from glmc.barrier import AlignOptions, BarrierReport, barrier_batches, run_barrier
from glmc.data import load_dataset
from glmc.evaluate import Evaluator
from glmc.families.options import train_option
from glmc.families.registry import arch_named
from glmc.findings import IterationStudy, learned_moves, wm_iterations
from glmc.io.atomic import write_text
from glmc.io.folders import write_json
from glmc.matching.options import LearnedMatchingOptions
from glmc.plots import plot_barriers, plot_iterations, plot_moves
from glmc.provenance import provenance
from glmc.training import TrainConfig, train

#: The paper's test-loss barriers (mean of runs) for the columns the demo reproduces.
PAPER = {
    "none": {"shakespeare": 2.02, "mnist": 1.69},
    "activation": {"shakespeare": 1.43, "mnist": 1.27},
    "weight": {"shakespeare": 0.34, "mnist": 0.36, "mlp": 0.00},
    "learned-perm": {"shakespeare": 0.63, "mnist": 0.45},
    "learned": {"shakespeare": 0.02, "mnist": 0.00},
}
PAPER_NOTE = ("paper: GPT-2 on Tiny Shakespeare; ViT on CIFAR-10 (the MNIST column lists the "
              "paper's CIFAR-10 figures for scale); the MLP column: Git Re-Basin's (Ainsworth "
              "et al. 2023) MNIST MLP, whose weight matching leaves a barrier of about zero")
SMOKE_NOTE = ("--quick is a smoke test of the pipeline: its models are barely trained (see "
              "the endpoints' losses and accuracies), so its barriers say nothing about the "
              "methods and are not comparable with the paper's; run `glmc demo` for the "
              "experiment")
METHOD_TITLES = {
    "none": "vanilla averaging (stock weights)",
    "canonical": "averaging in canonical coordinates",
    "activation": "activation matching (orthogonal residual)",
    "weight": "weight matching (orthogonal residual)",
    "weight-perm": "weight matching, permutations only",
    "learned": "learned matching (full group)",
    "learned-perm": "learned matching, permutations only",
}
METHODS = ("none", "activation", "weight", "weight-perm", "learned", "learned-perm")


@dataclass(frozen=True)
class DemoPair:
    key: str
    title: str
    train: TrainConfig  # the seed is set per model
    #: Learned matching's steps on this pair (None: :data:`DEMO_LEARNED_STEPS`)
    learned_steps: int | None = None


@dataclass
class DemoResult:
    experiments: list[DemoPair]
    reports: dict[str, BarrierReport]
    results: dict  # the JSON written to results.json
    iterations: dict[str, dict[str, IterationStudy]] = field(default_factory=dict)
    moves: dict[str, dict] = field(default_factory=dict)


def pairs(quick: bool) -> list[DemoPair]:
    """The two experiments; ``quick`` shrinks everything to a smoke test of seconds."""
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
        # (7x7 patches: 17 tokens where 4x4 gives 50, several times faster per step to the
        # same accuracy; benchmarks/demo_budget.py)
        vit = TrainConfig(arch="vit", data="mnist5k", n_layer=3, n_embd=128, n_head=4,
                          patch_size=7, steps=600, batch_size=64, lr=2e-3, eval_every=200,
                          eval_batches=8, checkpoint_every=100, threads=1)
    mlp = TrainConfig(arch="mlp", data="mnist5k", steps=60 if quick else 600,
                      batch_size=32 if quick else 128, lr=1e-3, eval_every=0 if quick else 200,
                      eval_batches=2 if quick else 4, checkpoint_every=0 if quick else 200,
                      threads=1, **({"base": 32} if quick else {}))
    return [DemoPair("shakespeare", "GPT-2 / Tiny Shakespeare", gpt),
            DemoPair("mnist", "ViT / MNIST (5k)", vit),
            DemoPair("mlp", "MLP / MNIST (5k)", mlp, learned_steps=MLP_LEARNED_STEPS)]


def _digest(cfg: TrainConfig) -> str:
    d = cfg.flat()  # (every family's options: the names caches were given before)
    for k in ("threads", "device", "checkpoint_every"):
        d.pop(k, None)
    # (options added with the convnets count only when set: earlier caches keep their names)
    for k in ("width", "norm", "base", "n_kv_head"):
        if d[k] == train_option(k).default:
            d.pop(k)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def model_folder(cache: Path, pair: DemoPair, seed: int) -> Path:
    cfg = dataclasses.replace(pair.train, seed=seed)
    return cache / f"{pair.train.arch}-{pair.key}-{_digest(cfg)}-seed{seed}"


def _train_one(cfg: TrainConfig, folder: str) -> dict:
    """Train (or finish, or reuse) one model; runs in a worker process with one thread."""
    import torch

    torch.set_num_threads(1)
    return train(cfg, folder, resume=True, progress=False)


@dataclass
class Measured:
    """One pair's measurements, as a worker process returns them (no models inside)."""

    report: BarrierReport
    study: dict[str, IterationStudy] | None
    moves: dict | None

    def joined(self, other: Measured, order: tuple[str, ...]) -> Measured:
        """Both parts of a pair measured in two jobs, its methods in ``order``."""
        r, o = self.report, other.report
        methods = {**r.methods, **o.methods}
        report = dataclasses.replace(
            r, methods={m: methods[m] for m in order if m in methods},
            seconds=r.seconds + o.seconds,
            warnings=list(dict.fromkeys(r.warnings + o.warnings)))
        return Measured(report, self.study or other.study, self.moves or other.moves)


#: Where a pair is measured in two jobs (``parallel`` > 1), the second takes these methods
#: and the iteration study: the slowest pair's work is then shared by the workers (learned
#: matching and its permutation-only ablation are each over a third of a pair's time; the
#: permutation-only weight matching, an evaluation's worth, evens the two out).
SECOND_JOB = ("weight-perm", "learned-perm")


def measure_jobs(methods: tuple[str, ...]) -> list[tuple[tuple[str, ...], bool]]:
    """A pair's measurement as jobs: (methods, with the iteration study). (Two jobs in one
    process too: the same budgets, so the same figures, whatever ``parallel``.)"""
    second = tuple(m for m in methods if m in SECOND_JOB)
    first = tuple(m for m in methods if m not in SECOND_JOB)
    if not second or not first:
        return [(methods, True)]
    return [(first, False), (second, True)]


def _measure_pair(pair: DemoPair, a: str, b: str, methods: tuple[str, ...], points: int,
                  learned: LearnedMatchingOptions, max_batches: int | None,
                  events: Any = None, study: bool = True, budgets: bool = False) -> Measured:
    """Every method's barrier on one pair, and the two findings (the iteration study unless
    ``study`` is False); ``events``: a queue that receives (pair title, method, stage, done,
    total) as the work goes on; ``budgets``: the demo's own learned-matching budgets
    (:func:`pair_learned`) instead of ``learned``'s steps everywhere."""
    import torch

    torch.set_num_threads(1)
    if budgets:
        learned = pair_learned(learned, pair, methods)

    def progress(method: str, stage: str, done: int, total: int) -> None:
        if events is not None:
            events.put((pair.title, method, stage, done, total))

    rep = run_barrier(a, b, pair.train.data, methods=methods, points=points,
                      options=AlignOptions(learned=learned), label=pair.title,
                      max_batches=max_batches, progress=progress)
    found = None
    if study:
        progress("iterations", "align", 0, 1)
        found = study_iterations(Path(a), Path(b), pair.train.data, max_batches)
    moves = None
    result = rep.methods.get("learned")
    if result is not None and result.alignment is not None:
        moves = learned_moves(result.alignment.learned, result.alignment.a.spec.roles)
    for m in rep.methods.values():  # (the models stay in the worker)
        m.alignment = None
    return Measured(rep, found, moves)


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
        from glmc.threads import num_threads

        with num_threads(1):  # (one thread each, as in a worker; then the caller's own again)
            for c, f in todo:
                _train_one(c, str(f))
                note(f"trained {f}")
        return
    with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_train_one, c, str(f)): f for c, f in todo}
        for fut, f in futures.items():
            fut.result()
            note(f"trained {f}")


#: Learned matching's steps in the demo (a cap): fewer than the library's, so that the demo
#: fits its time on 2 cores; ``benchmarks/demo_budget.py`` measures what that costs.
DEMO_LEARNED_STEPS = 500
#: ... on the MLP pair, which weight matching already brings to no barrier at all, and for
#: the permutation-only ablation (it shows what the group lacks, not how low it can go): the
#: demo's own budgets, so that it fits 6 minutes on 2 cores (benchmarks/README.md).
MLP_LEARNED_STEPS = 100
ABLATION_STEPS = 250


def pair_learned(learned: LearnedMatchingOptions, pair: DemoPair,
                 methods: tuple[str, ...]) -> LearnedMatchingOptions:
    """The demo's learned-matching budget for ``methods`` of ``pair`` (from its default
    budget ``learned``: :data:`MLP_LEARNED_STEPS`, :data:`ABLATION_STEPS`)."""
    steps = pair.learned_steps or learned.steps
    if methods and all(m in SECOND_JOB for m in methods):
        steps = min(steps, ABLATION_STEPS)
    return dataclasses.replace(learned, steps=steps)


def learned_options(quick: bool, steps: int | None) -> LearnedMatchingOptions:
    """Learned matching's budget in the demo (:data:`DEMO_LEARNED_STEPS` of the library's
    options, or a smoke test's). A fixed budget, so the rate decays over it by a cosine: the
    plateau schedule would hold it constant through a budget this short (on the demo's pairs
    that left 0.089 and 0.088 where the cosine leaves 0.049 and 0.011; at 23f940b)."""
    base = LearnedMatchingOptions(schedule="cosine", patience=0)
    if quick:
        steps = steps or 40
        return dataclasses.replace(base, steps=steps, batch_size=16,
                                   eval_every=max(10, steps // 4))
    return dataclasses.replace(base, steps=steps or DEMO_LEARNED_STEPS)


def study_iterations(a: Path, b: Path, data: str, max_batches: int | None
                     ) -> dict[str, IterationStudy] | None:
    """Finding 1 on one pair: the midpoint barrier after k weight-matching iterations, with
    an orthogonal and a permutation-only residual map (None for a model without a residual
    stream to compare them on)."""
    ma, mb, batches = barrier_batches(a, b, data, max_batches=max_batches)
    if "residual" not in ma.spec.roles.values():
        return None
    return wm_iterations(ma, mb, Evaluator(ma.config, batches))


def _run_pipeline(experiments: list[DemoPair], cache: Path, methods: tuple[str, ...],
                  points: int, learned: LearnedMatchingOptions, max_batches: int | None,
                  parallel: int, note: Callable[[str], None],
                  progress: Callable | None, budgets: bool = False
                  ) -> tuple[dict[str, Measured], float]:
    """Train what the cache lacks and measure every pair, ``parallel`` processes at a time
    (one thread each): a pair is measured as soon as both its models exist, while the others
    train. Returns the measurements and the seconds until the last model was trained.
    ``budgets``: see :func:`_measure_pair`."""
    t0 = time.perf_counter()
    folders = {p.key: (model_folder(cache, p, 0), model_folder(cache, p, 1))
               for p in experiments}
    jobs = [(dataclasses.replace(p.train, seed=s), folders[p.key][s])
            for p in experiments for s in (0, 1)]
    results: dict[str, Measured] = {}
    if parallel <= 1:
        train_models(jobs, 1, note)
        t_train = time.perf_counter() - t0
        for p in experiments:
            note(f"{p.title}: aligning and measuring {', '.join(methods)}")
            first, *rest = [_measure_pair(p, *map(str, folders[p.key]), part, points, learned,
                                          max_batches, _Events(progress), study, budgets)
                            for part, study in measure_jobs(methods)]
            for other in rest:
                first = first.joined(other, methods)
            results[p.key] = first
        return results, t_train
    todo = [(c, f) for c, f in jobs if not (f / "glmc_train.json").is_file()]
    for _, f in jobs:
        if all(f != g for _, g in todo):
            note(f"reusing {f}")
    if todo:
        note(f"training {len(todo)} model(s) and measuring each pair once it is trained, "
             f"{parallel} at a time (an interrupted run resumes from its checkpoints)")
    import multiprocessing

    manager = multiprocessing.get_context("spawn").Manager()
    events = manager.Queue()
    done = {f for p in experiments for f in folders[p.key]} - {f for _, f in todo}
    t_train = 0.0
    with ProcessPoolExecutor(parallel, mp_context=get_context("spawn")) as pool:
        pending = {pool.submit(_train_one, cfg, str(f)): ("train", f) for cfg, f in todo}
        started: set[str] = set()

        parts: dict[str, list[Measured]] = {}
        parts_of = measure_jobs(methods)

        def start_ready() -> None:
            for p in experiments:
                if p.key not in started and all(f in done for f in folders[p.key]):
                    started.add(p.key)
                    note(f"{p.title}: aligning and measuring {', '.join(methods)}")
                    for part, study in parts_of:
                        fut = pool.submit(_measure_pair, p, *map(str, folders[p.key]), part,
                                          points, learned, max_batches, events, study,
                                          budgets)
                        pending[fut] = ("measure", p.key)

        start_ready()
        while pending:
            finished, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(events, progress)
            for fut in finished:
                kind, what = pending.pop(fut)
                value = fut.result()
                if kind == "train":
                    done.add(what)
                    note(f"trained {what}")
                    if all(k != "train" for k, _ in pending.values()):
                        t_train = time.perf_counter() - t0
                    start_ready()
                else:
                    parts.setdefault(what, []).append(value)
                    if len(parts[what]) == len(parts_of):
                        first, *rest = parts[what]
                        for other in rest:
                            first = first.joined(other, methods)
                        results[what] = first
                        note(f"{value.report.label}: measured")
    manager.shutdown()
    return results, t_train


class _Events:
    """The in-process stand-in for the workers' event queue: calls ``progress`` at once."""

    def __init__(self, progress: Callable | None) -> None:
        self.progress = progress

    def put(self, event: tuple) -> None:
        if self.progress is not None:
            _, method, stage, done, total = event
            self.progress(method, stage, done, total)


def _drain(events: Any, progress: Callable | None) -> None:
    """Pass the workers' progress events on (the latest of each matters)."""
    while True:
        try:
            _, method, stage, done, total = events.get_nowait()
        except Exception:  # noqa: BLE001 - queue.Empty, from a manager's proxy
            return
        if progress is not None:
            progress(method, stage, done, total)


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
    """Train (or reuse) the demo models, measure every method's barrier and the two
    findings, write the report. Returns the reports and the results (also written to
    ``out/results.json``)."""
    t0 = time.perf_counter()
    out, cache = Path(out), Path(cache)
    experiments = pairs(quick)
    for p in experiments:  # a missing dataset fails here, before any training
        load_dataset(p.train.data, seed=p.train.data_seed)
    options = AlignOptions(learned=learned_options(quick, learned_steps))
    demo = DemoResult(experiments, {}, {})
    measured, t_train = _run_pipeline(experiments, cache, methods, points, options.learned,
                                      4 if quick else None,
                                      parallel or min(2, os.cpu_count() or 1), note, progress,
                                      budgets=not quick and learned_steps is None)
    for p in experiments:
        m = measured[p.key]
        demo.reports[p.key] = m.report
        for warning in m.report.warnings:  # (also in results.json, with the barriers)
            note(f"{p.title}: warning: {warning}")
        if m.study is not None:
            demo.iterations[p.title] = m.study
        if m.moves is not None:
            demo.moves[p.title] = m.moves
    out.mkdir(parents=True, exist_ok=True)
    plots = {k: plot_barriers(r, out / f"barrier-{k}.png", title=r.label)
             for k, r in demo.reports.items()}
    if demo.iterations:
        plots["iterations"] = plot_iterations(demo.iterations, out / "wm-iterations.png")
    if demo.moves:
        plots["moves"] = plot_moves(demo.moves, out / "learned-moves.png")
    demo.results = {
        "provenance": provenance(), "quick": quick,
        "seconds": {"total": round(time.perf_counter() - t0, 1), "training": round(t_train, 1)},
        "parallel": parallel or min(2, os.cpu_count() or 1),
        "models": {p.key: {"a": str(model_folder(cache, p, 0)),
                           "b": str(model_folder(cache, p, 1)),
                           "train": p.train.flat()} for p in experiments},
        # (the λ of the demo's pairs, of equal widths, where the option leaves it to the pair)
        "learned_matching": dataclasses.asdict(options.learned)
        | {"lam": options.learned.lam_for(narrower=False)},
        "learned_steps": {p.key: {m: (pair_learned(options.learned, p, (m,)).steps
                                      if not quick and learned_steps is None
                                      else options.learned.steps)
                                  for m in methods if m.startswith("learned")}
                          for p in experiments},
        "barriers": {k: r.to_json() for k, r in demo.reports.items()},
        "wm_iterations": {k: {g: s.to_json() for g, s in v.items()}
                          for k, v in demo.iterations.items()},
        "learned_moves": demo.moves,
        "plots": {k: str(v) for k, v in plots.items()},
    }
    write_json(out / "results.json", demo.results)
    write_text(out / "report.md", markdown_report(demo))
    return demo


def table_rows(experiments: list[DemoPair], reports: dict[str, BarrierReport],
               paper: bool = True) -> list[list[str]]:
    """Rows: methods; columns: test-loss barrier per experiment (the paper's figure beside
    it unless ``paper`` is False, as in a smoke test)."""
    rows = []
    methods = list(next(iter(reports.values())).methods)
    for m in methods:
        row = [METHOD_TITLES.get(m, m)]
        for p in experiments:
            r = reports[p.key].methods[m]
            fig = PAPER.get(m, {}).get(p.key) if paper else None
            row.append(f"{r.loss_barrier:.3f}" + (f" ({fig:.2f})" if fig is not None else ""))
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


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def _finding_lines(demo: DemoResult) -> list[str]:
    lines = ["## The paper's findings about the methods", "",
             "**Barrier after k weight-matching iterations** (test loss at the midpoint minus "
             "the endpoints' mean; k = 0 is the start):", ""]
    head = ["pair", "residual map", "k = 0", "1", "3", "5", "10", "last"]
    rows = []
    for label, by_group in demo.iterations.items():
        for group, st in by_group.items():
            b = st.midpoint_barrier
            cells = [f"{b[k]:.3f}" if k < len(b) else "-" for k in (0, 1, 3, 5, 10)]
            rows.append([label, group, *cells, f"{b[-1]:.3f}"])
    lines += _md_table(head, rows)
    lines += ["", "The paper: the orthogonal map keeps lowering the barrier with more "
              "iterations, while permutations saturate early.", ""]
    if demo.moves:
        lines += ["**How far learned matching moves from weight matching** (units reassigned "
                  "per space; the residual map's change):", ""]
        rows = []
        for label, mv in demo.moves.items():
            re = mv["reassigned"]
            mean = 100 * sum(re.values()) / max(1, len(re))
            share = (f"{100 * max(re.values()):.1f}% at most, {mean:.1f}% on average"
                     if re else "-")
            frob = mv.get("residual_frobenius")
            rows.append([label, share, "-" if frob is None else
                         f"{frob:.2f} ({100 * mv['residual_relative']:.0f}% of ‖O‖_F)"])
        lines += _md_table(["pair", "units reassigned", "‖O_learned − O_WM‖_F"], rows)
        lines += ["", "The paper: learned matching barely changes the permutations and makes "
                  "small corrections to the residual map.", ""]
    return lines


def markdown_report(demo: DemoResult) -> str:
    experiments, reports, results = demo.experiments, demo.reports, demo.results
    quick = results["quick"]
    head = ["method"] + [p.title for p in experiments]
    n = len(next(iter(reports.values())).lambdas)
    lines = ["# glmc demo", ""]
    if quick:
        lines += [f"**Smoke test.** {SMOKE_NOTE}.", ""]
    lines += [f"Test-loss barrier on the line θ(λ) = λ·A + (1−λ)·π(B), {n} points"
              + ("." if quick else "; in brackets the paper's figure (" + PAPER_NOTE + ")."),
              ""]
    lines += _md_table(head, table_rows(experiments, reports, paper=not quick))
    lines += ["", "Endpoints (test): loss A / B, accuracy A / B", ""]
    lines += _md_table(["experiment", "loss A / B", "accuracy A / B"],
                       endpoint_rows(experiments, reports))
    lines += ["", "Models:", ""]
    for p in experiments:
        t = p.train
        lines.append(f"- {p.title}: {arch_named(t.arch).describe(t)}, {t.steps} steps of "
                     f"batch {t.batch_size} ({results['models'][p.key]['a']}, "
                     f"{results['models'][p.key]['b']})")
    lm = results["learned_matching"]
    lines += ["", f"Learned matching: {lm['steps']} steps of batch {lm['batch_size']}, "
              f"AdamW {lm['lr']:g} (permutation latents ×{lm['perm_lr_scale']:g} beside "
              f"continuous maps, ×1 when permutations are all there is), λ ~ "
              f"{lm['lam']}.", ""]
    lines += _finding_lines(demo)
    run = results["provenance"]
    lines += [f"Total time {results['seconds']['total']} s (training "
              f"{results['seconds']['training']} s). Run: glmc {run['glmc']}, commit "
              f"{run['commit'] or 'unknown'}{' (changed)' if run['dirty'] else ''}, "
              f"{run['machine']}, `{run['command']}`.", ""]
    lines += [f"![{k}]({Path(v).name})" for k, v in results["plots"].items()]
    return "\n".join(lines) + "\n"
