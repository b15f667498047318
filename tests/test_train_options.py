"""Training options owned by the families (glmc.families.options): a run's config holds the
options every run has plus its family's; records written when every run held every option
still read; ``glmc train --help`` is generated from the declarations."""

from __future__ import annotations

import pytest

from glmc.cli.main import main
from glmc.errors import GlmcError
from glmc.families.options import TRAIN_OPTIONS, FamilyOptions, TrainOption
from glmc.training.options import TrainConfig


def test_a_run_holds_the_common_options_and_its_familys_only():
    gpt = TrainConfig(arch="gpt2", data="x", n_layer=3, width=5).to_json()
    mlp = TrainConfig(arch="mlp", data="x", width=2, n_layer=7).to_json()
    assert gpt["n_layer"] == 3 and {"width", "norm", "base"}.isdisjoint(gpt)
    assert mlp["width"] == 2 and {"n_layer", "n_embd", "patch_size"}.isdisjoint(mlp)
    assert gpt["steps"] == mlp["steps"] == 500  # (the common ones, in both)
    with pytest.raises(AttributeError, match="--arch mlp has no training option 'n_layer'"):
        TrainConfig(arch="mlp", data="x").n_layer  # noqa: B018


def test_a_record_that_held_every_familys_options_reads_as_the_same_run():
    cfg = TrainConfig(arch="vit", data="digits", n_layer=1, patch_size=2, steps=3)
    old = cfg.flat() | {"width": 4}  # (another family's option never shaped the weights)
    assert {"width", "norm", "base", "n_layer"} <= set(old)
    again = TrainConfig.from_json(old)
    assert again == cfg and again.identity() == cfg.identity()
    with pytest.raises(GlmcError, match="unknown training option 'depth'"):
        TrainConfig.from_json(old | {"depth": 2})


def test_a_familys_options_are_checked_by_their_declarations():
    with pytest.raises(GlmcError, match="width must be at least 1, got 0"):
        TrainConfig(arch="resnet20", data="x", width=0).validate()
    with pytest.raises(GlmcError, match="norm must be one of batch, layer, none, got 'group'"):
        TrainConfig(arch="vgg11", data="x", norm="group").validate()
    with pytest.raises(GlmcError, match="n_head 3 does not divide n_embd 16"):
        TrainConfig(arch="llama", data="x", n_embd=16, n_head=3).validate()
    TrainConfig(arch="mlp", data="x", n_head=3).validate()  # (not the convnets' option)


def test_train_help_lists_each_familys_declared_options(capsys, monkeypatch):
    toy = FamilyOptions("toy", (TrainOption("toy_depth", int, 3, "blocks of the toy net"),))
    monkeypatch.setitem(TRAIN_OPTIONS, "toy", toy)
    monkeypatch.setenv("COLUMNS", "1000")  # (no help line wrapped)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "transformer options (gpt2, vit, llama, gpt-neox, bert):" in out
    assert "convnet options (mlp, vgg11, vgg16, resnet20):" in out
    for family in TRAIN_OPTIONS.values():
        for option in family.options:
            assert f"{option.flag} " in out and " ".join(option.help.split()) in out, option
    assert "--toy-depth TOY_DEPTH blocks of the toy net (default: 3)" in out
