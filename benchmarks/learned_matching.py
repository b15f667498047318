"""Learned-matching step time against a plain training step of one model of the same size.

Reports the ratio (the figure to watch; aim under 3x) and where a learned step spends its time:
the hard assignments (Hungarian on every permutation latent, run together on a thread pool),
building π(θ_B) and θ(λ) from the latents, and the forward/backward.

    python benchmarks/learned_matching.py                  # tiny, the demo's and the paper's
    python benchmarks/learned_matching.py --sizes demo --threads 1
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from _common import RESULTS, machine, provenance, write_json
from torch.func import functional_call
from transformers import GPT2Config

from glmc.families import IMPORTERS
from glmc.matching.learned import Latents, PathModel, task_loss
from glmc.matching.weight import weight_matching

SIZES = {  # n_layer, n_embd, n_head, n_inner, vocab, context, batch
    "tiny": (2, 64, 4, 256, 65, 64, 16),
    "demo": (3, 128, 4, 512, 65, 64, 32),  # the demo's GPT-2 and its learned-matching batch
    "paper": (6, 256, 4, 1024, 65, 256, 32),
}


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def run(name: str, repeats: int) -> dict:
    n_layer, d, h, f, vocab, ctx, batch = SIZES[name]
    cfg = GPT2Config(n_layer=n_layer, n_embd=d, n_head=h, n_inner=f, vocab_size=vocab,
                     n_positions=ctx, bos_token_id=None, eos_token_id=None,
                     tie_word_embeddings=False)
    imp = IMPORTERS["gpt2"]
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        models.append(imp.to_canonical(cfg, dict(imp.stock_model(cfg).state_dict())))
    a, b = models
    x = torch.randint(0, vocab, (batch, ctx))
    y = torch.randint(0, vocab, (batch, ctx))

    # A plain training step of one model (canonical module, AdamW on its weights).
    module = a.module(torch.float32).train()
    opt = torch.optim.AdamW(module.parameters(), 1e-4)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        task_loss(module(x), y).backward()
        opt.step()

    plain = timed(train_step, repeats)

    init = weight_matching(a, b).transform
    latents = Latents(a, b, init, "orthogonal", "invertible", fix_ones=True)
    path = PathModel(a, b, latents)
    lat_opt = torch.optim.AdamW(latents.parameters(), 1e-2)
    pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
    parts = {"assign": 0.0, "build": 0.0, "forward_backward": 0.0, "optimizer": 0.0}

    def learned_step() -> None:
        t0 = time.perf_counter()
        latents.project(pool)
        t1 = time.perf_counter()
        lat_opt.zero_grad(set_to_none=True)
        state = path.state(0.5)
        t2 = time.perf_counter()
        task_loss(functional_call(path.module, state, (x,)), y).backward()
        t3 = time.perf_counter()
        lat_opt.step()
        t4 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            parts[k] += v

    learned = timed(learned_step, repeats)
    total = sum(parts.values())
    pool.shutdown()
    return {"size": name, "params": a.n_params(), "batch": [batch, ctx],
            "plain_step_s": round(plain, 4), "learned_step_s": round(learned, 4),
            "ratio": round(learned / plain, 2),
            "split": {k: round(v / total, 3) for k, v in parts.items()},
            **provenance()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["tiny", "demo", "paper"], choices=list(SIZES))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "learned_matching.json"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in args.sizes:
        r = run(name, args.repeats)
        rows.append(r)
        print(f"{r['size']:<6} {r['params'] / 1e6:6.2f}M  plain {r['plain_step_s']:.3f}s  "
              f"learned {r['learned_step_s']:.3f}s  ratio {r['ratio']:.2f}x  {r['split']}",
              flush=True)
    print(f"wrote {write_json(args.out, {'machine': machine(), 'results': rows})}")


if __name__ == "__main__":
    main()
