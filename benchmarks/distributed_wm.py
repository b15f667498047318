"""Weight matching spread across ranks: measured unit costs, and what they say for 7B and 70B.

1. Per-unit costs, measured on one thread on two moderately sized Llama-shaped pairs (2
   layers, d 1024, heads of 128): "7b-like" (MLP 2752 = d·11008/4096, 8 heads, no GQA) and
   "70b-like" (MLP 3584 = d·28672/8192, 8 query heads on 1 key/value head, as 64 on 8).
   Seconds of an MLP unit's step, of a layer's heads, of the residual step's per-layer part
   (moving the fresh tensors, their products, their terms) and of its Procrustes (timed by
   itself at d 1024 and 2048: ∝ d³).
2. Those costs scaled by multiply-adds to Llama-2-7B (32 layers, d 4096, 32 heads, MLP
   11008) and Llama-2-70B (80 layers, d 8192, 64 query / 8 key-value heads, MLP 28672):

       MLP unit    t · (3·f²·d) / (3·f₀²·d₀)         (its cross-correlations; the assignment,
                                                    f² to f³, is measured within and scales
                                                    no worse on these near-random pairs)
       heads       t · (2·d³ + 2·d_kv²·d) / (same at the measured shape)
       residual    t · (2·d³ + 2·d_kv·d²) / (same) per layer, + Procrustes t · (d / d₀)³

   One iteration on R machines of c cores: L·(t_mlp + t_heads + t_res)/(R·c) + t_svd +
   hops·d²·8 B / bandwidth (the ordered sums pass a d x d float64 matrix once per rank,
   twice per residual step, plus rank 0's map to all; 10 Gb/s assumed between machines,
   none on one). 15 iterations solve about 0.58 of the units each (GPT-2 small's measured
   sweeps, benchmarks/results/weight_matching.json).
3. Memory per machine against 24 GB: each rank reads only its share of the pair
   (``glmc.matching.spread.load_pair``), so a machine holds its share of both models in
   float32, rank 0 the embeddings and heads besides (only the stream touches them), plus
   the working set split across ranks: A's weighted copies and B moved (one model each,
   less the embeddings), the residual cache's d x d float64 per MLP matrix, each worker's
   f x f cost buffers (12 B per entry). Then rank 0 writes B aligned part by part
   (``glmc.io.moved``): a part of at most ``PART_BYTES`` of canonical tensors, or one
   output tensor's (the embedding), made, moved and exported (three copies), then the
   certificate's float64 block (``BLOCK_PARAMS``, or the embedding table) and runtime.
4. A real run: one process (one thread) vs two ranks (torchrun, one thread each) on a small
   GPT-2 pair read from stock folders as ``glmc align`` reads them (each rank its share,
   handed over to weight matching): seconds of loading and of weight matching in each,
   peak memory, and whether the results are equal.

    python benchmarks/distributed_wm.py            # writes benchmarks/results/distributed_wm.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, provenance, write_json

from glmc.io.moved import PART_BYTES
from glmc.io.outputs import RUNTIME_BYTES
from glmc.verify import BLOCK_PARAMS

#: The measured shapes: name -> (layers, d, heads, kv heads, MLP, vocab)
MEASURED = {"7b-like": (2, 1024, 8, 8, 2752, 256), "70b-like": (2, 1024, 8, 1, 3584, 256)}
#: The targets: name -> (layers, d, heads, kv heads, MLP, vocab, measured shape to scale)
TARGETS = {"Llama-2-7B": (32, 4096, 32, 32, 11008, 32000, "7b-like"),
           "Llama-2-70B": (80, 8192, 64, 8, 28672, 32000, "70b-like")}
MACHINE_GB = 24
CORES = 2
BANDWIDTH = 1.25e9  # bytes/s between machines (10 Gb/s)
ITERS = 15
DUE = 0.58  # units solved per iteration, on average (GPT-2 small, 15 iterations)
#: The real run's GPT-2 pair: (layers, d, heads, MLP, vocab)
REAL = (4, 768, 12, 3072, 512)
REPEATS = 2


def llama(layers: int, d: int, heads: int, kv: int, f: int, vocab: int, seed: int):
    import torch
    from transformers import LlamaConfig

    from glmc.families import IMPORTERS

    cfg = LlamaConfig(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=f, vocab_size=vocab,
                      max_position_embeddings=64, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    imp = IMPORTERS["llama"]
    torch.manual_seed(seed)
    return imp.to_canonical(cfg, dict(imp.stock_model(cfg).state_dict()))


def gpt2_config(layers: int, d: int, heads: int, f: int, vocab: int):
    from transformers import GPT2Config

    return GPT2Config(n_layer=layers, n_embd=d, n_head=heads, n_inner=f, vocab_size=vocab,
                      n_positions=64, bos_token_id=None, eos_token_id=None)


def mlp_macs(d: int, f: int) -> float:
    return 3.0 * f * f * d


def heads_macs(d: int, d_kv: int) -> float:
    return 2.0 * d**3 + 2.0 * d_kv**2 * d


def residual_macs(d: int, d_kv: int) -> float:
    return 2.0 * d**3 + 2.0 * d_kv * d * d


def measure_units(name: str) -> dict:
    """Seconds per MLP unit, per layer's heads and of the residual step (one thread), from
    the iterations that solved every unit; the cost formulas checked against
    ``spread.unit_cost``."""
    import torch

    from glmc.matching.problem import Problem
    from glmc.matching.spread import unit_cost
    from glmc.matching.weight import WeightMatchingOptions, weight_matching

    layers, d, heads, kv, f, vocab = MEASURED[name]
    a, b = (llama(layers, d, heads, kv, f, vocab, seed) for seed in (0, 1))
    d_kv = d // heads * kv
    prob = Problem(a, b, WeightMatchingOptions())
    shapes = {n: tuple(t.shape) for n, t in a.state.items()}
    costs = {u: unit_cost(prob, u, shapes) for u in prob.units}
    role = {u: a.spec.roles.get(u) for u in prob.units}
    mlp_cost = next(c for u, c in costs.items() if role[u] == "mlp")
    head_cost = next(c for u, c in costs.items() if role[u] == "heads")
    assert mlp_cost == mlp_macs(d, f) + f * f, (mlp_cost, mlp_macs(d, f))
    del prob
    t0 = time.perf_counter()
    r = weight_matching(a, b, WeightMatchingOptions(max_iter=3, tol=0))
    total = time.perf_counter() - t0
    full = [row for row in r.trace if row["units_solved"] == len(costs)]
    mlp = sum(row["unit_seconds"]["mlp"] for row in full) / (len(full) * layers)
    hd = sum(row["unit_seconds"]["heads"] for row in full) / (len(full) * layers)
    residual = sum(row["seconds"]["residual"] for row in r.trace) / len(r.trace)
    svd = procrustes_seconds(d)
    return {"shape": dict(zip(("layers", "d", "heads", "kv_heads", "mlp", "vocab"),
                              MEASURED[name], strict=True)),
            "params": a.n_params(), "threads": torch.get_num_threads(),
            "iterations": len(r.trace), "full_sweeps": len(full), "total_s": round(total, 2),
            "mlp_unit_s": round(mlp, 4), "heads_unit_s": round(hd, 4),
            "residual_step_s": round(residual, 4), "procrustes_s": round(svd, 4),
            "residual_per_layer_s": round(max(0.0, residual - svd) / layers, 4),
            "unit_cost": {"mlp": mlp_cost, "heads": head_cost},
            "macs": {"mlp": mlp_macs(d, f), "heads": heads_macs(d, d_kv),
                     "residual_per_layer": residual_macs(d, d_kv)}}


def procrustes_seconds(d: int, repeats: int = 2) -> float:
    import torch

    from glmc.matching.solvers import procrustes

    m = torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        procrustes(m, fix_ones=False)
        best = min(best, time.perf_counter() - t0)
    return best


def params(layers: int, d: int, heads: int, kv: int, f: int, vocab: int) -> float:
    d_kv = d // heads * kv
    return 2 * vocab * d + layers * (2 * d * d + 2 * d * d_kv + 3 * d * f + 2 * d) + d


def estimate(target: str, measured: dict, svd_exponent: float) -> dict:
    layers, d, heads, kv, f, vocab, base = TARGETS[target]
    m = measured[base]
    s = m["shape"]
    d_kv = d // heads * kv
    d0_kv = s["d"] // s["heads"] * s["kv_heads"]
    t_mlp = m["mlp_unit_s"] * mlp_macs(d, f) / mlp_macs(s["d"], s["mlp"])
    t_heads = m["heads_unit_s"] * heads_macs(d, d_kv) / heads_macs(s["d"], d0_kv)
    t_res = (m["residual_per_layer_s"] * residual_macs(d, d_kv)
             / residual_macs(s["d"], d0_kv))
    t_svd = m["procrustes_s"] * (d / s["d"]) ** svd_exponent
    p = params(layers, d, heads, kv, f, vocab)
    gb = 1e9
    models = 2 * p * 4 / gb  # (both, float32)
    embeddings = 2 * 2 * vocab * d * 4 / gb  # (tables and heads of both: rank 0's)
    weighted = 2 * (p * 4 / gb - embeddings / 2)  # A's weighted copies and B moved
    caches = 3 * layers * d * d * 8 / gb  # one d x d float64 per MLP matrix
    buffers = 12 * f * f / gb  # per worker (one per core)
    rows = {}
    for machines in (1, 8):
        units = layers * (t_mlp + t_heads) * DUE / (machines * CORES)
        residual = layers * t_res / (machines * CORES) + t_svd
        hops = 0 if machines == 1 else (2 * machines + 3) * d * d * 8 / BANDWIDTH
        per_iter = units + residual + hops
        # (a rank's direct products computed ahead of its turn in the ordered sum)
        prefetch = 0.0 if machines == 1 else min(2.0, 4 * layers / machines * d * d * 8 / gb)
        working = (weighted + caches) / machines + CORES * buffers + prefetch
        matching = (models + working if machines == 1
                    else models / machines + embeddings + working)
        writing = (3 * max(PART_BYTES / gb, vocab * d * 4 / gb)  # (rank 0, part by part)
                   + max(BLOCK_PARAMS, vocab * d) * 8 / gb + RUNTIME_BYTES / gb)
        rows[machines] = {
            "per_iteration_s": round(per_iter, 1), "units_s": round(units, 1),
            "residual_s": round(residual, 1), "communication_s": round(hops, 1),
            "total_h": round(ITERS * per_iter / 3600, 2),
            "memory_gb": round(matching, 1), "fits_24gb": matching <= MACHINE_GB,
            "rank0_writing_gb": round(writing, 1),
            "rank0_writing_fits_24gb": writing <= MACHINE_GB}
    # Machines of 24 GB the matching takes (rank 0 holding the embeddings), with one worker
    # per machine where two workers' buffers do not fit.
    need = None
    for workers in (CORES, 1):
        fixed = embeddings + workers * buffers + 2.0
        if fixed < MACHINE_GB:
            need = {"machines": int(-(-(models + weighted + caches) // (MACHINE_GB - fixed))),
                    "workers_per_machine": workers}
            break
    return {"params": p, "shape": dict(zip(("layers", "d", "heads", "kv_heads", "mlp",
                                            "vocab"), TARGETS[target][:6], strict=True)),
            "scaled_from": base,
            "seconds": {"mlp_unit": round(t_mlp, 1), "heads_unit": round(t_heads, 1),
                        "residual_per_layer": round(t_res, 1), "procrustes": round(t_svd, 1)},
            "memory_gb": {"models_float32": round(models, 1),
                          "weighted_and_moved": round(weighted, 1),
                          "residual_caches": round(caches, 1),
                          "cost_buffers_per_worker": round(buffers, 1),
                          "embeddings_rank0": round(embeddings, 1)},
            "machines_for_matching": need,
            "one_machine": rows[1], "eight_machines": rows[8]}


# -- the real 2-rank run ----------------------------------------------------------------------


def real_run(out: str, folders: str) -> None:
    """Weight matching on the REAL pair in this process (alone or as a rank), read from its
    stock folders as ``glmc align`` reads them: its seconds, result and peak memory, into
    ``out`` (formatted with the rank)."""
    import resource

    import torch

    from glmc.distributed import process_group, rank, spread
    from glmc.io.folders import load_model
    from glmc.matching.spread import load_pair
    from glmc.matching.weight import WeightMatchingOptions, weight_matching

    torch.set_num_threads(1)
    opts = WeightMatchingOptions(max_iter=3, tol=0, hand_over=True)
    paths = [Path(folders) / name for name in "ab"]
    with process_group():
        t0 = time.perf_counter()
        if spread():
            a, b = (m.canonical for m in load_pair(*paths, opts))
        else:
            a, b = (load_model(p).canonical for p in paths)
        loading = time.perf_counter() - t0
        held = sum(t.numel() * 4 for m in (a, b) for t in m.state.values() if not t.is_meta)
        t0 = time.perf_counter()
        r = weight_matching(a, b, opts)
        seconds = time.perf_counter() - t0
        torch.save({"seconds": seconds, "load_seconds": loading, "loaded_gb": held / 1e9,
                    "distances": [row["distance"] for row in r.trace],
                    "elements": {s: e.tensors() for s, e in r.transform.elements.items()},
                    "units": sum(row["seconds"]["units"] for row in r.trace),
                    "residual": sum(row["seconds"]["residual"] for row in r.trace),
                    "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20},
                   out.format(rank()))


def real(tmp: Path) -> dict:
    """The REAL pair in one process (one thread) and on two ranks (one thread each)."""
    import torch

    from glmc.families import IMPORTERS

    for name, seed in (("a", 0), ("b", 1)):  # (stock folders, as a user brings them)
        torch.manual_seed(seed)
        IMPORTERS["gpt2"].stock_model(gpt2_config(*REAL)).save_pretrained(str(tmp / name))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs: dict[str, list] = {"one": [], "two": []}
    for repeat in range(REPEATS):  # (alternated, the faster of each kept: the machine is shared)
        for name, launch in (("one", []), ("two", ["-m", "torch.distributed.run",
                                                   "--standalone", "--nproc-per-node=2"])):
            out = tmp / f"{name}{repeat}-{{}}.pt"
            cmd = [sys.executable, *launch, __file__, "--real", str(out), "--folders",
                   str(tmp)]
            subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
            ranks = [torch.load(str(out).format(r), weights_only=True)
                     for r in range(1 if name == "one" else 2)]
            runs[name].append(ranks)
    one, (two, two_1) = (min(runs[k], key=lambda ranks: ranks[0]["seconds"])
                         for k in ("one", "two"))
    one = one[0]
    same = all(one["distances"] == x["distances"] and all(
        torch.equal(t, x["elements"][s][k])
        for s, ts in one["elements"].items() for k, t in ts.items())
        for ranks in runs["two"] + runs["one"] for x in ranks)

    def phases(x: dict) -> dict:
        return {"units": round(x["units"], 2), "residual": round(x["residual"], 2)}

    return {"pair": dict(zip(("layers", "d", "heads", "mlp", "vocab"), REAL, strict=True)),
            "iterations": len(one["distances"]),
            "one_process_s": round(one["seconds"], 2), "two_ranks_s": round(two["seconds"], 2),
            "speedup": round(one["seconds"] / two["seconds"], 2),
            "phases_s": {"one": phases(one), "two": phases(two)},
            "peak_rss_gb": {"one": round(one["peak_rss_gb"], 2),
                            "two": [round(two["peak_rss_gb"], 2), round(two_1["peak_rss_gb"], 2)]},
            "loaded_gb": {"one": round(one["loaded_gb"], 3),
                          "two": [round(two["loaded_gb"], 3), round(two_1["loaded_gb"], 3)]},
            "load_s": {"one": round(one["load_seconds"], 2),
                       "two": [round(two["load_seconds"], 2), round(two_1["load_seconds"], 2)]},
            "all_seconds": {k: [round(r[0]["seconds"], 2) for r in v] for k, v in runs.items()},
            "load_average_after": os.getloadavg(), "identical": same}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"
                                        / "distributed_wm.json"))
    p.add_argument("--real", help=argparse.SUPPRESS)  # (a rank of the real run)
    p.add_argument("--folders", help=argparse.SUPPRESS)  # (the real run's pair)
    p.add_argument("--skip-real", action="store_true", help="skip the 2-rank run")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.real:
        real_run(args.real, args.folders)
        return
    t0 = time.perf_counter()
    measured = {name: measure_units(name) for name in MEASURED}
    for name, m in measured.items():
        print(f"{name:9} MLP unit {m['mlp_unit_s']:.3f}s  heads {m['heads_unit_s']:.3f}s  "
              f"residual step {m['residual_step_s']:.3f}s (Procrustes {m['procrustes_s']:.3f}s,"
              f" {m['residual_per_layer_s']:.3f}s per layer)", flush=True)
    svd2 = procrustes_seconds(2048)
    import math
    exponent = math.log(svd2 / measured["7b-like"]["procrustes_s"]) / math.log(2)
    exponent = min(3.0, max(exponent, 2.5))  # (d³ in theory; smaller sizes run less well)
    estimates = {t: estimate(t, measured, exponent) for t in TARGETS}
    print(f"\n{'pair':12} {'machines':>8} {'s/iter':>8} {'units':>7} {'resid':>7} {'comm':>5} "
          f"{'15 it (h)':>9} {'GB/machine':>10} {'fits 24GB':>9} {'rank 0 writing GB':>17}")
    for t, e in estimates.items():
        for key, n in (("one_machine", 1), ("eight_machines", 8)):
            r = e[key]
            print(f"{t:12} {n:>8} {r['per_iteration_s']:>8.0f} {r['units_s']:>7.0f} "
                  f"{r['residual_s']:>7.0f} {r['communication_s']:>5.1f} {r['total_h']:>9.2f} "
                  f"{r['memory_gb']:>10.1f} {'yes' if r['fits_24gb'] else 'no':>9} "
                  f"{r['rank0_writing_gb']:>17.1f}")
        print(f"{'':12} seconds {e['seconds']}; memory (GB) {e['memory_gb']}; machines of "
              f"24 GB for the matching: {e['machines_for_matching']}")
    report = {"machine": machine(), "provenance": provenance(load_average=os.getloadavg()),
              "assumptions": {"cores_per_machine": CORES, "machine_gb": MACHINE_GB,
                              "bandwidth_bytes_per_s": BANDWIDTH, "iterations": ITERS,
                              "units_due_per_iteration": DUE,
                              "procrustes_exponent": round(exponent, 2),
                              "procrustes_s_2048": round(svd2, 3)},
              "measured": measured, "estimates": estimates}
    if not args.skip_real:
        with tempfile.TemporaryDirectory() as tmp:
            report["real_run"] = real(Path(tmp))
        rr = report["real_run"]
        print(f"\nreal run, GPT-2 {rr['pair']}: one process {rr['one_process_s']}s, two ranks "
              f"{rr['two_ranks_s']}s (x{rr['speedup']}), identical: {rr['identical']}; "
              f"tensors read {rr['loaded_gb']} GB, peak RSS {rr['peak_rss_gb']} GB")
    report["total_s"] = round(time.perf_counter() - t0, 1)
    print(f"wrote {write_json(args.out, report)}")
    print(json.dumps({"total_s": report["total_s"]}))


if __name__ == "__main__":
    main()
