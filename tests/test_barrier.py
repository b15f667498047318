"""Barriers: the arithmetic, evaluation along the line, alignment methods, plots and the CLI."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import glmc
from glmc.barrier import (
    AlignOptions,
    barrier,
    barrier_curve,
    batch_barriers,
    get_method,
    lambda_grid,
    run_barrier,
    standard_error,
)
from glmc.cli.main import main
from glmc.data import CharTokenizer, ImageDataset, save_tokenizer
from glmc.errors import GlmcError
from glmc.evaluate import (
    EvalResult,
    check_data_fits,
    default_batch_size,
    evaluate,
    fixed_batches,
    load_eval_data,
)
from glmc.families.transformer import model as canonical_module
from glmc.io.folders import load_model, write_glmc, write_model
from glmc.matching.options import LearnedMatchingOptions
from glmc.plots import plot_barriers
from glmc.symmetry.transform import Transform

CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"  # 30 characters: the tiny GPT-2's 30 ids

# -- the arithmetic -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_batch_barriers_add_up_to_the_barrier(points, batches, seed):
    """Each batch's barrier at the peak, weighted by its share of the targets, adds up to the
    barrier of the mean losses (random grids, per-batch losses and counts; float64, 1e-12);
    a standard error of one batch is NaN, and batches that agree have none."""
    rng = np.random.default_rng(seed)
    lam = lambda_grid(points)
    counts = tuple(int(c) for c in rng.integers(1, 50, batches))
    results = []
    for _ in lam:
        sums = tuple(float(x) for x in rng.uniform(0, 5, batches) * np.array(counts))
        results.append(EvalResult(sum(sums) / sum(counts), None, sum(counts), sums, counts))
    values, weights = batch_barriers(lam, results)
    assert values.shape == weights.shape == (batches,)
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(np.dot(weights, values)) == pytest.approx(
        barrier(lam, [r.loss for r in results]), abs=1e-12)
    se = standard_error(values, weights)
    assert math.isnan(se) if batches == 1 else se >= 0
    assert standard_error(np.full(batches, 0.3), weights) == pytest.approx(
        math.nan if batches == 1 else 0.0, nan_ok=True, abs=1e-12)


def test_standard_error_hand_computed():
    """Equal shares: the sample standard deviation over √k; unequal shares weigh the spread
    by the squared share (the batches' own sizes)."""
    v = np.array([1.0, 2.0, 4.0, 5.0])
    assert standard_error(v, np.full(4, 0.25)) == pytest.approx(np.std(v, ddof=1) / 2)
    w = np.array([0.1, 0.2, 0.3, 0.4])  # mean 3.7; Σ w²(v − m)² = .0729+.1156+.0081+.2704
    assert standard_error(v, w) == pytest.approx(math.sqrt(4 / 3 * 0.467))


def test_barrier_hand_computed():
    lam = [0.0, 0.25, 0.5, 0.75, 1.0]
    # Loss: the endpoints' line is 1 + λ = [1, 1.25, 1.5, 1.75, 2]; excess [0, .75, 2, .75, 0].
    loss = [1.0, 2.0, 3.5, 2.5, 2.0]
    np.testing.assert_allclose(barrier_curve(lam, loss), [0, 0.75, 2.0, 0.75, 0])
    assert barrier(lam, loss) == pytest.approx(2.0)
    # Accuracy: line 0.9 − 0.1λ = [.9, .875, .85, .825, .8]; drops [0, .275, .35, .125, 0].
    acc = [0.9, 0.6, 0.5, 0.7, 0.8]
    np.testing.assert_allclose(barrier_curve(lam, acc, higher_is_better=True),
                               [0, 0.275, 0.35, 0.125, 0], atol=1e-12)
    assert barrier(lam, acc, higher_is_better=True) == pytest.approx(0.35)
    # Grid order does not matter; a path below the line has barrier 0 (the endpoints).
    order = [4, 2, 0, 3, 1]
    assert barrier([lam[i] for i in order], [loss[i] for i in order]) == pytest.approx(2.0)
    assert barrier(lam, [1.0, 0.5, 0.2, 0.9, 2.0]) == 0.0
    with pytest.raises(ValueError, match="endpoints"):
        barrier([0.0, 0.5], [1.0, 2.0])
    assert lambda_grid(5) == lam
    with pytest.raises(GlmcError):
        lambda_grid(1)


def test_unknown_method_lists_the_available_ones():
    with pytest.raises(GlmcError, match=r"available: none, canonical, weight, weight-perm"):
        get_method("activations")


# -- tiny models on disk ------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_pair(tmp_path_factory, h) -> tuple[Path, Path, Path]:
    """Two random tiny GPT-2 folders (char tokenizer saved beside them) and a text file."""
    root = tmp_path_factory.mktemp("lm")
    tok = CharTokenizer("".join(sorted(CHARS)))
    for seed, name in ((0, "a"), (1, "b")):
        h.make_tiny("gpt2", seed=seed, dtype=torch.float32,
                    vocab=len(CHARS)).stock.save_pretrained(root / name)
        save_tokenizer(root / name, tok)
    rng = random.Random(0)
    text = root / "corpus.txt"
    text.write_text("".join(rng.choice(CHARS) for _ in range(2000)))
    return root / "a", root / "b", text


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory, h) -> Path:
    """A random tiny ViT folder (3x8x8 images, 5 classes)."""
    folder = tmp_path_factory.mktemp("vit") / "vit"
    folder.mkdir()
    write_model(folder, h.make_tiny("vit", dtype=torch.float32).canonical())
    return folder


