"""Peak memory of bringing N models into one frame, by frame: what ``FRAME_COPIES`` bounds.

Each frame runs in its own process on N independently initialised GPT-2s (float32, built from
a config), after the models are built: its peak RSS above the process's RSS with the models
loaded, in copies of one model's float32 size. Memory per iteration does not grow with the
iterations, so the runs are short (``--iters``: weight matching's iterations, MergeMany's
rounds and universe matching's Frank-Wolfe iterations).

    python benchmarks/frames_memory.py                    # 3 models, 4 layers, d 768
    python benchmarks/frames_memory.py --n 4 --d 384 --out /tmp/frames.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import machine, provenance, write_json

FRAMES = ("star", "mergemany", "universe")


def run_one(frame: str, n: int, d: int, layers: int, iters: int) -> dict:
    import resource

    import torch
    from transformers import GPT2Config

    from glmc.families import IMPORTERS
    from glmc.matching.frames import FRAME_METHODS
    from glmc.matching.options import WeightMatchingOptions
    from glmc.matching.universe import universe

    torch.set_num_threads(int(os.environ.get("GLMC_THREADS", "2")))
    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=max(1, d // 64), n_inner=4 * d,
                     vocab_size=512, n_positions=64, bos_token_id=None, eos_token_id=None)
    imp = IMPORTERS["gpt2"]
    models = []
    for seed in range(n):
        torch.manual_seed(seed)
        models.append(imp.to_canonical(cfg, dict(imp.stock_model(cfg).state_dict())))
    with open("/proc/self/statm") as f:
        base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    opts = WeightMatchingOptions(max_iter=iters)
    t0 = time.perf_counter()
    if frame == "universe":
        universe(models, opts, max_iter=iters)
    else:
        FRAME_METHODS[frame](models, opts, iters, 0, None)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    params = models[0].n_params()
    return {"frame": frame, "n": n, "d": d, "layers": layers, "iters": iters,
            "params_per_model": params, "model_gb": round(params * 4 / 1e9, 3),
            "base_gb": round(base / 1e9, 3), "peak_gb": round(peak / 1e9, 3),
            "copies_beyond_models": round((peak - base) / (params * 4), 1),
            "seconds": round(seconds, 1), **provenance()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--frames", nargs="+", default=list(FRAMES), choices=FRAMES)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"
                                        / "frames_memory.json"))
    p.add_argument("--one", help=argparse.SUPPRESS)  # (a frame's own process)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.n, args.d, args.layers, args.iters)))
        return
    rows = []
    for frame in args.frames:
        cmd = [sys.executable, __file__, "--one", frame, "--n", str(args.n), "--d",
               str(args.d), "--layers", str(args.layers), "--iters", str(args.iters)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{frame:10} {r['n']} models of {r['params_per_model'] / 1e6:.1f}M: peak "
              f"{r['peak_gb']:.2f} GB, {r['base_gb']:.2f} with the models; "
              f"{r['copies_beyond_models']} copies of one model beyond them; {r['seconds']} s",
              flush=True)
    print(f"wrote {write_json(args.out, {'machine': machine(), 'rows': rows})}")


if __name__ == "__main__":
    main()
