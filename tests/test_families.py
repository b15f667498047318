"""The family registry, and the methods the convnet family brings: planted recovery of weight
matching (activation matching's: tests/test_activation.py), independently trained MLP and
ResNet pairs, BatchNorm reset, REPAIR, and the commands that use them."""

from __future__ import annotations

import json

import pytest
import torch

import glmc.families
from glmc.api import align, interpolate, load
from glmc.barrier import AlignOptions, run_barrier
from glmc.cli.main import main
from glmc.correction import probe_moments, repair, reset_batchnorm
from glmc.errors import GlmcError
from glmc.families.convnet import ConvNetConfig
from glmc.matching.options import LearnedMatchingOptions
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform
from glmc.tasks import TASKS
from glmc.training.options import ARCHS

SHAPES = [("mlp", "none"), ("vgg11", "batch"), ("resnet20", "batch"), ("resnet20", "layer")]


def random_model(arch: str, norm: str, seed: int = 0) -> CanonicalModel:
    """A convnet on 1x8x8 images with every tensor random (BatchNorm statistics included)."""
    cfg = ConvNetConfig(arch=arch, image_size=8, num_channels=1, num_labels=5, norm=norm,
                        **({"hidden": 16} if arch == "mlp" else {"base": 4}))
    g = torch.Generator().manual_seed(seed)
    state = {}
    for k, v in glmc.families.family_of(cfg).build(cfg).state_dict().items():
        x = torch.randn(v.shape, generator=g, dtype=torch.float64)
        state[k] = x.abs() + 0.5 if k.endswith("running_var") else x * 0.5
    return CanonicalModel(cfg, state)


def images(n: int = 64, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64),
             torch.randint(0, 5, (n,), generator=g))]


def test_every_trainable_architecture_is_registered_by_a_family():
    assert set(ARCHS) == set(glmc.families.ARCHS)
    for arch in glmc.families.ARCHS.values():
        assert arch.task in TASKS


@pytest.mark.parametrize(("arch", "norm"), SHAPES)
def test_weight_matching_recovers_a_planted_permutation(arch, norm):
    """B = π(A) for a random π: weight matching finds π⁻¹ exactly (float64)."""
    a = random_model(arch, norm)
    t = Transform.random(a.spec, torch.Generator().manual_seed(7))
    b = a.transformed(t)
    found = align(a, b).transform
    want = t.inverse(a.spec)
    for space in a.spec.spaces:
        assert torch.equal(found.elements[space].perm, want.elements[space].perm), space
    aligned = b.transformed(found)
    assert all(torch.equal(aligned.state[k], a.state[k]) for k in a.state)


def test_batchnorm_reset_recomputes_the_statistics_of_the_first_norm():
    m = random_model("vgg11", "batch")
    batches = images(128)
    reset = reset_batchnorm(m, batches)
    module = m.module()
    x = batches[0][0]
    y = module.features[0].conv(x)  # what the first BatchNorm reads
    want_mean = y.mean((0, 2, 3))
    want_var = y.var((0, 2, 3), unbiased=True)
    torch.testing.assert_close(reset.state["features.0.norm.running_mean"], want_mean)
    torch.testing.assert_close(reset.state["features.0.norm.running_var"], want_var)
    assert not torch.equal(reset.state["features.1.norm.running_mean"],
                           m.state["features.1.norm.running_mean"])
    # (weights stay as they were)
    assert torch.equal(reset.state["features.0.conv.weight"], m.state["features.0.conv.weight"])