def endpoint_warnings(report) -> list[str]:
    """The warnings that an aligned B computes another function than B (the others say how
    reliable the data make the barrier: few targets, models without a training record)."""
    return [w for w in report.warnings if "changed B's function" in w]


def test_endpoints_are_the_models_evaluated_separately(lm_pair, monkeypatch):
    a, b, text = lm_pair
    built = []
    init = canonical_module.CanonicalTransformer.__init__

    def counting_init(self, cfg):
        built.append(cfg)
        init(self, cfg)

    monkeypatch.setattr(canonical_module.CanonicalTransformer, "__init__", counting_init)
    # (data-free weight matching: given data, its start runs both models for activation
    # matching and its iterates are validated, which build modules of their own)
    report = run_barrier(a, b, text, methods=("none", "weight"), points=4,
                         options=AlignOptions(init="embeddings", select="last"))
    assert len(built) == 1  # one module for every method and every λ: weights are swapped
    monkeypatch.undo()
    loss_a, loss_b = evaluate(a, text).loss, evaluate(b, text).loss
    none, weight = report.methods["none"], report.methods["weight"]
    assert none.lambdas == [0.0, 1 / 3, 2 / 3, 1.0]
    assert none.loss_a == pytest.approx(loss_a, rel=1e-6)
    assert none.loss_b == pytest.approx(loss_b, rel=1e-6)
    assert weight.loss_a == pytest.approx(loss_a, rel=1e-6)
    assert weight.loss_b == pytest.approx(loss_b, rel=1e-4)  # B aligned: B's function
    assert none.accuracies is None and none.acc_barrier is None
    assert report.count == evaluate(a, text).count == 96  # test split 100 chars: 6 x 16
    assert not endpoint_warnings(report)


def test_an_evaluation_keeps_each_batchs_loss(lm_pair):
    """The mean loss is the batches' summed losses over the targets, in order, to the bit."""
    a, b, text = lm_pair
    r = evaluate(a, text, batch_size=2)
    assert len(r.batch_losses) == len(r.batch_counts) > 1 and sum(r.batch_counts) == r.count
    assert sum(r.batch_losses) / r.count == r.loss
    # ... which gives the barrier a standard error (none from one batch)
    several = run_barrier(a, b, text, methods=("none",), points=3, batch_size=2)
    m = several.methods["none"]
    assert m.loss_barrier_se is not None and m.loss_barrier_se >= 0
    assert run_barrier(a, b, text, methods=("none",), points=3).methods[
        "none"].loss_barrier_se is None


