"""Barriers: the arithmetic, evaluation along the line, alignment methods, plots and the CLI."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from glmc.barrier import barrier, barrier_curve, get_method, lambda_grid, run_barrier
from glmc.cli.main import main
from glmc.data import CharTokenizer, ImageDataset, save_tokenizer
from glmc.errors import GlmcError
from glmc.evaluate import evaluate
from glmc.io.folders import write_model
from glmc.models import canonical as canonical_module
from glmc.plots import plot_barriers
from glmc.symmetry.transform import Transform

CHARS = "abcdefghijklmnopqrstuvwxyz .,\n"  # 30 characters: the tiny GPT-2's 30 ids

# -- the arithmetic -----------------------------------------------------------------------


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
    with pytest.raises(GlmcError, match=r"available: none, weight, weight-perm"):
        get_method("activation")


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


def test_endpoints_are_the_models_evaluated_separately(lm_pair, monkeypatch):
    a, b, text = lm_pair
    built = []
    init = canonical_module.CanonicalTransformer.__init__

    def counting_init(self, cfg):
        built.append(cfg)
        init(self, cfg)

    monkeypatch.setattr(canonical_module.CanonicalTransformer, "__init__", counting_init)
    report = run_barrier(a, b, text, methods=("none", "weight"), points=4)
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
    assert not report.warnings


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
    report = run_barrier(a, b, ds, methods=("none", "weight"), points=5)
    none, weight = report.methods["none"], report.methods["weight"]
    assert none.acc_a == 1.0 and none.acc_b == 1.0
    assert none.loss_barrier > 0.1 and none.acc_barrier > 0
    assert weight.loss_barrier < 1e-4 and weight.acc_barrier == 0.0
    assert max(weight.losses) - min(weight.losses) < 1e-4
    path = plot_barriers(report, tmp_path / "planted.png", title="planted pair")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the command line ---------------------------------------------------------------------


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
