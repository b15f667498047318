"""End-to-end benchmark of ``glmc align A B -o OUT``: wall time and peak RSS of the command's
own process, split by phase (load, reference logits, match, write, certify), on pairs of
independently initialised models written as transformers writes them.

    python benchmarks/align_end_to_end.py                          # gpt2-small, then tinyllama
    python benchmarks/align_end_to_end.py --cases llama7b-2l,llama7b-4l    # the 7B slices
    python benchmarks/align_end_to_end.py --cases gpt2-small --threads 2
    python benchmarks/align_end_to_end.py --cache /data/glmc-cache --out results.json
    python benchmarks/align_end_to_end.py --without-matching --max-rss-gb 13
    python benchmarks/align_end_to_end.py --write   # and writing B aligned: whole, in parts

Cases (generated with a fixed seed per model, never downloaded, cached under ``--cache``):

- ``gpt2-small``: GPT2LMHeadModel, 12 layers, d 768, 12 heads, vocabulary 50257, context
  1024, untied head (163M parameters each), float32 safetensors.
- ``tinyllama``: LlamaForCausalLM of TinyLlama-1.1B's shape (22 layers, hidden 2048, 32 query
  and 4 key/value heads, intermediate 5632, vocabulary 32000, untied head: 1.1B parameters
  each), bfloat16 safetensors in 1 GB shards (``model-0000x-of-0000y.safetensors`` and the
  index).
- ``llama7b-2l``, ``llama7b-4l``: Llama-2-7B's widths (hidden 4096, 32 heads, intermediate
  11008, vocabulary 32000, bfloat16) with 2 and 4 of its 32 layers; ``tinyllama-2l``,
  ``tinyllama-4l``: the same slices of the TinyLlama pair. From each pair of slices the whole
  pair's wall and peak RSS are extrapolated per layer (the JSON's ``extrapolated``), and for
  TinyLlama compared with its whole run.

Each model is generated in its own process; the command runs as a subprocess of this script
(its peak RSS is read with ``os.wait4``, its phases from OUT's ``glmc_report.json``); OUT is
then checked to hold the stored dtype and to load with ``AutoModelForCausalLM.from_pretrained
(OUT, local_files_only=True)``. The table compares each row with the issue's targets; the JSON
(``--out``) holds the rows with the machine, the commit and the load average before and after
(other processes on the machine slow a run and compete for its memory).

``--without-matching`` adds, before each case, a row of the command's own steps with the
identity for the transform (load, reference logits, write, certify: what ``glmc align`` costs
beside weight matching). A run whose RSS passes ``--max-rss-gb`` (default: the memory
available when it starts, less 1 GB) is stopped and reported as such, so that a shared
machine is never run out of memory.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    HERE,
    RESULTS,
    WORKLOAD_REFERENCE_S,
    allowance,
    machine,
    matrix_workload,
    provenance,
    write_json,
)

CASES: dict[str, dict[str, Any]] = {
    "gpt2-small": {
        "model_type": "gpt2", "dtype": "float32", "shard": None,
        "config": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                       tie_word_embeddings=False),
        "target": {"seconds": 40, "peak_rss_gb": 2.5},
    },
    "tinyllama": {
        "model_type": "llama", "dtype": "bfloat16", "shard": "1GB",
        "config": dict(num_hidden_layers=22, hidden_size=2048, num_attention_heads=32,
                       num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                       max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                       tie_word_embeddings=False, hidden_act="silu"),
        "target": {"seconds": 10 * 60, "peak_rss_gb": 8.0},
    },
}
#: Slices of a Llama-2-7B-shaped pair (hidden 4096, 32 heads, intermediate 11008, vocabulary
#: 32000, bfloat16) with 2 and 4 of its 32 layers: measured to extrapolate the whole pair per
#: layer (their target is the whole pair's memory, 20 GB; no time target: an hour), and the
#: same slices of the TinyLlama pair, whose whole run checks the extrapolation.
SLICE_LAYERS = (2, 4)
for _n in SLICE_LAYERS:
    CASES[f"llama7b-{_n}l"] = {
        "model_type": "llama", "dtype": "bfloat16", "shard": "2GB",
        "config": dict(num_hidden_layers=_n, hidden_size=4096, num_attention_heads=32,
                       num_key_value_heads=32, intermediate_size=11008, vocab_size=32000,
                       max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                       tie_word_embeddings=False, hidden_act="silu"),
        "target": {"seconds": 3600, "peak_rss_gb": 20.0},
    }
    # (the same slices of the 1.1B pair: the per-layer extrapolation checked against its
    # whole run)
    CASES[f"tinyllama-{_n}l"] = {**CASES["tinyllama"], "config": {
        **CASES["tinyllama"]["config"], "num_hidden_layers": _n}}
PHASES = ("load", "reference", "match", "write", "certify")
#: The suffix of a row run with ``--glmc-args "--stream always"`` (A streamed from its files).
STREAMED = " (A streamed)"


# -- the models -------------------------------------------------------------------------------


def generate(case: str, seed: int, folder: Path) -> None:
    """Write model ``seed`` of ``case`` into ``folder`` (run in a process of its own)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    spec = CASES[case]
    torch.manual_seed(seed)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    dtype = getattr(torch, spec["dtype"])
    if spec["model_type"] == "gpt2":
        model = GPT2LMHeadModel._from_config(GPT2Config(**spec["config"]), dtype=dtype)
    else:
        model = LlamaForCausalLM._from_config(LlamaConfig(**spec["config"]), dtype=dtype)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(str(tmp), **kwargs)
    os.replace(tmp, folder)