def test_a_model_and_itself_have_no_barrier(lm_pair):
    a, _, text = lm_pair
    report = run_barrier(a, a, text, methods=("none",), points=3)
    assert report.methods["none"].loss_barrier == pytest.approx(0.0, abs=1e-5)
    assert max(report.methods["none"].losses) - min(report.methods["none"].losses) < 1e-5


def test_weight_matching_removes_a_planted_symmetry(h, tmp_path):
    """B = A under a random symmetry; labels = A's predictions, so A is good at the task."""
    a = h.make_tiny("vit", dtype=torch.float32).canonical()
    a.state["head.weight"] *= 3.0  # confident predictions
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, 3, 8, 8, generator=g)
    with torch.no_grad():
        module = a.module()
        y = [module(xi).argmax(-1) for xi in x]
    ds = ImageDataset("planted", x[0], y[0], x[1], y[1], x[2], y[2], 5, torch.zeros(3),
                      torch.ones(3))
    b = a.transformed(Transform.random(a.spec, g, torch.float32,
                                       subgroups={"residual": "fix_ones"}))
    report = run_barrier(a, b, ds, methods=("canonical", "weight"), points=5)
    none, weight = report.methods["canonical"], report.methods["weight"]
    assert none.acc_a == 1.0 and none.acc_b == 1.0
    assert none.loss_barrier > 0.1 and none.acc_barrier > 0
    assert weight.loss_barrier < 1e-4 and weight.acc_barrier == 0.0
    assert max(weight.losses) - min(weight.losses) < 1e-4
    path = plot_barriers(report, tmp_path / "planted.png", title="planted pair")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the command line ---------------------------------------------------------------------


