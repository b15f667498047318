"""The paper's public implementation, driven from its own checkout and venv (not glmc's).

Run by ``benchmarks/peer_reference.py`` as ``PEER_PYTHON peer_side.py REQUEST.json`` with the
peer's checkout as the working directory. It loads two stock GPT-2 folders with the peer's
pinned transformers, runs the peer's weight matching (orthogonal residual, or permutations
only), and evaluates its merged model at every λ on the windows glmc wrote (the same windows
glmc evaluates), printing the mean test losses as JSON on stdout. Nothing of the peer is copied:
its modules are imported from its checkout.

Method ``learned``: the peer's learned matching, its merger's latents (``proj``: the residual
map, projected to the nearest orthogonal matrix, and the heads' and MLP units' permutations,
straight-through) trained by a plain loop at the settings of its ``train_merger.py`` (AdamW,
learning rate 3e-4, weight decay 0.01, 5% linear warm-up then cosine, batch 32, gradient norm
clipped at 1 as its Trainer does, 5 epochs over glmc's training windows reshuffled each epoch,
λ ~ U(0.4, 0.6) at each step) and its best validation state kept (the mean loss at λ = 0.5 on
glmc's validation windows, every 50 steps, as its ``load_best_model_at_end`` does with the
sampled λ).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def run(request: dict) -> dict:
    sys.path.insert(0, os.getcwd())  # the peer's checkout
    transformers = importlib.import_module("transformers")
    merger = importlib.import_module("merger")  # the peer's module, from its checkout
    torch.manual_seed(request.get("seed", 0))
    torch.set_default_dtype(getattr(torch, request.get("dtype", "float32")))  # (its latents')
    torch.set_num_threads(request.get("threads", 1))
    windows = load_file(request["windows"])
    x, y = windows["x"], windows["y"]
    bs = request.get("batch_size", 64)
    out = {"methods": {}}
    for method in request["methods"]:
        models = []
        for folder in (request["a"], request["b"]):
            m = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
            models.append(m.to(getattr(torch, request.get("dtype", "float32"))).eval())
        t0 = time.perf_counter()
        gm = merger.GPTMerger(models[0], models[1], token_freqs=None,
                              permutations_only=method.startswith("perm"),
                              iterations=request.get("iterations", 15))
        if method == "learned":
            out.setdefault("learned", {})[method] = learn(gm, request, windows)
        seconds = time.perf_counter() - t0
        if method.endswith("-exact"):
            # The matching's own solution: the learned-matching latents at exactly the identity
            # (the peer starts them at I + N(0, 0.01²), which rotates the residual a little).
            with torch.no_grad():
                for p in gm.proj.values():
                    p.copy_(torch.eye(p.shape[0], p.shape[1]))
        losses = []
        with torch.no_grad():
            for lam in request["lambdas"]:
                gm.set_sampler(None, fixed_coeff=float(lam))
                total, count = 0.0, 0
                for i in range(0, x.shape[0], bs):
                    logits = gm(input_ids=x[i:i + bs]).logits
                    t = y[i:i + bs]
                    total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                   t.reshape(-1), reduction="sum"))
                    count += t.numel()
                losses.append(total / count)
        out["methods"][method] = {"losses": losses, "align_seconds": seconds}
    out["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    return out


def learn(gm, request: dict, windows: dict) -> dict:
    """Train ``gm``'s latents as the peer's ``train_merger.py`` sets its Trainer up (see the
    module's docstring); ``gm`` ends at its best validation state. Returns the run's record."""
    import math
    import random

    random.seed(request.get("seed", 0))  # (its λ sampler draws from ``random``)
    tx, ty, vx, vy = (windows[k] for k in ("train_x", "train_y", "val_x", "val_y"))
    bs, epochs = request.get("train_batch_size", 32), request.get("epochs", 5.0)
    per_epoch = tx.shape[0] // bs
    total = int(per_epoch * epochs)
    warm = math.ceil(0.05 * total)
    params = list(gm.proj.parameters())
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: s / max(1, warm) if s < warm else
                                              0.5 * (1 + math.cos(math.pi * (s - warm)
                                                                  / max(1, total - warm))))
    gen = torch.Generator().manual_seed(request.get("seed", 0))

    def val_loss() -> float:
        gm.set_sampler(None, fixed_coeff=0.5)
        with torch.no_grad():
            losses = [float(F.cross_entropy(gm(input_ids=vx[i:i + 64]).logits.flatten(0, 1),
                                            vy[i:i + 64].flatten()))
                      for i in range(0, vx.shape[0], 64)]
        gm.set_sampler("narrow_uniform")
        return sum(losses) / len(losses)

    best = (val_loss(), 0, {k: v.detach().clone() for k, v in gm.proj.items()})
    start_val, step, t0 = best[0], 0, time.perf_counter()  # (val_loss left λ sampled)
    while step < total:
        order = torch.randperm(tx.shape[0], generator=gen)
        for i in range(per_epoch):
            if step >= total:
                break
            idx = order[i * bs:(i + 1) * bs]
            logits = gm(input_ids=tx[idx]).logits
            loss = F.cross_entropy(logits.flatten(0, 1), ty[idx].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0 or step == total:
                v = val_loss()
                if v < best[0]:
                    best = (v, step, {k: p.detach().clone() for k, p in gm.proj.items()})
    with torch.no_grad():
        for k, p in gm.proj.items():
            p.copy_(best[2][k])
    gm.set_sampler(None)
    return {"steps": total, "best_step": best[1], "start_val": start_val, "best_val": best[0],
            "seconds": round(time.perf_counter() - t0, 1)}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        req = json.load(f)
    json.dump(run(req), sys.stdout)