def cached_pair(case: str, cache: Path, threads: int) -> tuple[Path, Path]:
    """The case's two models under ``cache`` (generated on first use, one process each)."""
    folders = []
    for seed in (0, 1):
        folder = cache / case / f"seed{seed}"
        if not (folder / "config.json").is_file():
            folder.parent.mkdir(parents=True, exist_ok=True)
            print(f"generating {case} seed {seed} in {folder} ...", flush=True)
            subprocess.run([sys.executable, __file__, "--generate", case, str(seed),
                            str(folder)], check=True, env=_env(threads))
        folders.append(folder)
    return folders[0], folders[1]


def _env(threads: int) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                TRANSFORMERS_VERBOSITY="error")


# -- one run ----------------------------------------------------------------------------------


def glmc_command() -> list[str]:
    script = Path(sys.executable).with_name("glmc")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from glmc.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))"]


def run_case(case: str, cache: Path, threads: int, keep: bool,
             extra: list[str] | None = None, max_rss_gb: float | None = None,
             matching: bool = True, workload_s: float | None = None) -> dict[str, Any]:
    """One timed run of ``glmc align`` on the case's pair (``matching=False``: the same
    command's steps with the identity for the transform, see :func:`without_matching`);
    ``workload_s``: this machine's yardstick (``_common.matrix_workload``), which scales
    the time target."""
    spec = CASES[case]
    a, b = cached_pair(case, cache, threads)
    out = cache / case / "aligned"
    shutil.rmtree(out, ignore_errors=True)
    if matching:
        argv = [*glmc_command(), "align", str(a), str(b), "-o", str(out), "--json",
                *(extra or [])]
    else:
        argv = [sys.executable, __file__, "--without-matching", str(a), str(b), str(out)]
    load_before = os.getloadavg()
    print(f"running {' '.join(argv)}", flush=True)
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, env=_env(threads), stdout=out_f, stderr=err_f)
        stopped = guard(proc.pid, max_rss_gb)
        _, status, usage = os.wait4(proc.pid, 0)  # (this child's own peak RSS)
        wall = time.perf_counter() - started
        rc = proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0), err_f.seek(0)
        stdout, stderr = out_f.read(), err_f.read()
    streamed = STREAMED if "--stream always" in " ".join(extra or []) else ""
    row: dict[str, Any] = {"case": (case if matching else f"{case} (no matching)") + streamed,
                           "glmc_args": extra or [], "rc": rc, "wall_s": round(wall, 1),
                           "threads": threads, "loadavg_before": load_before,
                           "loadavg_after": os.getloadavg(), **provenance()}
    row["peak_rss_gb"] = _peak_rss_gb(usage)
    if stopped is not None:
        row["error"] = [f"stopped by the benchmark at {stopped:.2f} GB RSS after {wall:.0f} s "
                        f"(--max-rss-gb {max_rss_gb}: the machine's memory is shared)"]
        return row
    if rc != 0:
        row["error"] = (stderr or stdout).strip().splitlines()[-1:] or ["(no output)"]
        return row
    report = json.loads((out / "glmc_report.json").read_text())
    row |= {"n_params": report.get("n_params"), "dtype": spec["dtype"],
            "phases": report.get("phases", {}), "certificate": report["certificate"],
            "matching_iterations": len((report.get("matching") or {}).get("trace", [])),
            "relative": (report.get("matching") or {}).get("relative")}
    row["check"] = check_output(out, spec["dtype"], threads)
    target = dict(spec["target"])
    if workload_s is not None:  # (a machine slower on the yardstick has more time)
        target["seconds"] = round(allowance(target["seconds"], workload_s), 1)
        row["workload_s"] = workload_s
    row["target"] = target
    row["meets"] = {"seconds": wall <= target["seconds"],
                    "peak_rss_gb": (row["peak_rss_gb"] or 0) <= spec["target"]["peak_rss_gb"]}
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return row


