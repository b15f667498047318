"""Side by side with the paper's public implementation, on the same GPT-2 pairs, same windows.

The peer (github.com/antoniohonsell/Generalized-LMC-for-Transformers) runs from its own
checkout in its own venv with its pinned transformers 4.50.1; ``peer_side.py`` drives it. glmc
writes its exact test windows to a file, the peer evaluates its merged model on them at every
λ, and both barriers are computed by the same function here. Set-up, once (the peer's
commit measured here: 8c6f323)::

    git clone https://github.com/antoniohonsell/Generalized-LMC-for-Transformers peer/src
    python -m venv peer/venv
    peer/venv/bin/pip install torch==2.13.0
    peer/venv/bin/pip install torch==2.13.0 transformers==4.50.1 einops POT scipy safetensors

Then::

    python benchmarks/peer_reference.py --peer-src peer/src --peer-python peer/venv/bin/python
    python benchmarks/peer_reference.py --peer-src peer/src --peer-python peer/venv/bin/python \
        --suite heldout --pairs t-gpt2-2l --methods learned \
        --out benchmarks/results/peer_learned.json

Peer methods: ``orthogonal`` and ``perm`` (permutations only) as its own evaluation runs them
(the learned-matching latents start at I + N(0, 0.01²), a small rotation on top of the
matching), and ``orthogonal-exact`` / ``perm-exact`` (the latents at exactly I: the matching's
own solution). Writes benchmarks/results/peer_reference.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import HERE, RESULTS, machine, provenance, read_json, write_json
from safetensors.torch import save_file

PEER_METHODS = ("orthogonal", "orthogonal-exact", "perm", "perm-exact")
#: The peer's learned matching (``peer_side.learn``): asked for by name, it reads glmc's
#: training and validation windows too.
PEER_LEARNED = "learned"
GLMC_METHODS = ("none", "weight", "weight-perm")


def test_windows(a: Path, b: Path, data: str) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The windows glmc's barrier evaluates (ids, targets), and the grid."""
    from glmc.barrier import barrier_batches, lambda_grid

    _, _, batches = barrier_batches(str(a), str(b), data, methods=("none", "weight"))
    x = torch.cat([bx for bx, _ in batches])
    y = torch.cat([by for _, by in batches])
    return x, y, lambda_grid(11)


def learning_windows(a: Path, data: str) -> dict[str, torch.Tensor]:
    """glmc's training and validation splits of ``data`` as the model's non-overlapping
    windows (what the peer's learned matching reads: ``peer_side.learn``)."""
    from glmc.evaluate import load_eval_data
    from glmc.io.folders import load_model

    config = load_model(a).canonical.config
    ds = load_eval_data(data, config, folders=[a])
    context = config.n_positions
    out = {}
    for split in ("train", "val"):
        xs, ys = zip(*ds.eval_batches(split, 4096, context), strict=True)
        out[f"{split}_x"], out[f"{split}_y"] = torch.cat(xs), torch.cat(ys)
    return out


