"""The paper's public implementation, driven from its own checkout and venv (not glmc's).

Run by ``benchmarks/peer_reference.py`` as ``PEER_PYTHON peer_side.py REQUEST.json`` with the
peer's checkout as the working directory. It loads two stock GPT-2 folders with the peer's
pinned transformers, runs the peer's weight matching (orthogonal residual, or permutations
only), and evaluates its merged model at every λ on the windows glmc wrote (the same windows
glmc evaluates), printing the mean test losses as JSON on stdout. Nothing of the peer is copied:
its modules are imported from its checkout.
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
    torch.set_num_threads(request.get("threads", 1))
    windows = load_file(request["windows"])
    x, y = windows["x"], windows["y"]
    bs = request.get("batch_size", 64)
    out = {"methods": {}}
    for method in request["methods"]:
        models = []
        for folder in (request["a"], request["b"]):
            m = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
            models.append(m.float().eval())
        t0 = time.perf_counter()
        gm = merger.GPTMerger(models[0], models[1], token_freqs=None,
                              permutations_only=method.startswith("perm"),
                              iterations=request.get("iterations", 15))
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


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        req = json.load(f)
    json.dump(run(req), sys.stdout)