def guard(pid: int, max_rss_gb: float | None) -> float | None:
    """Wait for process ``pid`` to exit (without reaping it); when its RSS passes
    ``max_rss_gb``, kill it and return the RSS it had (GB), else None."""
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
        except (OSError, ValueError):
            return None
        if fields.get("State", "").strip().startswith("Z"):  # (exited, not yet reaped)
            return None
        rss = int(fields.get("VmRSS", "0 kB").split()[0]) * 1024 / 1e9
        if max_rss_gb is not None and rss > max_rss_gb:
            os.kill(pid, 9)
            return rss
        time.sleep(0.2)


def without_matching(a: str, b: str, out: str) -> None:
    """``glmc align A B -o OUT``'s own steps (load, reference logits, write, certify) with
    the identity for the transform: what the command costs beside weight matching."""
    import torch

    from glmc.api import save_certified
    from glmc.cli.align import load_pair, reference_logits, release_memory
    from glmc.io.folders import phase
    from glmc.symmetry.transform import Transform

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    t0 = time.perf_counter()
    phases: dict = {}
    la, lb = load_pair(argparse.Namespace(a=a, b=b, allow_pickle=False))
    clock = phase(phases, "load", t0)
    reference = reference_logits(lb)
    clock = phase(phases, "reference", clock)
    lb.stock_state = None
    aligned = lb.canonical.to(torch.float32)
    transform = Transform.identity(aligned.spec)
    del la, lb
    release_memory()
    phase(phases, "match", clock)  # (none: the identity)
    report = {"command": "align", "a": a, "b": b, "matching": None}
    save_certified(aligned, out, report, reference, transform=transform, release=True,
                   started=t0, phases=phases)


def write_aligned(b: str, out: str, mode: str) -> None:
    """Only the write of B aligned, as ``glmc align`` does it after a handed-over matching
    (``mode``: "parts", part by part from B's folder; "whole", B moved in memory, then
    written): B's shapes from its folder, the transform from ``out`` (an earlier run's).
    Prints the seconds it took."""
    import torch

    from glmc.io.folders import load_model, write_model
    from glmc.io.moved import Moved
    from glmc.symmetry.transform import Transform

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    like = load_model(b, only=()).canonical
    moved = Moved(Path(b), like, Transform.load(Path(out) / "transform.safetensors"))
    folder = Path(out) / f"written-{mode}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    t0 = time.perf_counter()
    if mode == "parts":
        fmt = write_model(folder, moved.skeleton(), parts=moved)
    else:
        fmt = write_model(folder, moved.whole(), release=True)
    print(json.dumps({"seconds": round(time.perf_counter() - t0, 2), "format": fmt}))
    shutil.rmtree(folder)


