"""Weight matching spread across ranks (torchrun, gloo): bit for bit the single-process run.

One ``torchrun --standalone`` with 2 ranks of one thread each (it finds a free port itself)
runs, in order: weight matching on tiny independently initialised GPT-2 and Llama (grouped
query heads) pairs; ``glmc align --align weight`` on the GPT-2 pair; and the same command with
rank 1's units failing, which ends the run. The tests compare every element of the
transforms and every distance of the traces with the single-process run (``torch.equal``,
``==``), and read what the failing command said and left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glmc.matching.weight import WeightMatchingOptions, weight_matching

TESTS = Path(__file__).resolve().parent

#: The pairs: GPT-2 (MLP units, heads with inner maps, LayerNorm's fixed all-ones direction)
#: and Llama with grouped query heads (2 key/value groups of 2 query heads, gated MLP).
PAIRS = {"gpt2": dict(n_layer=3, d=48, n_head=4),
         "llama": dict(n_layer=3, d=48, n_head=4, n_kv_head=2, d_mlp=64)}
ITERS = 5

WORKER = r"""
import os, sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_distributed_wm import refused, run_pair
from glmc.cli.main import main
from glmc.distributed import process_group, rank
import glmc.matching.weight as weight
from glmc.errors import GlmcError
with process_group():  # (glmc align's own is then a no-op)
    out = {{arch: run_pair(arch) for arch in ("gpt2", "llama")}}
    out["handed over"] = run_pair("gpt2", hand_over=True)
    out["refused"] = refused()
    torch.save(out, {out!r}.format(rank()))
    assert main({align!r} + ["-o", {two!r}]) == 0
    from glmc.io.folders import StoredState
    read, stored_read = [], StoredState.read
    def recorded(self, key, dtype=None):  # (what this rank reads of the folders)
        read.append((str(self.where), key))
        return stored_read(self, key, dtype)
    StoredState.read = recorded
    assert main({align_hf!r} + ["-o", {two_hf!r}]) == 0
    StoredState.read = stored_read
    torch.save(read, {reads!r}.format(rank()))
    if rank() == 1:  # (its units fail)
        def fail(*args, **kwargs):
            raise GlmcError("planted failure in a unit")
        weight.solve_unit = fail
    code = main({align!r} + ["-o", {failed!r}])