@pytest.mark.parametrize(("arch", "norm"), SHAPES)
def test_repair_gives_every_probe_the_interpolated_statistics(arch, norm):
    """On the batch it measured (one batch: exact), every probe of the repaired midpoint has
    the mean and spread λ·A's + (1 − λ)·B's; the endpoints are returned as they are."""
    a, b = random_model(arch, norm, 0), random_model(arch, norm, 1)
    batches, lam = images(256), 0.3
    merged = a.with_state(interpolate(a.state, b.state, lam))
    fixed = repair(merged, a, b, lam, batches)
    sa, sb, got = (probe_moments(m, batches) for m in (a, b, fixed))
    for name, (mu, sd) in got.items():
        torch.testing.assert_close(mu, lam * sa[name][0] + (1 - lam) * sb[name][0],
                                   atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(sd, lam * sa[name][1] + (1 - lam) * sb[name][1],
                                   atol=1e-6, rtol=1e-5)
    assert repair(a, a, b, 1.0, batches) is a


# -- an independently trained pair --------------------------------------------------------


def train_convnets(root, args: list[str], seeds) -> list:
    """``glmc train`` (one thread) of one model per seed, in ``root``; their folders."""
    folders = []
    for seed in seeds:
        folders.append(root / f"s{seed}")
        assert main(["train", *args, "--data", "digits", "--seed", str(seed), "--threads", "1",
                     "-o", str(folders[-1]), "--json"]) == 0
    return folders


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def pairs_of(folders: list) -> list[tuple]:
    """Every pair of the models (three models: three pairs)."""
    return [(a, b) for i, a in enumerate(folders) for b in folders[i + 1:]]


#: Noise of the trained-pair figures below. Small pairs trained for seconds are chaotic:
#: retraining one with the learning rate moved by 1e-4 of itself (what another CPU's rounding
#: does to a trajectory) moves a single pair's figure by 20-30% (the MLP's REPAIR share
#: 0.75x -> 0.52x and 0.70x). The MLP and VGG tests therefore assert on the mean over the three
#: pairs of three models (seeds 0, 1, 2), whose noise was measured on the same pairs retrained
#: so ("perturbed") and on models of seeds 3-5 and 6-8 ("seeds"). The ResNet pair, 30 s to
#: train, is one pair.
MLP = ["--arch", "mlp", "--base", "64", "--steps", "300", "--batch-size", "64", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def mlp_models(tmp_path_factory, h) -> list:
    """Three MLPs (3x64) trained on digits from seeds 0, 1 and 2 (about 0.3 s each)."""
    h.require_packages("sklearn")
    return train_convnets(tmp_path_factory.mktemp("mlp"), MLP, (0, 1, 2))


@pytest.fixture(scope="module")
def mlp_pair(mlp_models):
    """Two MLPs (3x64) trained on digits from different seeds."""
    return mlp_models[0], mlp_models[1]


def test_matching_independently_trained_mlp_pairs_beats_averaging(mlp_models):
    """Mean over the three pairs of the share of vanilla averaging's loss barrier each method
    leaves, measured (pair 0-1's share; perturbed; seeds): weight 0.101 (0.077x; 0.093, 0.084;
    0.086, 0.104), activation 0.104 (0.073x; 0.105, 0.129; 0.090, 0.096), activation-prepost
    0.128 (0.099x; 0.130, 0.126; 0.133, 0.105). Margins: 0.13, 0.14, 0.17 (about 1.3x)."""
    margin = {"weight": 0.13, "activation": 0.14, "activation-prepost": 0.17}
    shares: dict[str, list[float]] = {m: [] for m in margin}
    for a, b in pairs_of(mlp_models):
        report = run_barrier(a, b, "digits", methods=("none", *margin), points=5)
        none = report.methods["none"].loss_barrier
        assert none > 0.5, (a, b, none)  # (measured: 1.34, 1.22, 1.00)
        for method in margin:
            shares[method].append(report.methods[method].loss_barrier / none)
    for method, share in margin.items():
        assert mean(shares[method]) <= share, (method, shares[method])


#: Learned matching on the MLPs: 600 steps of batch 16 (about 1 s), validated every 100 steps on
#: 12 batches (192 images; on 4, the choice by validation was noisier), from weight matching's
#: solution with the rate decayed by a cosine over the 600 steps (as measured below).
MLP_LEARNED = LearnedMatchingOptions(steps=600, batch_size=16, lr=3e-2, eval_every=100,
                                     eval_batches=12, schedule="cosine", patience=0,
                                     start="weight")


def test_learned_matching_and_repair_beat_weight_matching_on_trained_mlp_pairs(mlp_models):
    """Mean over the three pairs of the share of weight matching's loss barrier (its shares
    of vanilla's: 0.033, 0.095, 0.120) that learned matching and REPAIR (after weight
    matching) leave, measured: learned 0.823 (0.689, 1.0, 0.782: one pair kept its start),
    REPAIR 0.854 (0.916, 0.751, 0.896). With units assigned by angle, the earlier default,
    weight matching left more (0.077, 0.162, 0.064 of vanilla's) and learned matching and
    REPAIR 0.629 and 0.785 of it. Margins: learned 0.9, REPAIR 0.9 (a regression that gives
    back half of the gain fails). Weight matching as these were measured: run to its fixed
    point (``stop="fixed-point"``; the default's earlier stop leaves these pairs' weight
    barriers within 1.6% of it, but moves learned matching's start: chaotic pairs, see
    above)."""
    shares: dict[str, list[float]] = {"learned": [], "repair": []}
    fixed_point = {"tol": 1e-5, "stop": "fixed-point"}
    for a, b in pairs_of(mlp_models):
        report = run_barrier(a, b, "digits", methods=("weight", "learned"), points=5,
                             options=AlignOptions(seed=0, learned=MLP_LEARNED, **fixed_point))
        weight = report.methods["weight"].loss_barrier
        assert weight > 0.03, (a, b, weight)
        shares["learned"].append(report.methods["learned"].loss_barrier / weight)
        repaired = run_barrier(a, b, "digits", methods=("weight",), points=5,
                               options=AlignOptions(correction="repair", **fixed_point))
        assert repaired.methods["weight"].losses[0] == pytest.approx(
            report.methods["weight"].losses[0], rel=1e-6)  # (the endpoints are the models)
        shares["repair"].append(repaired.methods["weight"].loss_barrier / weight)
    assert mean(shares["learned"]) <= 0.9, shares
    assert mean(shares["repair"]) <= 0.9, shares


#: A VGG-11 with BatchNorm, 32 channels in its first stage (about 10 s to train). At 16
#: channels the figure below moved with the CPU's arithmetic as with the seeds: means of
#: 0.277 and 0.525 (seeds 3-5) on one machine, 0.423, 0.579 and 0.162 (seeds 0-2, 3-5, 6-8)
#: on another.
VGG_BN = ["--arch", "vgg11", "--norm", "batch", "--base", "32", "--steps", "300",
          "--batch-size", "64", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def vgg_bn_models(tmp_path_factory, h) -> list:
    """Three BatchNorm VGG-11s (base 32) trained on digits from seeds 0, 1 and 2."""
    h.require_packages("sklearn")
    return train_convnets(tmp_path_factory.mktemp("vgg-bn"), VGG_BN, (0, 1, 2))


def test_batchnorm_reset_and_repair_beat_weight_matching_on_trained_batchnorm_pairs(
        vgg_bn_models):
    """With BatchNorm, weight matching alone interpolates the running statistics, which no
    longer describe the merged model (measured barriers: 2.05, 2.32, 2.46, the midpoint near
    chance); a reset and REPAIR recompute them. Mean over the three pairs of the share of
    weight matching's loss barrier each leaves, measured on the Xeon of benchmarks/README.md
    (seeds 0-2; seeds 3-5 and 6-8): reset 0.250 (0.243, 0.183), REPAIR 0.250 (0.244,
    0.181). Margin: 0.4 for both (1.6x; a regression that gives back half fails)."""
    shares: dict[str, list[float]] = {"reset": [], "repair": []}
    for a, b in pairs_of(vgg_bn_models):
        weight = run_barrier(a, b, "digits", methods=("weight",), points=5).methods["weight"]
        assert weight.loss_barrier > 1.0, (a, b, weight.loss_barrier)
        for how in shares:
            got = run_barrier(a, b, "digits", methods=("weight",), points=5,
                              options=AlignOptions(correction=how)).methods["weight"]
            assert got.losses[0] == pytest.approx(weight.losses[0], rel=1e-6)  # (endpoints)
            assert got.losses[-1] == pytest.approx(weight.losses[-1], rel=1e-6)
            shares[how].append(got.loss_barrier / weight.loss_barrier)
    for how, got in shares.items():
        assert mean(got) <= 0.4, (how, got)


@pytest.fixture(scope="module")
def resnet_pair(tmp_path_factory, h):
    """Two LayerNorm ResNet-20s (2x wide) trained on digits from different seeds, with the
    strong weight decay under which weight matching pairs learned features rather than the
    initialisation's noise (benchmarks/convnets.py)."""
    h.require_packages("sklearn")
    root = tmp_path_factory.mktemp("resnet")
    for seed in (0, 1):
        assert main(["train", "--arch", "resnet20", "--norm", "layer", "--width", "2",
                     "--data", "digits", "--seed", str(seed), "--steps", "300",
                     "--batch-size", "64", "--lr", "1e-3", "--weight-decay", "4",
                     "--threads", "1", "-o", str(root / f"r{seed}"), "--json"]) == 0
    return root / "r0", root / "r1"


def test_weight_matching_an_independently_trained_resnet_pair_beats_averaging(resnet_pair):
    """Share of vanilla averaging's loss barrier (measured: 1.364) each method leaves,
    measured (perturbed; seed pairs 2-3 and 4-5): weight 0.379x (0.324; 0.400, 0.574),
    activation, the block outputs, 0.117x (0.085; 0.096, 0.160), activation-prepost, the
    summands, 0.152x (0.074; 0.101, 0.112). Margins: weight 0.5, activation 0.16,
    activation-prepost 0.2 (about 1.35x; one pair, 30 s to train: seed pair 4-5 would fail
    the weight margin)."""
    a, b = resnet_pair
    margin = {"weight": 0.5, "activation": 0.16, "activation-prepost": 0.2}
    report = run_barrier(a, b, "digits", methods=("none", *margin), points=5)
    none = report.methods["none"].loss_barrier
    assert none > 0.8, none
    for method, share in margin.items():
        got = report.methods[method].loss_barrier
        assert got <= share * none, (method, got, got / none, share)


def test_merge_with_repair_writes_a_convnet_folder_with_its_report(mlp_pair, tmp_path, capsys):
    a, b = mlp_pair
    out = tmp_path / "merged"
    assert main(["merge", str(a), str(b), "-o", str(out), "--align", "weight",
                 "--correction", "repair", "--data", "digits", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["correction"] == "repair" and report["format"].startswith("glmc")
    assert "statistics" not in report  # (no BatchNorm: nothing interpolated to warn of)
    merged = load(out).canonical
    assert merged.config == load(a).canonical.config


def test_barrier_refuses_a_correction_that_does_not_apply(mlp_pair, capsys):
    a, b = mlp_pair
    assert main(["barrier", str(a), str(b), "--data", "digits", "--correction",
                 "reset"]) != 0
    assert "no BatchNorm layer" in capsys.readouterr().err


def test_a_batchnorm_merge_without_correction_says_the_statistics_are_interpolated(
        tmp_path, capsys):
    from glmc.io.folders import write_glmc

    folders = []
    for seed in (0, 1):
        m = random_model("resnet20", "batch", seed).to(torch.float32)
        folder = tmp_path / f"r{seed}"
        folder.mkdir()
        write_glmc(folder, m)
        folders.append(str(folder))
    assert main(["merge", *folders, "-o", str(tmp_path / "out"), "--align", "weight",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "interpolated, not recomputed" in report["statistics"]


def test_a_convnet_folder_with_a_wrong_tensor_names_it(tmp_path):
    from safetensors.torch import load_file, save_file

    from glmc.io.folders import write_glmc

    m = random_model("vgg11", "batch").to(torch.float32)
    write_glmc(tmp_path, m)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["features.1.norm.running_var"] = torch.ones(3)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(GlmcError, match=r"features\.1\.norm\.running_var has shape \[3\]"):
        load(tmp_path)
