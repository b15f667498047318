"""The held-out quality suite: pairs trained by code other than glmc's, split into a
validation part (where defaults are chosen) and a test part (reported, never tuned on).

Every model is trained by ``heldout_train.py`` (transformers' classes, a plain PyTorch loop
with a recipe of its own; seeds 200 and 201, which no other benchmark uses) on one of two
corpora: Tiny Shakespeare (``shakespeare``) or Python's own standard library source
(``python``: the interpreter's top-level ``*.py`` modules in sorted order, printable ASCII,
the first 1,115,394 characters: as long as Tiny Shakespeare; its SHA-256 is recorded). Each
pair is then measured by the library's ``run_barrier`` (test split, 11 points) for vanilla
averaging, activation, weight and learned matching, in one run of the current code; the
paper's public implementation joins the GPT-2 rows when ``peer_reference.py --suite heldout``
has run.

    python benchmarks/heldout.py --train-only              # the models (about 45 min, 2 cores)
    python benchmarks/heldout.py --part val                # measure the validation pairs
    python benchmarks/heldout.py --part test               # the test pairs: the table
    python benchmarks/heldout.py --table                   # the tables again from the JSON
    python benchmarks/heldout.py --part test --out a.json & ...   # processes side by side,
    python benchmarks/heldout.py --merge a.json b.json     # then their rows into heldout.json

Writes benchmarks/results/heldout.json (each pair's row with commit, machine and command)
and the tables in benchmarks/README.md and README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import HERE, RESULTS, Section, provenance, read_json, replace_section, write_json

OUT = RESULTS / "heldout.json"
PEER = RESULTS / "peer_heldout.json"
SEEDS = (200, 201)
METHODS = ("none", "activation", "weight", "learned")
TITLES = {"none": "vanilla averaging", "activation": "activation matching",
          "weight": "weight matching", "learned": "learned matching",
          "peer": "paper's code: weight matching"}
CORPUS_CHARS = 1_115_394


@dataclasses.dataclass(frozen=True)
class Pair:
    key: str
    part: str  # "val" (defaults are chosen here) or "test" (reported only)
    family: str
    data: str  # "shakespeare", "python" (built by :func:`python_corpus`) or an image set
    shape: dict
    steps: int = 1500
    batch: int = 32
    context: int = 64
    lr: float = 3e-3

    @property
    def title(self) -> str:
        s = self.shape
        heads = f"{s['heads']}q/{s['kv']}kv" if "kv" in s else f"{s['heads']} heads"
        return f"{self.family} {s['layers']}L d={s['d']} {heads}, {self.data}"


def suite() -> list[Pair]:
    return [
        Pair("v-gpt2-2l-py", "val", "gpt2", "python", {"layers": 2, "d": 64, "heads": 4}),
        Pair("v-llama-3l", "val", "llama", "shakespeare",
             {"layers": 3, "d": 96, "heads": 4, "kv": 2}),
        Pair("v-neox-2l-py", "val", "gpt-neox", "python", {"layers": 2, "d": 96, "heads": 4}),
        Pair("v-bert-2l", "val", "bert", "shakespeare", {"layers": 2, "d": 64, "heads": 4},
             lr=1e-3),
        Pair("v-vit-2l", "val", "vit", "mnist5k", {"layers": 2, "d": 64, "heads": 4,
                                                   "patch": 7}, batch=64, lr=2e-3),
        Pair("t-gpt2-2l", "test", "gpt2", "shakespeare", {"layers": 2, "d": 64, "heads": 4}),
        Pair("t-gpt2-3l-py", "test", "gpt2", "python", {"layers": 3, "d": 96, "heads": 4}),
        Pair("t-gpt2-6l", "test", "gpt2", "shakespeare", {"layers": 6, "d": 64, "heads": 4},
             lr=2e-3),
        Pair("t-llama-2l-py", "test", "llama", "python",
             {"layers": 2, "d": 128, "heads": 4, "kv": 2}),
        Pair("t-qwen2-3l", "test", "qwen2", "shakespeare",
             {"layers": 3, "d": 96, "heads": 4, "kv": 2}),
        Pair("t-neox-3l", "test", "gpt-neox", "shakespeare", {"layers": 3, "d": 96, "heads": 4}),
        Pair("t-bert-3l-py", "test", "bert", "python", {"layers": 3, "d": 128, "heads": 4},
             lr=1e-3),
        Pair("t-vit-3l", "test", "vit", "mnist5k", {"layers": 3, "d": 256, "heads": 8,
                                                    "patch": 7}, steps=1000, batch=64,
             lr=1e-3),
    ]


def python_corpus(cache: Path) -> tuple[Path, str]:
    """Python's standard library as a character corpus (written once into ``cache``), and
    its SHA-256."""
    out = cache / "python-stdlib.txt"
    if not out.is_file():
        keep = set(string.printable) - set("\r\x0b\x0c")
        parts = []
        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            parts.append("".join(c for c in p.read_text(encoding="utf-8", errors="replace")
                                 if c in keep))
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text("".join(parts)[:CORPUS_CHARS])
        tmp.replace(out)
    return out, hashlib.sha256(out.read_bytes()).hexdigest()


def data_path(pair: Pair, cache: Path) -> str:
    return str(python_corpus(cache)[0]) if pair.data == "python" else pair.data


def folders(pair: Pair, cache: Path) -> tuple[Path, Path]:
    return tuple(cache / f"heldout-{pair.key}-seed{s}" for s in SEEDS)


def train_all(chosen: list[Pair], cache: Path, parallel: int) -> None:
    jobs = []
    for pair in chosen:
        for seed, out in zip(SEEDS, folders(pair, cache), strict=True):
            if (out / "config.json").is_file():
                continue
            spec = {"family": pair.family, "data": data_path(pair, cache), "shape": pair.shape,
                    "steps": pair.steps, "batch": pair.batch, "context": pair.context,
                    "lr": pair.lr, "seed": seed}
            jobs.append((spec, out))

    def one(job) -> None:
        spec, out = job
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(spec, f)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, str(HERE / "heldout_train.py"), f.name,
                               str(out)], capture_output=True, text=True)
        Path(f.name).unlink()
        if done.returncode:
            raise RuntimeError(f"{out}: training failed\n{done.stderr[-2000:]}")
        print(f"trained {out.name} in {time.perf_counter() - t0:.0f} s: "
              f"{done.stdout.strip().splitlines()[-1]}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, jobs))


def measure(pair: Pair, cache: Path, methods: list[str], options: dict | None = None) -> dict:
    """Every method's test-loss barrier on one pair (the library's run_barrier)."""
    from glmc.barrier import AlignOptions, run_barrier

    a, b = folders(pair, cache)
    t0 = time.perf_counter()
    report = run_barrier(str(a), str(b), data_path(pair, cache), methods=methods,
                         options=AlignOptions().updated(**(options or {})))
    row = {"title": pair.title, "part": pair.part, "family": pair.family, "data": pair.data,
           "eval_count": report.count, "seconds": round(time.perf_counter() - t0, 1),
           "run": provenance(command=" ".join(sys.argv)), "options": options or {},
           "methods": {}}
    if pair.data == "python":
        row["corpus_sha256"] = python_corpus(cache)[1]
    for name, m in report.methods.items():
        row["methods"][name] = {
            "loss_barrier": m.loss_barrier, "loss_barrier_se": m.loss_barrier_se,
            "acc_barrier": m.acc_barrier, "loss_a": m.loss_a, "loss_b": m.loss_b,
            "acc_a": m.acc_a, "acc_b": m.acc_b, "align_seconds": round(m.align_seconds, 2),
            "losses": m.losses, "lambda_at_max": m.loss_barrier_lambda}
        match = m.alignment.match if m.alignment is not None else None
        if match is not None:  # (weight matching's own run; learned's start is not kept)
            row["methods"][name] |= {"iterations": len(match.trace),
                                     "relative": match.relative, "chosen": match.chosen}
        learned = m.alignment.learned if m.alignment is not None else None
        if learned is not None:
            row["methods"][name]["learned"] = {k: v for k, v in learned.to_json().items()
                                               if k != "log"} | {"val_curve": [
                [r["step"], r["val"]] for r in learned.log if "val" in r]}
    return row


def table(results: dict, part: str, peer: dict) -> str:
    """Rows: pairs of ``part``; columns: methods; cells: test-loss barrier (ratio to
    vanilla averaging on the pair)."""
    pairs = {k: r for k, r in results.get("pairs", {}).items() if r["part"] == part}
    cols = [m for m in (*METHODS, "peer") if m == "peer" and any(
        k in peer.get("pairs", {}) for k in pairs) or any(m in r["methods"]
                                                         for r in pairs.values())]
    lines = ["| pair | " + " | ".join(TITLES[m] for m in cols) + " | learned: s |",
             "|---|" + "---|" * (len(cols) + 1)]
    for k, r in pairs.items():
        none = r["methods"].get("none", {}).get("loss_barrier")
        cells = []
        for m in cols:
            got = (peer.get("pairs", {}).get(k, {}).get("peer", {}).get("orthogonal-exact")
                   if m == "peer" else r["methods"].get(m))
            if not got:
                cells.append("–")
                continue
            x = got["loss_barrier"]
            cells.append(f"{x:.3f}" + (f" ({x / none:.2f})" if none and m != "none" else ""))
        learned = r["methods"].get("learned", {}).get("align_seconds")
        lines.append(f"| `{k}`: {r['title']} | " + " | ".join(cells)
                     + (f" | {learned:.0f} |" if learned else " | – |"))
    runs = {(r["run"]["commit"], r["run"]["dirty"], r["run"]["machine"]) for r in pairs.values()}
    theirs = {r["commit"] for k in pairs
              if (r := peer.get("pairs", {}).get(k, {}).get("peer", {}).get("orthogonal-exact"))}
    lines += ["", "Runs: " + "; ".join(f"commit {c}{' with changes' if d else ''}, {m}"
                                       for c, d, m in sorted(runs))
              + (f"; the paper's code: commit {', '.join(sorted(theirs))}" if theirs else "")
              + "."]
    return "\n".join(lines)


SECTIONS = {f"heldout_{part}": Section(
    lambda part=part: table(read_json(OUT), part, read_json(PEER)), (OUT, PEER))
    for part in ("val", "test")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", nargs="*", default=None, choices=[q.key for q in suite()])
    p.add_argument("--part", choices=("val", "test", "all"), default="all")
    p.add_argument("--methods", nargs="*", default=list(METHODS))
    p.add_argument("--options", default="{}", help="AlignOptions as JSON (screens)")
    p.add_argument("--out", default=str(OUT), help="results file (screens write their own)")
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--parallel", type=int, default=2, help="models trained at once")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--train-only", action="store_true")
    p.add_argument("--table", action="store_true", help="only rewrite the tables")
    p.add_argument("--merge", nargs="*", default=[], metavar="JSON",
                   help="add the pairs of these results files (runs of the same commit in "
                   "separate processes) to heldout.json, then rewrite the tables")
    args = p.parse_args(argv)
    cache, out = Path(args.cache), Path(args.out)
    if args.merge:
        results = read_json(OUT) or {"pairs": {}}
        for f in args.merge:
            results["pairs"].update(read_json(f)["pairs"])
        write_json(OUT, results)
        args.table = True
    chosen = [q for q in suite() if (args.pairs is None or q.key in args.pairs)
              and args.part in ("all", q.part)]
    if not args.table:
        train_all(chosen, cache, args.parallel)
        if args.train_only:
            return 0
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        for pair in chosen:
            row = measure(pair, cache, args.methods, json.loads(args.options))
            results = read_json(out) or {"pairs": {}}
            results["pairs"][pair.key] = row
            write_json(out, results)
            print(f"{pair.key}: " + ", ".join(f"{k} {v['loss_barrier']:.3f}"
                                              for k, v in row["methods"].items()), flush=True)
    if out == OUT:
        results, peer = read_json(OUT), read_json(PEER)
        for part in ("val", "test"):
            md = table(results, part, peer)
            print(md)
            replace_section(f"heldout_{part}", md)
            if part == "test":
                replace_section("heldout_test", md, readme=HERE.parent / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