sys.exit(code)
"""


def pair(arch: str, dtype: torch.dtype = torch.float64):
    from conftest import make_tiny

    return tuple(make_tiny(arch, seed=s, dtype=dtype, **PAIRS[arch]).canonical()
                 for s in (1, 2))


def run_pair(arch: str, hand_over: bool = False) -> dict:
    """Weight matching on the ``arch`` pair: every element's tensors and the trace. In
    float64: the residual map then keeps the last bits of its sums (in float32 its rounding
    hides a sum in another order, an all-reduce's: tried, it passes there, fails here)."""
    a, b = pair(arch)
    # (tol 0: every iteration runs, partial and full sweeps alike, unless D stops falling)
    r = weight_matching(a, b, WeightMatchingOptions(max_iter=ITERS, tol=0.0,
                                                    hand_over=hand_over))
    return {"elements": {s: e.tensors() for s, e in r.transform.elements.items()},
            "distances": [row["distance"] for row in r.trace], "init": r.init_distance,
            "scale": r.scale, "converged": r.converged,
            "counts": [(row["units_solved"], row["units_changed"], row["units_rejected"],
                        row["residual_rejected"]) for row in r.trace]}


def refused() -> tuple[str, bool]:
    """A pair every rank refuses (a NaN in B): the error and whether it is left to rank 0."""
    from glmc.errors import GlmcError

    a, b = pair("gpt2")
    b.state["blocks.0.mlp.fc.weight"][0, 0] = float("nan")
    try:
        weight_matching(a, b, WeightMatchingOptions(max_iter=1))
    except GlmcError as e:
        return str(e), getattr(e, "reported_elsewhere", False)
    return "", False


def alone(fn, *args):
    """``fn(*args)`` on one thread (as each rank runs: the same products, the same bits)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    """The torchrun run (see the module's docstring): its folder, exit status and output."""
    from conftest import make_tiny

    from glmc.io.folders import write_model

    tmp = tmp_path_factory.mktemp("ranks")
    for name, model in zip("ab", pair("gpt2", torch.float32), strict=True):
        (tmp / name).mkdir()
        write_model(tmp / name, model)
    align = ["align", str(tmp / "a"), str(tmp / "b"), "--align", "weight", "--iters", "3",
             "--json"]
    for name, seed in (("hf-a", 1), ("hf-b", 2)):  # (stock Llama folders, GQA, bfloat16)
        stock = make_tiny("llama", seed=seed, dtype=torch.float32, **PAIRS["llama"]).stock
        stock.to(torch.bfloat16).save_pretrained(str(tmp / name))
    align_hf = ["align", str(tmp / "hf-a"), str(tmp / "hf-b"), "--align", "weight",
                "--iters", "3", "--json"]
    script = tmp / "worker.py"
    script.write_text(WORKER.format(tests=str(TESTS), out=str(tmp / "rank{}.pt"),
                                    align=align, two=str(tmp / "two"),
                                    failed=str(tmp / "failed"), align_hf=align_hf,
                                    two_hf=str(tmp / "two-hf"),
                                    reads=str(tmp / "reads{}.pt")))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(script)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)
    return {"tmp": tmp, "align": align, "proc": proc}


def assert_identical(x: dict, y: dict) -> None:
    assert x["distances"] == y["distances"]
    assert (x["init"], x["scale"], x["converged"], x["counts"]) == (
        y["init"], y["scale"], y["converged"], y["counts"])
    assert x["elements"].keys() == y["elements"].keys()
    for space, tensors in x["elements"].items():
        other = y["elements"][space]
        assert tensors.keys() == other.keys(), space
        for k, t in tensors.items():
            assert torch.equal(t, other[k]), (space, k)


def test_two_ranks_give_the_single_process_transform_and_trace(ranks):
    """GPT-2 and Llama (GQA) pairs: each rank ends with the single-process result, every
    element and every distance equal (the units split across the ranks, the residual sums
    added in the single process's order, rank 0's Procrustes handed on); the GPT-2 pair
    handed over too (each rank drops the tensors it does not work on)."""
    for r in (0, 1):
        assert (ranks["tmp"] / f"rank{r}.pt").is_file(), ranks["proc"].stderr[-3000:]
    spread = [torch.load(ranks["tmp"] / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for arch in PAIRS:
        single = alone(run_pair, arch)
        assert len(single["distances"]) == ITERS and single["counts"][0][1] > 0
        for r in (0, 1):
            assert_identical(single, spread[r][arch])
            if arch == "gpt2":
                assert_identical(single, spread[r]["handed over"])


def test_a_pair_every_rank_refuses_is_one_error_said_by_rank_0(ranks):
    """``check_pair`` runs in the first exchange: every rank stops with the same error, and
    only rank 0's is printed by the command line (the others' are ``reported_elsewhere``)."""
    results = [torch.load(ranks["tmp"] / f"rank{r}.pt", weights_only=True)["refused"]
               for r in (0, 1)]
    message, _ = alone(refused)
    assert "NaN" in message or "finite" in message, message
    assert results == [(message, False), (message, True)]


def test_cli_align_under_torchrun_writes_the_single_process_result(ranks):
    """``torchrun ... glmc align --align weight``: rank 0 writes OUT, whose transform and
    trace are those of ``glmc align`` in one process."""
    from glmc.cli.main import main
    from glmc.symmetry.transform import Transform

    tmp = ranks["tmp"]
    assert (tmp / "two").is_dir(), ranks["proc"].stderr[-3000:]
    assert alone(main, [*ranks["align"], "-o", str(tmp / "one")]) == 0
    reports = [json.loads((tmp / d / "glmc_report.json").read_text())["matching"]
               for d in ("one", "two")]
    assert [r["distance"] for r in reports[0]["trace"]] == [
        r["distance"] for r in reports[1]["trace"]]
    x, y = (Transform.load(tmp / d / "transform.safetensors") for d in ("one", "two"))
    for space, e in x.elements.items():
        tx, ty = e.tensors(), y.elements[space].tensors()
        assert all(torch.equal(tx[k], ty[k]) for k in tx), space


def llama_stock_name(canonical: str) -> str:
    """The stock Llama matrix a canonical one is made from (its norm's gains aside)."""
    if canonical in ("embed.tok", "head.weight"):
        return {"embed.tok": "model.embed_tokens.weight", "head.weight": "lm_head.weight"}[
            canonical]
    _, i, block, name, _ = canonical.split(".")
    stock = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj",
             "fc": "up_proj", "proj": "down_proj"}[name]
    return f"model.layers.{i}.{'self_attn' if block == 'attn' else 'mlp'}.{stock}.weight"


def test_each_rank_reads_only_its_share_of_a_stock_pair(ranks):
    """``torchrun ... glmc align`` of two stock Llama folders (bfloat16, grouped-query
    heads): each rank reads, of A's weight matrices, exactly those of its share of the plan
    (its units' tensors; rank 0 also the embedding and the head, which only the stream
    touches), each once; rank 1 reads the same of B (rank 0 reads B whole as well, for the
    reference logits and to write B aligned). OUT is the single-process result, written
    back as the stock class in bfloat16."""
    from glmc.cli.main import main
    from glmc.io.folders import load_model
    from glmc.matching.spread import plan
    from glmc.matching.weight import Problem
    from glmc.symmetry.transform import Transform

    tmp = ranks["tmp"]
    assert (tmp / "two-hf").is_dir(), ranks["proc"].stderr[-3000:]
    one = [*ranks["align"][:1], str(tmp / "hf-a"), str(tmp / "hf-b"), *ranks["align"][3:]]
    assert alone(main, [*one, "-o", str(tmp / "one-hf")]) == 0
    x, y = (Transform.load(tmp / d / "transform.safetensors") for d in ("one-hf", "two-hf"))
    for space, e in x.elements.items():
        tx, ty = e.tensors(), y.elements[space].tensors()
        assert all(torch.equal(tx[k], ty[k]) for k in tx), space
    config = json.loads((tmp / "two-hf" / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"

    a, b = (load_model(tmp / n).canonical for n in ("hf-a", "hf-b"))
    split = plan(Problem(a, b, WeightMatchingOptions(), only=set()),
                 {n: tuple(t.shape) for n, t in a.state.items()}, 2)
    matrices = {n for n, t in a.state.items() if t.dim() == 2}
    shares = [{llama_stock_name(n) for n in split.local(r) & matrices} for r in (0, 1)]
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= shares[0]
    for r in (0, 1):
        reads = torch.load(tmp / f"reads{r}.pt", weights_only=True)
        for folder in ("hf-a", "hf-b") if r == 1 else ("hf-a",):
            read = [k for where, k in reads if Path(where).name == folder
                    and k.endswith("weight") and "norm" not in k]
            assert sorted(read) == sorted(shares[r]), (r, folder)


def test_one_rank_failing_stops_every_rank_with_one_line_and_no_output(ranks):
    """Rank 1's units fail: rank 0 says so in one line (naming the rank), rank 1 says
    nothing more, both stop (no rank waits at an exchange for one that left: the run ends
    well within its time limit) with a non-zero status, and no OUT is left behind."""
    proc = ranks["proc"]
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines()
              if "glmc align: error:" in line]
    assert errors == ["glmc align: error: rank 1: planted failure in a unit"], proc.stderr
    frames = [line for line in proc.stderr.splitlines() if line.strip().startswith("File ")]
    assert not [f for f in frames if "glmc/" in f], proc.stderr  # (torchrun's own only)
    names = {p.name for p in ranks["tmp"].iterdir()}
    assert "failed" not in names and not [n for n in names if n.startswith(".failed")]


def test_units_are_split_into_contiguous_runs_of_about_equal_cost():
    from glmc.matching.spread import split

    assert split([5, 1, 5, 1, 5, 1], 2) == [0, 0, 0, 1, 1, 1]  # (11 and 7: no split is better)
    assert split([3, 3, 3, 3], 4) == [0, 1, 2, 3]
    assert split([3, 3], 5) == [0, 1]  # (ranks left without units)
    assert split([9, 1, 1, 1], 2) == [0, 1, 1, 1]
    assert split([], 3) == []