def peer_losses(peer_src: Path, peer_python: Path, a: Path, b: Path, x: torch.Tensor,
                y: torch.Tensor, lambdas: list, methods: list[str], threads: int,
                extra: dict[str, torch.Tensor] | None = None, epochs: float = 5.0,
                dtype: str = "float32") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        win = Path(tmp) / "windows.safetensors"
        save_file({"x": x.contiguous(), "y": y.contiguous(),
                   **{k: v.contiguous() for k, v in (extra or {}).items()}}, str(win))
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"a": str(a.resolve()), "b": str(b.resolve()),
                                   "windows": str(win), "lambdas": lambdas,
                                   "methods": methods, "threads": threads,
                                   "epochs": epochs, "dtype": dtype}))
        done = subprocess.run([str(peer_python), str(HERE / "peer_side.py"), str(req)],
                              cwd=peer_src, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the peer failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpt2_pairs(suite: str, cache: Path) -> list[tuple[str, str, Path, Path, str]]:
    """The GPT-2 pairs of a suite (``quality``: glmc-trained, ``heldout``: trained by other
    code): (key, title, folder A, folder B, data)."""
    if suite == "heldout":
        import heldout

        return [(q.key, q.title, *heldout.folders(q, cache), heldout.data_path(q, cache))
                for q in heldout.suite() if q.family == "gpt2"]
    import quality

    return [(q.key, q.title, *quality.folders(cache, q), q.train.data)
            for q in quality.suite() if q.train.arch == "gpt2"]


def main(argv: list[str] | None = None) -> int:
    from glmc.barrier import barrier, run_barrier

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-src", type=Path, required=True)
    p.add_argument("--peer-python", type=Path, required=True)
    p.add_argument("--suite", choices=("quality", "heldout"), default="quality",
                   help="the pairs: glmc-trained (quality.py) or trained by other code "
                   "(heldout.py; its results go to results/peer_heldout.json by default)")
    p.add_argument("--pairs", nargs="*", default=None, help="GPT-2 pairs of the suite")
    p.add_argument("--cache", default="glmc-cache")
    p.add_argument("--methods", nargs="*", default=list(PEER_METHODS),
                   choices=[*PEER_METHODS, PEER_LEARNED],
                   help=f"the peer's methods (default: its weight matchings; '{PEER_LEARNED}': "
                   "its learned matching, about as long as glmc's)")
    p.add_argument("--peer-epochs", type=float, default=5.0,
                   help="epochs of the peer's learned matching (its train_merger.py: 5)")
    p.add_argument("--peer-dtype", choices=("float32", "float64"), default="float32",
                   help="the peer's models' dtype (float64: for a pair where its own check "
                   "of the rewrites, logits within 1e-5, fails in float32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    out = args.out or RESULTS / ("peer_heldout.json" if args.suite == "heldout"
                                 else "peer_reference.json")
    torch.set_num_threads(args.threads)
    chosen = [q for q in gpt2_pairs(args.suite, Path(args.cache))
              if args.pairs is None or q[0] in args.pairs]
    results = read_json(out) or {"pairs": {}}
    for key, title, a, b, data in chosen:
        if not (a / "config.json").is_file() or not (b / "config.json").is_file():
            print(f"{key}: not trained yet (python benchmarks/{args.suite}.py --train-only)")
            continue
        x, y, lambdas = test_windows(a, b, data)
        t0 = time.perf_counter()
        extra = learning_windows(a, data) if PEER_LEARNED in args.methods else None
        peer = peer_losses(args.peer_src, args.peer_python, a, b, x, y, lambdas, args.methods,
                           args.threads, extra, args.peer_epochs, args.peer_dtype)
        peer_seconds = time.perf_counter() - t0
        ours = run_barrier(str(a), str(b), data, methods=GLMC_METHODS + (
            ("learned",) if PEER_LEARNED in args.methods else ()))
        run = provenance(peer_versions=peer["versions"], command=" ".join(sys.argv))
        row: dict = {"title": title, "tokens": int(y.numel()), "peer": {}, "glmc": {},
                     "peer_versions": peer["versions"], "peer_seconds": round(peer_seconds, 1),
                     "run": run}
        for name, r in peer["methods"].items():
            row["peer"][name] = {"loss_barrier": barrier(lambdas, r["losses"]),
                                 "losses": r["losses"],
                                 "align_seconds": round(r["align_seconds"], 2), **run}
            if name in peer.get("learned", {}):
                row["peer"][name]["learned"] = peer["learned"][name]
        for name, m in ours.methods.items():
            row["glmc"][name] = {"loss_barrier": m.loss_barrier, "losses": m.losses,
                                 "align_seconds": round(m.align_seconds, 2)}
        ends = [(r["losses"][0], r["losses"][-1]) for r in row["peer"].values()]
        ref = row["glmc"]["none"]["losses"]
        row["endpoints_agree"] = all(abs(l0 - ref[0]) < 5e-4 and abs(l1 - ref[-1]) < 5e-4
                                     for l0, l1 in ends)
        results["pairs"][key] = row  # (one run's rows: never mixed with an earlier's)
        print(f"{key}: " + ", ".join(
            f"peer {k} {v['loss_barrier']:.3f}" for k, v in row["peer"].items()) + "; " +
            ", ".join(f"glmc {k} {v['loss_barrier']:.3f}" for k, v in row["glmc"].items()) +
            f"; endpoints agree: {row['endpoints_agree']}", flush=True)
        results["machine"] = machine()
        write_json(out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
