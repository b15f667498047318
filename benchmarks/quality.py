"""Alignment quality on independently trained pairs: the barrier each method leaves.

Pairs are trained once with glmc's own trainer and cached (the demo's pairs share the demo's
cache, so `glmc demo` and this script reuse each other's models). For every pair and method:
the test-loss barrier on an 11-point grid (the library's ``run_barrier``, the same evaluation
for every row), its ratio to vanilla averaging (``none``: the stock weights averaged), and the
time the alignment took. The paper's public code, run side by side on the same GPT-2 pairs by
``peer_reference.py``, joins the table when its results are there.

    python benchmarks/quality.py --train-only            # fill the cache (about an hour)
    python benchmarks/quality.py                         # every pair, every method
    python benchmarks/quality.py --pairs gpt2-2l --methods none weight
    python benchmarks/quality.py --table                 # only rewrite the README table

Writes benchmarks/results/quality.json and the table in benchmarks/README.md. A pair's
methods are measured together, in one run of the current code, and every row records that run
(commit, date, machine, threads); rerunning some pairs replaces those pairs' rows (never some
of a pair's methods only), and the table says which run each column comes from.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from _common import RESULTS, Section, machine, provenance, read_json, replace_section, write_json

from glmc.demo import model_folder, train_models
from glmc.demo import pairs as demo_pairs
from glmc.training import TrainConfig

METHODS = ("none", "canonical", "activation", "weight", "weight-perm", "learned",
           "learned-perm")
#: Rows measured with attention rewritten as QK/OV circuits first (the paper's code does so):
#: no inner bases left to map, so its permutation-only ablation is permutations of the residual
#: stream, MLP units and whole heads alone.
CIRCUIT = {"weight-perm": "weight-perm-circuit"}
#: Weight matching with the residual stream permuted instead of rotated, every other space in
#: its full group (heads' inner maps kept): what earlier tools do to the residual stream.
RESIDUAL_PERM = {"weight": "weight-residual-perm"}
TITLES = {
    "none": "vanilla averaging (stock weights)",
    "canonical": "averaging in canonical coordinates",
    "activation": "activation matching",
    "weight": "weight matching",
    "weight-perm": "weight matching, permutations only",
    "learned": "learned matching",
    "learned-perm": "learned matching, permutations only",
    "weight-perm-circuit": "weight matching, permutations only, heads as circuits",
    "weight-residual-perm": "weight matching, residual stream permuted (other maps kept)",
}
OUT = RESULTS / "quality.json"
PEER = RESULTS / "peer_reference.json"


@dataclasses.dataclass(frozen=True)
class Pair:
    key: str
    title: str
    train: TrainConfig  # the seed is set per model (0 and 1)
    folder_key: str = ""  # the cache folders' name (the demo's own for its pairs)
    #: Methods run by default (learned matching on the largest pair is a long CPU run).
    methods: tuple[str, ...] = METHODS

    def __post_init__(self) -> None:
        object.__setattr__(self, "folder_key", self.folder_key or self.key)


def _gpt(**kw) -> TrainConfig:
    base = dict(arch="gpt2", data="shakespeare", eval_every=250, eval_batches=8,
                checkpoint_every=100, threads=1)
    return TrainConfig(**(base | kw))


def _vit(**kw) -> TrainConfig:
    base = dict(arch="vit", eval_every=250, eval_batches=8, checkpoint_every=100, threads=1)
    return TrainConfig(**(base | kw))


def suite() -> list[Pair]:
    demo = {p.key: p for p in demo_pairs(quick=False)}
    demo_gpt, demo_vit = demo["shakespeare"], demo["mnist"]
    return [
        Pair("gpt2-demo", "GPT-2 demo pair (3L, d=128)", demo_gpt.train, demo_gpt.key),
        Pair("vit-demo", "ViT demo pair (MNIST 5k, 3L, d=128)", demo_vit.train, demo_vit.key),
        Pair("gpt2-2l", "GPT-2 2L, d=64, 4 heads (char)",
             _gpt(n_layer=2, n_embd=64, n_head=4, context=64, steps=1500, batch_size=32,
                  lr=3e-3)),
        Pair("gpt2-paper", "GPT-2 paper shape (6L, d=256, 4 heads, MLP 1024; char, short)",
             _gpt(n_layer=6, n_embd=256, n_head=4, n_inner=1024, context=128, steps=1000,
                  batch_size=32, lr=2e-3),
             methods=("none", "canonical", "activation", "weight", "weight-perm")),
        Pair("llama-demo", "Llama (GQA: 4 query / 2 key-value heads; 3L, d=128; char)",
             _gpt(arch="llama", n_layer=3, n_embd=128, n_head=4, context=64, steps=1000,
                  batch_size=32, lr=3e-3)),
        Pair("neox-demo", "GPT-NeoX (Pythia-style: partial rotary, parallel; 3L, d=128)",
             _gpt(arch="gpt-neox", n_layer=3, n_embd=128, n_head=4, context=64, steps=1000,
                  batch_size=32, lr=3e-3)),
        Pair("bert-demo", "BERT masked LM (post-LayerNorm; 3L, d=128, 4 heads; char)",
             _gpt(arch="bert", n_layer=3, n_embd=128, n_head=4, context=64, steps=1000,
                  batch_size=32, lr=1e-3)),
        Pair("vit-fashion", "ViT Fashion-MNIST (3L, d=128, 4 heads)",
             _vit(data="fashion-mnist", n_layer=3, n_embd=128, n_head=4, patch_size=7,
                  steps=1500, batch_size=64, lr=2e-3)),
    ]


def _folder(cache: Path, pair: Pair, seed: int) -> Path:
    return model_folder(cache, dataclasses.replace(pair, key=pair.folder_key), seed)


def folders(cache: Path, pair: Pair) -> tuple[Path, Path]:
    return _folder(cache, pair, 0), _folder(cache, pair, 1)


def train_pairs(chosen: list[Pair], cache: Path, parallel: int) -> None:
    jobs = [(dataclasses.replace(p.train, seed=s), _folder(cache, p, s))
            for p in chosen for s in (0, 1)]
    train_models(jobs, parallel, lambda msg: print(msg, file=sys.stderr, flush=True))


def measure(pair: Pair, cache: Path, methods: list[str]) -> dict:
    """Every method's barrier on one pair (the library's run_barrier)."""
    from glmc.barrier import AlignOptions, run_barrier

    a, b = folders(cache, pair)
    t0 = time.perf_counter()

    def progress(method: str, stage: str, done: int, total: int) -> None:
        if stage == "align" and done == 0:
            print(f"  {pair.key}: {method} ...", file=sys.stderr, flush=True)

    report = run_barrier(str(a), str(b), pair.train.data, methods=methods, progress=progress)
    measured = dict(report.methods)
    if pair.train.arch == "gpt2":
        for method, name in CIRCUIT.items():
            if method in methods:
                rep = run_barrier(str(a), str(b), pair.train.data, methods=[method],
                                  options=AlignOptions(heads="circuit"), progress=progress)
                measured[name] = rep.methods[method]
    if pair.train.arch in ("llama", "gpt-neox"):
        for method, name in RESIDUAL_PERM.items():
            if method in methods:
                rep = run_barrier(str(a), str(b), pair.train.data, methods=[method],
                                  options=AlignOptions(residual="permutation",
                                                       inner="invertible"),
                                  progress=progress)
                measured[name] = rep.methods[method]
    run = provenance()
    row: dict = {"title": pair.title, "data": pair.train.data, "models": [str(a), str(b)],
                 "train": pair.train.flat(), "eval_count": report.count,
                 "seconds": round(time.perf_counter() - t0, 1), "run": run, "methods": {}}
    for name, m in measured.items():
        row["methods"][name] = {
            "loss_barrier": m.loss_barrier, "acc_barrier": m.acc_barrier,
            "loss_a": m.loss_a, "loss_b": m.loss_b, "acc_a": m.acc_a, "acc_b": m.acc_b,
            "align_seconds": round(m.align_seconds, 2),
            "eval_seconds": round(m.eval_seconds, 2), **run}
    return row


def _run_line(label: str, run: dict) -> str:
    return (f"{label}: commit {run['commit']}{' with changes' if run.get('dirty') else ''}, "
            f"{run['date']} UTC, {run['machine']}, {run['threads']} thread(s)")


def _cell(x: float | None, ratio: float | None = None) -> str:
    if x is None:
        return "–"
    return f"{x:.3f}" + (f" ({ratio:.2f})" if ratio is not None else "")


def table(results: dict, peer: dict) -> str:
    """Rows: methods (the paper's code beside glmc's); columns: pairs; cells: test-loss
    barrier and, in brackets, its ratio to vanilla averaging of the same pair."""
    keys = [p.key for p in suite() if p.key in results.get("pairs", {})]
    order = ("none", "canonical", "activation", "weight", *RESIDUAL_PERM.values(), "weight-perm",
             *CIRCUIT.values(), "learned", "learned-perm")
    rows = [("glmc", m) for m in order] + [("peer", m) for m in ("orthogonal-exact",
                                                                 "orthogonal", "perm-exact")]
    titles = {"orthogonal-exact": "paper's code: weight matching",
              "orthogonal": "paper's code: weight matching, as its evaluation runs it",
              "perm-exact": "paper's code: weight matching, permutations only"}
    lines = ["| method | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for who, m in rows:
        cells = []
        for k in keys:
            none = results["pairs"][k]["methods"].get("none", {}).get("loss_barrier")
            if who == "glmc":
                r = results["pairs"][k]["methods"].get(m)
            else:
                r = peer.get("pairs", {}).get(k, {}).get("peer", {}).get(m)
            # (the peer's own vanilla average is glmc's "none" on the same pair and windows)
            ratio = r["loss_barrier"] / none if r and none else None
            cells.append(_cell(r["loss_barrier"], ratio) if r else "–")
        if any(c != "–" for c in cells):
            lines.append(f"| {TITLES.get(m, titles.get(m, m))} | " + " | ".join(cells) + " |")
    lines += ["", "Alignment time in seconds (loading and evaluation not included):", "",
              "| method | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for who, m in rows:
        if who == "glmc" and m not in ("none", "canonical"):
            got = [results["pairs"][k]["methods"].get(m) for k in keys]
        elif who == "peer":
            got = [peer.get("pairs", {}).get(k, {}).get("peer", {}).get(m) for k in keys]
        else:
            continue
        cells = [f"{r['align_seconds']:.1f}" if r else "–" for r in got]
        if any(c != "–" for c in cells):
            lines.append(f"| {TITLES.get(m, titles.get(m, m))} | " + " | ".join(cells) + " |")
    lines.append("")
    for k in keys:
        p = results["pairs"][k]
        w = p["methods"].get("weight") or next(iter(p["methods"].values()))
        acc = (f", accuracy {100 * w['acc_a']:.1f}% / {100 * w['acc_b']:.1f}%"
               if w.get("acc_a") is not None else "")
        lines.append(f"- `{k}`: {p['title']}; test loss A / B {w['loss_a']:.3f} / "
                     f"{w['loss_b']:.3f}{acc}; {p['eval_count']:,} test "
                     f"{'images' if acc else 'tokens'}.")
    runs = {k: results["pairs"][k].get("run") for k in keys}
    lines.append("")
    if runs and all(r is not None for r in runs.values()) and len(
            {(r["commit"], r["date"][:10]) for r in runs.values()}) == 1:
        first = next(iter(runs.values()))  # (the same commit and day: its date is the day's)
        lines.append(_run_line("Every column", first | {"date": first["date"][:10]}) + ".")
    else:
        lines += [f"- {_run_line(f'`{k}`', r)}" if r else f"- `{k}`: run not recorded"
                  for k, r in runs.items()]
    for k in keys:  # (a row measured apart from its pair's run says so)
        run = runs[k] or {}
        for m, r in results["pairs"][k]["methods"].items():
            if r.get("date") and (r.get("commit"), r.get("date")) != (run.get("commit"),
                                                                     run.get("date")):
                lines.append(f"- {_run_line(f'`{k}`, row {TITLES.get(m, m)!r}', r)}")
    peer_runs = {(r.get("commit"), r.get("date")) for k, pr in peer.get("pairs", {}).items()
                 if k in keys
                 for r in pr.get("peer", {}).values() if isinstance(r, dict)}
    if peer.get("pairs"):
        lines.append("The paper's code's rows: " + "; ".join(
            f"run of glmc commit {c}, {d} UTC" for c, d in sorted(peer_runs, key=str)) + ".")
    return "\n".join(lines)


SECTIONS = {"quality": Section(lambda: table(read_json(OUT), read_json(PEER)), (OUT, PEER))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="*", default=None, choices=[q.key for q in suite()])
    p.add_argument("--methods", nargs="*", default=None, choices=METHODS,
                   help="default: each pair's own list (all but learned on gpt2-paper)")
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--parallel", type=int, default=2, help="models trained at once")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--train-only", action="store_true")
    p.add_argument("--table", action="store_true", help="only rewrite the README's table")
    args = p.parse_args(argv)
    results = read_json(OUT) or {"pairs": {}}
    if not args.table:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        chosen = [q for q in suite() if args.pairs is None or q.key in args.pairs]
        t0 = time.perf_counter()
        train_pairs(chosen, Path(args.cache), args.parallel)
        print(f"models ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        if args.train_only:
            return 0
        for pair in chosen:
            methods = [m for m in (args.methods or pair.methods)]
            row = measure(pair, Path(args.cache), methods)
            results = read_json(OUT) or {"pairs": {}}  # (another run may have written it)
            results["pairs"][pair.key] = row  # (a pair's rows are one run's, never mixed)
            results["machine"] = machine()
            write_json(OUT, results)
            print(f"{pair.key}: " + ", ".join(
                f"{k} {v['loss_barrier']:.3f}" for k, v in row["methods"].items()), flush=True)
    md = table(results, read_json(PEER))
    print(md)
    replace_section("quality", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