def write_rows(case: str, cache: Path, threads: int) -> list[dict[str, Any]]:
    """Writing B aligned, whole and part by part, each in a process of its own (its peak
    RSS: the process's imports and B's shapes beside the write), from the transform of the
    case's last run (kept in the cache by ``--keep``)."""
    _, b = cached_pair(case, cache, threads)
    out = cache / case / "aligned"
    if not (out / "transform.safetensors").is_file():
        raise SystemExit(f"{out}: no transform to write with (run the case with --keep)")
    rows = []
    for mode in ("whole", "parts"):
        argv = [sys.executable, __file__, "--write-aligned", str(b), str(out), mode]
        proc = subprocess.Popen(argv, env=_env(threads), stdout=subprocess.PIPE, text=True)
        stdout = proc.stdout.read()  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"writing {case} {mode} failed")
        rows.append({"case": case, "mode": mode, **json.loads(stdout.strip().splitlines()[-1]),
                     "peak_rss_gb": _peak_rss_gb(usage), **provenance()})
        print(f"write B aligned, {case}, {mode}: {rows[-1]['seconds']} s, "
              f"{rows[-1]['peak_rss_gb']} GB", flush=True)
    return rows


def _peak_rss_gb(usage: Any) -> float | None:
    if usage is None:
        return None
    return round(usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024) / 1e9, 3)


def check_output(out: Path, dtype: str, threads: int) -> dict[str, Any]:
    """OUT's stored dtypes, and whether transformers loads it (in a process of its own)."""
    code = ("import sys, torch; from safetensors import safe_open; from pathlib import Path; "
            "from transformers import AutoModelForCausalLM; out = Path(sys.argv[1]); "
            "files = sorted(out.glob('*.safetensors')); files = [f for f in files "
            "if f.name != 'transform.safetensors']; "
            "dtypes = sorted({safe_open(str(f), 'pt').get_slice(k).get_dtype() for f in files "
            "for k in safe_open(str(f), 'pt').keys()}); "
            "m = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True); "
            "print(dtypes, str(next(m.parameters()).dtype).removeprefix('torch.'))")
    run = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True,
                         text=True, env=_env(threads))
    if run.returncode != 0:
        return {"loads": False, "error": run.stderr.strip().splitlines()[-1:]}
    stored, loaded = run.stdout.strip().rsplit(" ", 1)
    want = {"bfloat16": "BF16", "float32": "F32", "float16": "F16"}[dtype]
    return {"loads": True, "stored": stored, "loaded_dtype": loaded,
            "dtype_ok": stored == f"['{want}']" and loaded == dtype}


# -- the table --------------------------------------------------------------------------------