def test_plain_hugging_face_folders_are_a_note_before_the_table_not_a_warning(lm_pair,
                                                                           tmp_path):
    """The user's report: every barrier of Hugging Face folders (no glmc training record)
    ended with a "no training record" warning, read as a failure though the barrier is
    fine: it is one ``note:`` line, on stderr before the table (on stdout)."""
    import subprocess
    import sys

    a, b, _ = lm_pair
    text = tmp_path / "longer.txt"  # (a test split of more than 100 targets: no warning)
    rng = random.Random(1)
    text.write_text("".join(rng.choice(CHARS) for _ in range(6000)))
    run = subprocess.run([sys.executable, "-c", "import sys; from glmc.cli.main import main; "
                          "sys.exit(main(sys.argv[1:]))", "barrier", str(a), str(b), "--data",
                          str(text), "--points", "3"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, check=False,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()  # (stderr and stdout in the order written)
    assert lines[0].startswith(f"note: {a} and {b} hold no training record"), run.stdout
    assert "barriers" in lines[1] and "warning" not in run.stdout
    assert sum("training record" in line for line in lines) == 1


def test_the_table_shows_a_standard_error_where_it_promises_one(lm_pair, capsys):
    """The user's report: the table's "loss barrier (± s.e.)" never showed one. Evaluated on
    several batches every barrier has its "±"; on one batch (this split at the default batch
    size) there is none to give, and the table says why instead of promising one."""
    a, b, text = lm_pair
    argv = ["barrier", str(a), str(b), "--data", str(text), "--points", "3"]
    assert main([*argv, "--batch-size", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.strip("│ ").startswith(("none", "weight"))]
    assert len(rows) == 2 and all("±" in row for row in rows)
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "±" not in table and "one evaluation batch: no standard error" in table


def test_cli_json_and_plot(lm_pair, tmp_path, capsys):
    a, b, text = lm_pair
    png = tmp_path / "curves.png"
    rc = main(["barrier", str(a), str(b), "--data", str(text), "--align", "none",
               "--align", "weight", "--points", "3", "--json", "--plot", str(png)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert list(out["methods"]) == ["none", "weight"]
    for m in out["methods"].values():
        assert m["lambdas"] == [0.0, 0.5, 1.0]
        assert len(m["losses"]) == 3 and all(math.isfinite(v) for v in m["losses"])
        assert m["loss_barrier"] >= 0 and m["acc_barrier"] is None and m["accuracies"] is None
        assert m["loss_barrier_se"] is None  # (the test split is one batch)
        assert m["loss_a"] == m["losses"][-1] and m["loss_b"] == m["losses"][0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["plot"] == str(png)


def _bad_inputs(lm_pair, vit_folder, root: Path) -> dict[str, tuple[list[str], str]]:
    a, b, text = lm_pair
    unknown = root / "accents.txt"
    unknown.write_text("abc " * 100 + "café " * 10)
    empty = root / "empty.txt"
    empty.write_text("")
    big = root / "big.npz"
    np.savez(big, x=np.zeros((20, 16, 16, 3), np.uint8), y=np.arange(20) % 5)
    gray = root / "gray.npz"
    np.savez(gray, x=np.zeros((20, 8, 8), np.uint8), y=np.arange(20) % 5)
    v = str(vit_folder)
    return {
        "unknown characters": ([str(a), str(b), "--data", str(unknown)],
                               "the model's vocabulary"),
        "empty file": ([str(a), str(b), "--data", str(empty)], "empty"),
        "vit with text": ([v, v, "--data", str(text)], "holds text"),
        "gpt2 with images": ([str(a), str(b), "--data", str(big)], "holds images"),
        "wrong image size": ([v, v, "--data", str(big)], "3x16x16"),
        "wrong channels": ([v, v, "--data", str(gray)], "1x8x8"),
        "different architectures": ([str(a), v, "--data", str(text)], "differ in task"),
        "unknown method": ([str(a), str(b), "--data", str(text), "--align", "magic"],
                           "available:"),
        "plot suffix": ([str(a), str(b), "--data", str(text), "--plot", "x.jpg"], ".png"),
    }


def test_bad_input_is_one_line_and_exit_2_before_any_work(lm_pair, vit_folder, tmp_path,
                                                           capsys, monkeypatch):
    import glmc.api
    import glmc.evaluate

    def fail(*args, **kwargs):
        raise AssertionError("long work started before the input was checked")

    monkeypatch.setattr(glmc.api, "align", fail)
    monkeypatch.setattr(glmc.evaluate.Evaluator, "run", fail)
    for case, (argv, fragment) in _bad_inputs(lm_pair, vit_folder, tmp_path).items():
        rc = main(["barrier", *argv])
        err = capsys.readouterr().err.strip()
        assert rc == 2, case
        assert len(err.splitlines()) == 1, (case, err)
        assert fragment in err, (case, err)


# -- none: the stock weights averaged as loaded ---------------------------------------------


def _stock_loss(folder_a: Path, folder_b: Path, lam: float, batches) -> float:
    """Mean cross-entropy per target of the transformers class (float32) with the stock state
    dict λ·A + (1 − λ)·B, the folders' weights averaged as they are."""
    la, lb = load_model(folder_a), load_model(folder_b)
    state = {k: torch.lerp(lb.stock_state[k], v, lam) for k, v in la.stock_state.items()}
    module = la.importer.stock_model(la.hf_config).to(torch.float32)
    module.load_state_dict(state, strict=False)  # (a tied head is wte)
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in batches:
            logits = la.importer.stock_logits(module, x).double()
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                           reduction="sum"))
            count += y.numel()
    return total / count


@pytest.mark.parametrize("arch", ["gpt2", "vit"])
def test_none_averages_the_stock_weights_as_loaded(h, tmp_path, arch):
    """``none`` is the paper's vanilla baseline: its loss at every λ is the stock model's on
    the averaged stock state dict, which is not the average in canonical coordinates."""
    if arch == "gpt2":
        tiny = [h.make_tiny("gpt2", seed=s, dtype=torch.float32, vocab=len(CHARS))
                for s in (0, 1)]
        with torch.no_grad():  # ln_f's γ_3 is 0 at λ = 1/2: there θ(λ) has a head bias
            ln_f = [t.stock.transformer.ln_f.weight for t in tiny]
            ln_f[1][3] = -ln_f[0][3]
        data: Path | ImageDataset = tmp_path / "corpus.txt"
        rng = random.Random(0)
        data.write_text("".join(rng.choice(CHARS) for _ in range(2000)))
    else:
        tiny = [h.make_tiny("vit", seed=s, dtype=torch.float32) for s in (0, 1)]
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(3, 40, 3, 8, 8, generator=g), torch.randint(0, 5, (3, 40), generator=g)
        data = ImageDataset("random", x[0], y[0], x[1], y[1], x[2], y[2], 5, torch.zeros(3),
                            torch.ones(3))
    folders = [tmp_path / "a", tmp_path / "b"]
    for t, folder in zip(tiny, folders, strict=True):
        t.stock.save_pretrained(folder)
        if arch == "gpt2":
            save_tokenizer(folder, CharTokenizer("".join(sorted(CHARS))))
    report = run_barrier(*folders, data, methods=("none", "canonical"), points=5)
    none, canon = report.methods["none"], report.methods["canonical"]
    config = load_model(folders[0]).canonical.config
    ds = load_eval_data(data, config, folders=folders)
    context = check_data_fits(config, ds)
    batches = fixed_batches(ds, "test", batch_size=default_batch_size(config, context),
                            context=context)
    for lam, loss in zip(none.lambdas, none.losses, strict=True):
        assert loss == pytest.approx(_stock_loss(*folders, lam, batches), abs=1e-5), lam
    assert none.losses[0] == canon.losses[0] and none.losses[-1] == canon.losses[-1]
    assert abs(none.losses[2] - canon.losses[2]) > 1e-3  # λ = 1/2
    assert not endpoint_warnings(report)


def test_none_needs_stock_weights(h, lm_pair, tmp_path, capsys):
    """A glmc folder or a model in memory holds canonical weights only: ``none`` is refused
    (before any work), pointing to ``canonical``, which takes them."""
    a, b, text = lm_pair
    canonical_b = load_model(b).canonical
    glmc_b = tmp_path / "glmc-b"
    glmc_b.mkdir()
    write_glmc(glmc_b, canonical_b)
    save_tokenizer(glmc_b, CharTokenizer("".join(sorted(CHARS))))
    with pytest.raises(GlmcError, match=r"model B is a model in memory.*use canonical"):
        run_barrier(a, canonical_b, text, methods=("weight", "none"))
    with pytest.raises(GlmcError, match=r"model B is a model in memory.*use canonical"):
        glmc.merge(a, canonical_b, method="none")
    with pytest.raises(GlmcError, match=r"heads='circuit' does not apply"):
        glmc.merge(a, b, method="none", heads="circuit")
    for argv in (["barrier", a, glmc_b, "--data", text, "--align", "none"],
                 ["merge", a, glmc_b, "-o", tmp_path / "m", "--align", "none"]):
        assert main([str(x) for x in argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"{glmc_b} is a glmc folder" in err and "use canonical" in err
    assert not (tmp_path / "m").exists()
    report = run_barrier(a, glmc_b, text, methods=("canonical",), points=3)
    assert report.methods["canonical"].loss_b == pytest.approx(evaluate(b, text).loss, rel=1e-6)
    merged, _ = glmc.merge(a, canonical_b, method="canonical")
    torch.testing.assert_close(merged.state["embed.tok"], 0.5 * (
        load_model(a).canonical.state["embed.tok"] + canonical_b.state["embed.tok"]))


# -- the split the models were not trained on ----------------------------------------------

TINY_VIT = ["--arch", "vit", "--data", "digits", "--n-layer", "1", "--n-embd", "16", "--n-head",
            "2", "--n-inner", "16", "--patch-size", "4", "--steps", "2", "--batch-size", "16",
            "--eval-every", "0", "--eval-batches", "1", "--threads", "1", "--json"]


@pytest.fixture(scope="module")
def digits_runs(tmp_path_factory, h) -> dict[str, Path]:
    """ViTs trained 2 steps on digits by ``glmc train``: a and b on split seed 3, c on 5, and
    a copy of a and of b without their training record."""
    h.require_packages("sklearn")
    root = tmp_path_factory.mktemp("digits")
    runs = {}
    for name, seed, data_seed in (("a", 0, 3), ("b", 1, 3), ("c", 2, 5)):
        runs[name] = root / name
        assert main(["train", *TINY_VIT, "--seed", str(seed), "--data-seed", str(data_seed),
                     "-o", str(runs[name])]) == 0
    for name in ("a", "b"):
        runs[f"bare-{name}"] = root / f"bare-{name}"
        shutil.copytree(runs[name], runs[f"bare-{name}"], ignore=shutil.ignore_patterns(
            "glmc_train.json"))
    return runs


def _barrier_json(capsys, *argv: object) -> tuple[int, dict | str]:
    capsys.readouterr()
    rc = main(["barrier", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if rc == 0 else err.strip()


def test_an_image_pair_is_evaluated_on_its_own_test_split(digits_runs, capsys):
    a, b = digits_runs["a"], digits_runs["b"]
    report = run_barrier(a, b, "digits", methods=("canonical",), points=2)
    assert report.data_seed == 3  # from glmc_train.json, not the default 0
    assert report.methods["canonical"].loss_a == pytest.approx(
        evaluate(a, "digits", seed=3).loss, rel=1e-6)
    assert evaluate(a, "digits", seed=3).loss != evaluate(a, "digits", seed=0).loss
    for extra in ([], ["--data-seed", "3"]):  # (the record's seed may be repeated)
        rc, out = _barrier_json(capsys, a, b, "--data", "digits", "--align", "canonical",
                                "--points", "2", "--json", *extra)
        assert rc == 0 and out["data_seed"] == 3
        assert out["methods"]["canonical"]["losses"] == report.methods["canonical"].losses
    rc, err = _barrier_json(capsys, a, b, "--data", "digits", "--data-seed", "4")
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"--data-seed 4 contradicts {a}, trained on split seed 3" in err


def test_a_pair_trained_on_different_splits_is_refused(digits_runs, capsys, tmp_path):
    a, c = digits_runs["a"], digits_runs["c"]
    message = f"{a} was trained on split seed 3, {c} on 5; they do not share a test split"
    rc, err = _barrier_json(capsys, a, c, "--data", "digits")
    assert rc == 2 and err.endswith(message)
    with pytest.raises(GlmcError, match="they do not share a test split"):
        glmc.align(a, c, method="learned", data="digits")
    assert main(["merge", str(a), str(c), "-o", str(tmp_path / "m"), "--align", "learned",
                 "--data", "digits"]) == 2
    assert capsys.readouterr().err.strip().endswith(message)
    assert not (tmp_path / "m").exists()


def test_text_ignores_data_seeds(lm_pair, tmp_path):
    """Text splits are contiguous: records that differ, or --data-seed, change nothing."""
    a, b, text = lm_pair
    copies = []
    for folder, seed in ((a, 1), (b, 2)):
        copies.append(tmp_path / folder.name)
        shutil.copytree(folder, copies[-1])
        (copies[-1] / "glmc_train.json").write_text(json.dumps({"data_seed": seed}))
    report = run_barrier(*copies, text, methods=("canonical",), points=2, data_seed=7)
    assert report.data_seed is None
    assert report.methods["canonical"].losses == run_barrier(
        a, b, text, methods=("canonical",), points=2).methods["canonical"].losses


def test_data_seed_chooses_the_split_of_folders_without_a_record(digits_runs):
    a, b = digits_runs["bare-a"], digits_runs["bare-b"]
    assert run_barrier(a, b, "digits", methods=("canonical",), points=2).data_seed == 0
    report = run_barrier(a, b, "digits", methods=("canonical",), points=2, data_seed=4)
    assert report.data_seed == 4
    assert report.methods["canonical"].loss_a == pytest.approx(
        evaluate(a, "digits", seed=4).loss, rel=1e-6)
    # One record is enough: B's copy has none, A's says 3.
    mixed = run_barrier(digits_runs["a"], b, "digits", methods=("canonical",), points=2)
    assert mixed.data_seed == 3
    with pytest.raises(GlmcError, match=r"--data-seed 4 contradicts .*/a, trained on split"):
        run_barrier(digits_runs["a"], b, "digits", methods=("canonical",), data_seed=4)


def test_seed_changes_learned_matching_only(digits_runs, capsys):
    """--seed is learned matching's (data order and λ draws): weight matching's curve and the
    endpoints stay, the learned midpoint moves. Each run is long enough to move from its start
    (20 steps validated every 2: every one of seeds 0-19 beat its start, the earliest at step
    2; with 4 steps validated every 2, half of them kept the start, and two runs that both keep
    it compute the same midpoint; measured from weight matching's solution with the rate
    decayed by a cosine over the 20 steps, as pinned here). The data order and λ draws, which
    differ whether or not a run moves, are compared too."""
    a, b = digits_runs["a"], digits_runs["b"]
    runs = {}
    for seed in (0, 1):
        rc, out = _barrier_json(capsys, a, b, "--data", "digits", "--align", "weight",
                                "--align", "learned", "--steps", "20", "--train-batch-size",
                                "16", "--eval-every", "2", "--lr", "0.1", "--points", "3",
                                "--schedule", "cosine", "--patience", "0", "--start", "weight",
                                "--json", "--seed", str(seed))
        assert rc == 0, out
        runs[seed] = out
    assert runs[0]["data_seed"] == runs[1]["data_seed"] == 3
    for key in ("losses", "accuracies"):
        assert runs[0]["methods"]["weight"][key] == runs[1]["methods"]["weight"][key]
    l0, l1 = runs[0]["methods"]["learned"], runs[1]["methods"]["learned"]
    # (A is the same model; B moved by two learned maps computes B's function up to the
    # float32 rounding of each map)
    assert l0["losses"][0] == pytest.approx(l1["losses"][0], rel=1e-6)
    assert l0["losses"][-1] == l1["losses"][-1]
    for run in (l0, l1):  # (both moved: the midpoints are two learned ones, not the start's)
        assert run["learned"]["best_step"] > 0, run["learned"]
        assert run["learned"]["best_val"] < run["learned"]["start_val"], run["learned"]
    assert l0["learned"]["start_val"] == l1["learned"]["start_val"]  # (one start)
    assert l0["losses"][1] != l1["losses"][1]  # λ = 1/2: another data order and λ draws
    logs = []
    for seed in (0, 1):
        al = glmc.align(a, b, method="learned", data="digits", seed=seed,
                        learned=LearnedMatchingOptions(steps=2, batch_size=16, eval_every=1))
        assert al.settings["data_seed"] == 3
        logs.append(al.learned.log)
    for step0, step1 in zip(*logs, strict=True):  # each step: another batch at another λ
        assert step0["lambda"] != step1["lambda"] and step0["loss"] != step1["loss"]