def extrapolated(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each sliced pair's whole run extrapolated per layer from its 2- and 4-layer slices:
    wall and peak RSS at L layers = the 2-layer's + (L - 2) x half the 4-layer's excess, with
    the whole run's measured figures beside where there is one (its relative error)."""
    out = []
    lo, hi = SLICE_LAYERS
    for (whole, layers), mode in itertools.product((("llama7b", 32), ("tinyllama", 22)),
                                                   ("", STREAMED)):
        a, b = rows.get(f"{whole}-{lo}l{mode}"), rows.get(f"{whole}-{hi}l{mode}")
        if not a or not b or a["rc"] or b["rc"]:
            continue
        row: dict[str, Any] = {"case": whole + mode, "layers": layers,
                               "from": [a["commit"], b["commit"]]}
        for key in ("wall_s", "peak_rss_gb"):
            per_layer = (b[key] - a[key]) / (hi - lo)
            row[key] = round(a[key] + (layers - lo) * per_layer, 2)
            row[f"{key}_per_layer"] = round(per_layer, 3)
            got = rows.get(whole + mode)
            if got and got.get("rc") == 0:
                row[f"{key}_measured"] = got[key]
                row[f"{key}_error"] = round(row[key] / got[key] - 1, 3)
        out.append(row)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| case | params | dtype | wall s | peak RSS GB | " + " | ".join(PHASES)
            + " | certificate | OUT loads | target |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r["rc"] != 0:
            lines.append(f"| {r['case']} | failed (rc {r['rc']}): {' '.join(r['error'])} |")
            continue
        ph = r["phases"]
        cells = [f"{ph[p]['seconds']:.1f}" if p in ph else "-" for p in PHASES]
        cert = r["certificate"]
        t, meets = r["target"], r["meets"]
        lines.append(
            f"| {r['case']} | {r['n_params'] / 1e6:.0f}M | {r['dtype']} | {r['wall_s']:.1f} | "
            f"{r['peak_rss_gb']:.2f} | " + " | ".join(cells)
            + f" | {cert['max_abs_diff']:.2e} ({'ok' if cert['equal'] else 'MISMATCH'}) | "
            f"{'yes' if r['check'].get('dtype_ok') else 'NO'} | "
            f"≤ {t['seconds']} s {'✓' if meets['seconds'] else '✗'}, ≤ {t['peak_rss_gb']} GB "
            f"{'✓' if meets['peak_rss_gb'] else '✗'} |")
    peaks = [f"{r['case']}: " + ", ".join(f"{p} {r['phases'][p]['peak_rss_gb']:.2f}"
                                          for p in PHASES if p in r["phases"])
             for r in rows if r["rc"] == 0]
    return "\n".join(lines + ["", "peak RSS (GB) at the end of each phase: " + "; ".join(peaks)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="gpt2-small,tinyllama",
                    help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--cache", type=Path, default=HERE.parent / "glmc-cache" / "align-e2e",
                    help="where the generated models (and OUT, while checked) live")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep OUT under the cache")
    ap.add_argument("--out", type=Path, default=RESULTS / "align_end_to_end.json")
    ap.add_argument("--glmc-args", default="", help="more options for glmc align, e.g. "
                    "'--iters 3' (recorded in the row; the targets are for the defaults)")
    ap.add_argument("--max-rss-gb", type=float, default=None,
                    help="stop a run whose RSS passes this (default: the memory available "
                    "when it starts, less 1 GB, so that a shared machine is not run out of "
                    "memory)")
    ap.add_argument("--without-matching", action="store_true",
                    help="also time the command's steps other than weight matching (the "
                    "identity for the transform), as a row of its own")
    ap.add_argument("--write", action="store_true",
                    help="also time writing B aligned alone, whole and part by part, from "
                    "the transform of each case's run (implies --keep)")
    ap.add_argument("--generate", nargs=3, metavar=("CASE", "SEED", "FOLDER"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--write-aligned", nargs=3, metavar=("B", "OUT", "MODE"),
                    help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.generate:
        case, seed, folder = args.generate
        generate(case, int(seed), Path(folder))
        return
    if args.write_aligned:
        write_aligned(*args.write_aligned)
        return
    if args.without_matching and len(rest) == 3:  # (the child process of that row)
        without_matching(*rest)
        return
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]} (one of {', '.join(CASES)})")
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    rows = {r["case"]: r for r in previous.get("rows", [])}
    writes = {(r["case"], r["mode"]): r for r in previous.get("writes", [])}
    runs = [(case, True) for case in cases]
    if args.without_matching:
        runs = [(case, m) for case in cases for m in (False, True)]
    workload = matrix_workload(args.threads)
    print(f"yardstick: {workload:.2f} s here against {WORKLOAD_REFERENCE_S} s on the targets' "
          f"machine: time targets x {max(1.0, workload / WORKLOAD_REFERENCE_S):.2f}",
          flush=True)
    for case, matching in runs:
        limit = args.max_rss_gb
        if limit is None:
            available = _available_gb()
            limit = None if available is None else round(available - 1.0, 1)
        row = run_case(case, args.cache, args.threads, args.keep or args.write,
                       args.glmc_args.split(), max_rss_gb=limit, matching=matching,
                       workload_s=workload)
        rows[row["case"]] = row
        print(table([row]), flush=True)
        if args.write and matching and row["rc"] == 0:
            writes |= {(r["case"], r["mode"]): r
                       for r in write_rows(case, args.cache, args.threads)}
        write_json(args.out, {"benchmark": "align_end_to_end", "machine": machine(),
                              "rows": _ordered(rows), "writes": list(writes.values()),
                              "extrapolated": extrapolated(rows)})
    print()
    print(table(_ordered(rows)))
    for x in extrapolated(rows):
        print(f"{x['case']} at {x['layers']} layers, from its slices: {x['wall_s']:.0f} s, "
              f"{x['peak_rss_gb']:.2f} GB" + (f" (measured whole: {x['wall_s_measured']} s, "
                                              f"{x['peak_rss_gb_measured']} GB)"
                                              if "wall_s_measured" in x else ""))
    print(f"\nwrote {args.out}")


def _ordered(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    names = [n for c in CASES for n in (f"{c} (no matching)", c, c + STREAMED)]
    return [rows[n] for n in names if n in rows]


def _available_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e9
    except (OSError, ValueError):
        return None
    return None


if __name__ == "__main__":
    main()
