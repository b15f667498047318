"""Weight matching: planted recovery (B = g·A), merges, objective traces, token counts, and
errors on bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import glmc
from glmc.api import read_token_counts
from glmc.errors import GlmcError
from glmc.io.folders import write_model
from glmc.matching.descent import Sweeps
from glmc.matching.solvers import align_inner, assignment, procrustes
from glmc.matching.weight import WeightMatchingOptions, weight_matching
from glmc.symmetry.groups import BlockInvertibleGroup, OrthogonalGroup, Permutation
from glmc.symmetry.transform import Transform

F64 = torch.float64
ALL_ROLES = {"residual", "heads", "qk", "ov", "mlp"}

#: Planted group elements: the roles of the spaces g moves and the subgroups it draws from.
PLANTED = {
    "residual-permutation": ({"residual"}, {"residual": "permutation"}),
    "residual-fix-ones": ({"residual"}, {"residual": "fix_ones"}),
    "residual-orthogonal": ({"residual"}, {}),
    "head-permutations": ({"heads"}, {}),
    "inner-head-maps": ({"qk", "ov"}, {}),
    "mlp-permutations": ({"mlp"}, {}),
    "full-group-fix-ones": (ALL_ROLES, {"residual": "fix_ones"}),
    "full-group": (ALL_ROLES, {}),
    "full-group-residual-permutation": (ALL_ROLES, {"residual": "permutation"}),
    "permutation-only": (ALL_ROLES, {"residual": "permutation", "qk": "permutation",
                                     "ov": "permutation"}),
}


def plant(model, case: str, seed: int = 1):
    """B = g·A for a random g of the planted kind."""
    roles, subgroups = PLANTED[case]
    t = Transform.random(model.spec, torch.Generator().manual_seed(seed), subgroups=subgroups)
    return model.transformed(Transform({k: e for k, e in t.elements.items()
                                        if model.spec.roles[k] in roles}))


def assert_planted_recovered(h, tiny, a, b, **align_options):
    """Alignment brings B back onto A; the aligned merge is A's function, the plain one not."""
    x = tiny.inputs()
    ref = h.canonical_output(a, x)
    assert h.rel_weight_distance(a, b) > 1e-2  # the plant moved the weights
    merged, al = glmc.merge(a, b, alpha=0.5, **align_options)  # method="weight"
    assert h.rel_weight_distance(al.a, al.aligned) < 1e-5
    assert h.rel_diff(ref, h.canonical_output(merged, x)) < 1e-6
    plain, none = glmc.merge(a, b, alpha=0.5, method="canonical", **align_options)
    assert none is None
    assert h.rel_diff(ref, h.canonical_output(plain, x)) > 1e-2
    return al


@pytest.mark.parametrize("case", list(PLANTED))
def test_planted_recovery(h, arch, case):
    tiny = h.make_tiny(arch, n_layer=2, d=32, n_head=4)
    a = tiny.canonical()
    b = plant(a, case)
    al = assert_planted_recovered(h, tiny, a, b)
    if case not in ("full-group", "residual-orthogonal"):
        # B stays centred, so the residual map found fixes the all-ones direction and the
        # aligned model is again a stock model.
        res = al.transform.elements["res"].matrix(F64)
        ones = torch.ones(res.shape[0], dtype=F64)
        torch.testing.assert_close(res @ ones, ones)
        tiny.importer.to_stock(al.aligned)


def test_planted_inner_head_maps_are_recovered_in_float32(h):
    """The CLI loads models in float32: matching must recover inner head maps there too.
    (Several seeds and layers, so that the outcome does not hinge on one rounding sign.)"""
    for arch in ("gpt2", "vit"):
        for seed in range(4):
            a = h.make_tiny(arch, n_layer=3, seed=seed, dtype=torch.float32).canonical()
            b = plant(a, "inner-head-maps", seed=seed)
            al = glmc.align(a, b)
            assert h.rel_weight_distance(a, al.aligned) < 1e-5, (arch, seed)


@pytest.mark.parametrize(("d", "n_head", "case"), [
    (96, 4, "full-group"),
    (96, 4, "full-group-fix-ones"),
    (384, 6, "full-group-fix-ones"),
])
def test_planted_recovery_char_level_vocab_smaller_than_width(h, d, n_head, case):
    tiny = h.make_tiny("gpt2", n_layer=2, d=d, n_head=n_head, vocab=65, n_positions=32)
    a = tiny.canonical()
    assert_planted_recovered(h, tiny, a, plant(a, case))


def is_permutation_matrix(m: torch.Tensor) -> bool:
    return bool(((m == 0) | (m == 1)).all() and (m.sum(0) == 1).all() and (m.sum(1) == 1).all())


def test_permutation_only_ablation_recovers_a_planted_permutation_and_stays_one(h, arch):
    """residual="permutation": the residual map, the heads and every head's dimensions are
    permutations (no orthogonal or invertible map anywhere), and a planted one comes back."""
    tiny = h.make_tiny(arch)
    a = tiny.canonical()
    b = plant(a, "permutation-only")
    al = assert_planted_recovered(h, tiny, a, b, residual="permutation")
    for space, e in al.transform.elements.items():
        role = a.spec.roles[space]
        if role in ("residual", "heads", "mlp"):
            assert isinstance(e, Permutation), space
        else:
            assert all(is_permutation_matrix(blk) for blk in e.blocks), space


def test_circuit_mode_planted_recovery(h, arch):
    """heads="circuit": both models go to circuit form, where inner head maps vanish."""
    tiny = h.make_tiny(arch)
    a = tiny.canonical()
    al = assert_planted_recovered(h, tiny, a, plant(a, "full-group"), heads="circuit")
    assert al.a.config.attention == "circuit" and al.aligned.config.attention == "circuit"


@pytest.mark.parametrize("options", [{}, {"residual": "permutation"}, {"heads": "circuit"},
                                     {"residual": "none"}],
                         ids=["default", "residual-permutation", "circuit", "residual-none"])
def test_independent_models_distance_falls_and_function_is_kept(h, arch, options):
    tiny_b = h.make_tiny(arch, seed=2)
    a, b = h.make_tiny(arch, seed=1).canonical(), tiny_b.canonical()
    al = glmc.align(a, b, **options)
    m = al.match
    assert m.distance < m.init_distance  # matching found something
    assert 0 < m.relative < 1.5
    x = tiny_b.inputs()
    assert h.rel_diff(tiny_b.logits(x), h.canonical_output(al.aligned, x)) < 1e-9
    if options.get("residual") == "none":
        res = al.transform.elements["res"].matrix(F64)
        torch.testing.assert_close(res, torch.eye(res.shape[0], dtype=F64))


def test_distance_never_rises_when_every_step_minimises_it(h, arch):
    """With units assigned by the distance itself and every step exact (permutations only),
    coordinate descent never raises D; the trace's D is B aligned's distance, recomputed."""
    a, b = h.make_tiny(arch, seed=1).canonical(), h.make_tiny(arch, seed=2).canonical()
    al = glmc.align(a, b, residual="permutation", unit_cost="distance", tol=0.0, max_iter=6,
                    bias_weight=1.0)
    m = al.match
    ds = [m.init_distance] + [t["distance"] for t in m.trace]
    for before, after in zip(ds, ds[1:], strict=False):
        assert after <= before * (1 + 1e-9)
    w = {n: 1.0 / t.numel() for n, t in a.state.items() if n in a.spec.axes}
    direct = sum(w[n] * float((a.state[n] - al.aligned.state[n]).pow(2).sum()) for n in w)
    assert m.distance == pytest.approx(direct, rel=1e-9)


def test_align_accepts_model_folders(h, tmp_path):
    tiny = h.make_tiny("vit")
    a = tiny.canonical()
    for name, model in (("a", a), ("b", plant(a, "full-group-fix-ones"))):
        (tmp_path / name).mkdir()
        assert write_model(tmp_path / name, model) == "hf"
    al = glmc.align(tmp_path / "a", str(tmp_path / "b"))
    assert al.a.dtype == torch.float32  # folders load in float32
    assert h.rel_weight_distance(al.a, al.aligned) < 1e-5


def test_max_iter_bounds_the_trace_and_progress_is_reported(h):
    a, b = h.make_tiny("vit", seed=1).canonical(), h.make_tiny("vit", seed=2).canonical()
    calls = []
    al = glmc.align(a, b, max_iter=2, tol=0.0, progress=lambda it, obj: calls.append((it, obj)))
    assert len(al.match.trace) == 2 and not al.match.converged
    assert [c[0] for c in calls] == [1, 2]
    assert calls[-1][1] == pytest.approx(al.match.trace[-1]["relative"])


def _row(distance: float, solved: int, changed: int) -> dict:
    return {"distance": distance, "units_solved": solved, "units_changed": changed}


@pytest.mark.parametrize("stop", ["objective", "fixed-point"])
def test_the_stopping_rules(stop):
    """A small gain ends the run only after a full sweep ("objective"), and only when that
    sweep also changed no assignment ("fixed-point"); a small gain after a partial sweep
    asks for a full one."""
    sweeps = Sweeps(["u", "v", "w"], tol=1e-2, stop=stop)
    assert not sweeps.converged(1.0, _row(0.5, 3, 3))  # (a large gain)
    for u in ("u", "v"):
        sweeps.solved(u, True, 0)
    assert sweeps.due(1) == ["w"]  # (unchanged units wait)
    assert not sweeps.converged(0.5, _row(0.499, 1, 1))  # (small, but a partial sweep)
    assert sweeps.due(2) == ["u", "v", "w"]  # (so the next one is full)
    assert sweeps.converged(0.499, _row(0.498, 3, 1)) == (stop == "objective")
    assert sweeps.converged(0.498, _row(0.498, 3, 0))


def test_weight_matching_stops_at_the_first_full_sweep_gaining_less_than_tol(h):
    """The default stop on an independently initialised pair: the last iteration is a full
    sweep whose relative gain is under ``tol``, every earlier full sweep gained more."""
    a, b = h.make_tiny("gpt2", seed=1).canonical(), h.make_tiny("gpt2", seed=2).canonical()
    opts = WeightMatchingOptions(tol=1e-2)
    trace = weight_matching(a, b, opts).trace
    n_units = trace[0]["units_solved"]
    start = [weight_matching(a, b, WeightMatchingOptions(max_iter=1)).init_distance,
             *(r["distance"] for r in trace)]
    gains = [(start[i] - r["distance"]) / start[i] for i, r in enumerate(trace)]
    full = [i for i, r in enumerate(trace) if r["units_solved"] == n_units]
    assert full[-1] == len(trace) - 1 and gains[-1] <= opts.tol
    assert all(gains[i] > opts.tol for i in full[:-1])
    fixed = weight_matching(a, b, WeightMatchingOptions(tol=1e-2, stop="fixed-point")).trace
    assert len(fixed) >= len(trace)


# -- token counts --------------------------------------------------------------------------


def test_token_counts_ignore_rows_of_unseen_tokens(h):
    """B = g·A, then the embedding rows of unseen tokens are overwritten with large noise:
    with token counts, matching ignores those rows and still recovers g exactly."""
    tiny = h.make_tiny("gpt2", vocab=50)
    a = tiny.canonical()
    b = plant(a, "full-group")
    counts = torch.ones(50)
    counts[::3] = 0
    unseen = counts == 0
    state = dict(b.state)
    g = torch.Generator().manual_seed(9)
    noise = torch.randn(int(unseen.sum()), 32, dtype=F64, generator=g)
    state["embed.tok"] = state["embed.tok"].clone()
    state["embed.tok"][unseen] += 20 * noise
    b = b.with_state(state)

    def seen_distance(al):
        """Relative distance of aligned B to A over the rows of seen tokens only."""
        def seen(m):
            return m.with_state({k: v[~unseen] if k in ("embed.tok", "head.weight") else v
                                 for k, v in m.state.items()})
        return h.rel_weight_distance(seen(al.a), seen(al.aligned))

    assert seen_distance(glmc.align(a, b, token_counts=counts)) < 1e-5
    assert seen_distance(glmc.align(a, b)) > 1e-2  # without counts the noise misleads


@pytest.mark.parametrize(("name", "content"), [
    ("counts.json", "[0, 2, 0, 5]"),
    ("counts.json", '{"1": 2, "3": 5}'),
    ("counts.txt", "0 2\n0 5\n"),
    ("counts.npy", None),
])
def test_read_token_counts_formats(tmp_path, name, content):
    path = tmp_path / name
    if content is None:
        np.save(path, np.array([0, 2, 0, 5]))
    else:
        path.write_text(content)
    assert read_token_counts(path, 4).tolist() == [0, 2, 0, 5]
    if content and content.startswith("{"):  # {id: count}: ids beyond the vocabulary fail
        assert read_token_counts(path, 5).tolist() == [0, 2, 0, 5, 0]
        with pytest.raises(GlmcError, match="cannot read token counts"):
            read_token_counts(path, 3)
    else:
        with pytest.raises(GlmcError, match=f"{path}: 4 token counts, the vocabulary has 5"):
            read_token_counts(path, 5)


def test_read_token_counts_errors(tmp_path):
    path = tmp_path / "counts.txt"
    path.write_text("one two")
    with pytest.raises(GlmcError, match=f"{path}: cannot read token counts"):
        read_token_counts(path, 2)
    with pytest.raises(GlmcError, match="no such token-count file"):
        read_token_counts(tmp_path / "missing.json", 4)


def test_token_counts_are_validated(h):
    a = h.make_tiny("gpt2", vocab=50).canonical()
    with pytest.raises(GlmcError, match="49 token counts for a vocabulary of 50"):
        glmc.align(a, a, token_counts=torch.ones(49))
    vit = h.make_tiny("vit").canonical()
    with pytest.raises(GlmcError, match="language models only"):
        glmc.align(vit, vit, token_counts=torch.ones(5))


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(("a_opts", "b_opts", "message"), [
    ({"n_inner": 64}, {"n_inner": 128}, "the models differ in n_inner (64 in A, 128 in B)"),
    ({"d": 32}, {"d": 48, "n_head": 4}, "the models differ in n_embd (32 in A, 48 in B)"),
    ({"n_layer": 2}, {"n_layer": 1}, "the models differ in n_layer (2 in A, 1 in B)"),
])
@pytest.mark.parametrize("align_method", ["weight", "canonical", "none"])
def test_different_sizes_are_rejected_in_the_configs_terms(h, a_opts, b_opts, message,
                                                           align_method):
    a = h.make_tiny("gpt2", **a_opts).canonical()
    b = h.make_tiny("gpt2", **b_opts).canonical()
    with pytest.raises(GlmcError) as err:
        glmc.merge(a, b, method=align_method)
    assert message in str(err.value)


@pytest.mark.parametrize("who", ["A", "B"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_rejected_naming_the_tensor(h, arch, who, bad):
    a = h.make_tiny(arch).canonical()
    state = {k: v.clone() for k, v in a.state.items()}
    state["blocks.1.mlp.fc.bias"][3] = bad
    broken = a.with_state(state)
    pair = (broken, a) if who == "A" else (a, broken)
    with pytest.raises(GlmcError, match=f"model {who}: tensor blocks.1.mlp.fc.bias contains"):
        glmc.align(*pair)


def test_huge_finite_weights_are_not_taken_for_non_finite(h):
    """The check sums a tensor first; a sum that overflows must not reject finite entries."""
    from glmc.model import check_pair

    a = h.make_tiny("gpt2", dtype=torch.float32).canonical()
    state = {k: v.clone() for k, v in a.state.items()}
    state["blocks.1.mlp.fc.bias"][:2] = 3e38  # (finite; their float32 sum is inf)
    assert not torch.isfinite(state["blocks.1.mlp.fc.bias"].sum())
    check_pair(a, a.with_state(state))


def test_bad_options_are_rejected(h):
    a = h.make_tiny("vit").canonical()
    with pytest.raises(GlmcError, match="unknown alignment method"):
        glmc.align(a, a, method="learned-magic")
    with pytest.raises(GlmcError, match="unknown heads mode"):
        glmc.align(a, a, heads="sideways")
    with pytest.raises(GlmcError, match="unknown residual mode"):
        weight_matching(a, a, WeightMatchingOptions(residual="diagonal"))
    with pytest.raises(GlmcError, match="alpha must lie in"):
        glmc.merge(a, a, alpha=1.5)


def test_merge_endpoints(h):
    a, b = h.make_tiny("vit", seed=1).canonical(), h.make_tiny("vit", seed=2).canonical()
    at_a, al = glmc.merge(a, b, alpha=1.0, max_iter=2)
    at_b, _ = glmc.merge(a, b, alpha=0.0, max_iter=2)
    for k in a.state:
        torch.testing.assert_close(at_a.state[k], a.state[k])
        torch.testing.assert_close(at_b.state[k], al.aligned.state[k])


# -- solvers -------------------------------------------------------------------------------


def test_assignment_recovers_a_permutation_and_keeps_an_optimal_one():
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(20, generator=g)
    m = torch.randn(20, 20, generator=g, dtype=F64) * 0.1
    m[torch.arange(20), perm] += 1.0
    assert torch.equal(assignment(m), perm)
    assert torch.equal(assignment(m, current=perm), perm)
    wrong = perm.roll(1)
    assert torch.equal(assignment(m, current=wrong), perm)  # a suboptimal start is not kept


@pytest.mark.parametrize("fix_ones", [False, True])
def test_procrustes_recovers_an_orthogonal_map(fix_ones):
    g = torch.Generator().manual_seed(0)
    group = OrthogonalGroup(10)
    o = (group.subgroup("fix_ones") if fix_ones else group).random(g).matrix()
    x = torch.randn(10, 40, generator=g, dtype=F64)
    if fix_ones:
        x = x - x.mean(0)  # centred data: the all-ones direction is in the null space
    m = (o @ x) @ x.T  # cross-correlation of A = O·X with B = X
    torch.testing.assert_close(procrustes(m, fix_ones), o)


def test_align_inner_recovers_an_invertible_head_map():
    g = torch.Generator().manual_seed(0)
    k, d = 4, 12
    xa, ya = torch.randn(k, d, generator=g, dtype=F64), torch.randn(k, d, generator=g, dtype=F64)
    m = BlockInvertibleGroup(1, k).random(g).matrix()
    xb, yb = torch.linalg.solve(m, xa), m.T @ ya  # head b = head a under M⁻¹
    rec = align_inner(xa, ya, xb, yb, invertible=True)
    torch.testing.assert_close(rec @ xb, xa)
    torch.testing.assert_close(torch.linalg.inv(rec).T @ yb, ya)


# -- the loop's machinery ------------------------------------------------------------------


def test_units_solved_in_parallel_give_the_serial_result(h, arch):
    """Units run one per core (torch threads); the result must not depend on how many."""
    from glmc.matching.problem import Problem

    a = h.make_tiny(arch, n_layer=3, d=48, n_head=4, seed=1).canonical()
    b = h.make_tiny(arch, n_layer=3, d=48, n_head=4, seed=2).canonical()
    assert Problem(a, b, WeightMatchingOptions()).independent  # (units meet only the stream)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(weight_matching(a, b))
    finally:
        torch.set_num_threads(threads)
    serial, parallel = results
    assert len(serial.trace) == len(parallel.trace)
    for x, y in zip(serial.trace, parallel.trace, strict=True):
        assert abs(x["distance"] - y["distance"]) <= 1e-9 * abs(x["distance"])
        assert x["units_changed"] == y["units_changed"]
    for space, e in serial.transform.elements.items():
        other = parallel.transform.elements[space]
        if isinstance(e, Permutation):
            assert torch.equal(e.perm, other.perm), space
        else:
            torch.testing.assert_close(e.matrix(F64), other.matrix(F64), rtol=0, atol=1e-8)


def test_trace_counts_the_units_solved_by_kind(h):
    """Each iteration's ``unit_solves`` splits ``units_solved`` by the spec's role; the first
    iteration solves every unit (the benchmarks' floor reads the MLP count)."""
    a = h.make_tiny("gpt2", n_layer=2, d=32, n_head=2, seed=1).canonical()
    b = h.make_tiny("gpt2", n_layer=2, d=32, n_head=2, seed=2).canonical()
    trace = weight_matching(a, b, WeightMatchingOptions(max_iter=4)).trace
    roles = [a.spec.roles.get(s) for s in a.spec.spaces]
    assert trace[0]["unit_solves"] == {"mlp": roles.count("mlp"), "heads": roles.count("heads")}
    for row in trace:
        assert sum(row["unit_solves"].values()) == row["units_solved"]


@pytest.mark.parametrize("moved", [2, 40], ids=["few-slices", "most-slices"])
def test_residual_cache_update_from_moved_slices_equals_a_recomputation(h, moved):
    """After a unit's permutation changes, the cached cross-correlations are updated from
    the moved slices only (or recomputed when most moved): both equal a fresh cache."""
    from glmc.matching.problem import Problem
    from glmc.matching.residual import ResidualCache

    a = h.make_tiny("gpt2", n_layer=2, d=12, n_head=2, seed=1).canonical()  # MLP 48
    b = h.make_tiny("gpt2", n_layer=2, d=12, n_head=2, seed=2).canonical()
    prob = Problem(a, b, WeightMatchingOptions())
    g = torch.Generator().manual_seed(0)
    el = Transform.random(prob.spec, g).elements
    bt_all = prob.apply(el, set())
    cache = ResidualCache(prob, "res", el["res"], bt_all)
    unit = "mlp.0"
    perm = el[unit].perm.clone()
    idx = torch.randperm(perm.numel(), generator=g)[:moved]
    perm[idx] = perm[idx.roll(1)]  # a cycle through ``moved`` positions
    new = Permutation(perm)
    names = [n for n, _, _ in prob.spec.occurrences(unit)]
    moved = prob.apply({**el, unit: new}, set(), names)
    before = {n: c.clone() for n, c in cache.cross.items()}
    update = cache.permuted(moved, unit, el[unit], new)
    assert set(update) == {n for n in names if n in cache.axis} and update
    assert all(torch.equal(before[n], c) for n, c in cache.cross.items())  # nothing changed
    cache.cross.update(update)
    el[unit] = new
    fresh = ResidualCache(prob, "res", el["res"], prob.apply(el, set()))
    assert set(cache.cross) == set(fresh.cross)
    for n in cache.cross:
        torch.testing.assert_close(cache.cross[n], fresh.cross[n], rtol=0, atol=1e-12)


def test_unit_workers_respect_chained_units_and_the_memory_budget():
    """Units that share a tensor run one at a time; big units are fewer in flight."""
    from types import SimpleNamespace

    from glmc.matching.executors import UNITS_IN_FLIGHT_BYTES, unit_workers
    from glmc.symmetry.groups import PermutationGroup

    def prob(n: int, independent: bool = True):
        spaces = {f"mlp.{i}": PermutationGroup(n) for i in range(8)}
        return SimpleNamespace(independent=independent, units=list(spaces), groups=spaces)

    assert unit_workers(prob(3072), 2) == (2, 3)
    assert unit_workers(prob(3072, independent=False), 16) == (1, 1)
    big = int((UNITS_IN_FLIGHT_BYTES / 12 / 4) ** 0.5)  # four such costs fill the budget
    workers, depth = unit_workers(prob(big), 16)
    assert workers == 3 and depth * 12 * big * big <= UNITS_IN_FLIGHT_BYTES


def test_weight_matching_leaves_the_thread_count_of_new_threads_alone(h):
    """Its workers run single-threaded; threads started afterwards get the usual count."""
    import threading

    a, b = (h.make_tiny("gpt2", seed=s).canonical() for s in (1, 2))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        weight_matching(a, b, WeightMatchingOptions(max_iter=2))
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert seen == [2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("scheme", ["tensor", "layer", "none"])
def test_tensor_weights_count_each_tensor_by_its_mean(h, scheme):
    """"tensor": 1/entries, bias vectors times bias_weight; "layer": a bias counts as its
    layer's weight does; "none": 1. A bias weight of 0 or below is refused."""
    from glmc.matching.options import WeightMatchingOptions
    from glmc.matching.problem import tensor_weights

    a = h.make_tiny("gpt2", seed=1).canonical()
    w = tensor_weights(a.spec, a.state, scheme, bias_weight=0.3)
    for name in a.spec.axes:
        t = a.state[name]
        bias = name.endswith(".bias") and t.dim() == 1
        if scheme == "none":
            expected = 1.0
        elif scheme == "layer" and bias and name[:-4] + "weight" in a.state:
            expected = 1.0 / a.state[name[:-4] + "weight"].numel()
        else:
            expected = (0.3 if bias and scheme == "tensor" else 1.0) / t.numel()
        assert w[name] == pytest.approx(expected, rel=1e-12), name
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(GlmcError, match="bias weight"):
            WeightMatchingOptions(bias_weight=bad)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_role_weight_scales_the_tensors_of_that_role_alone(h, arch):
    """role_weights {"qk": 0.25}: the tensors of attention's query-key spaces (queries, keys
    and their biases; rotary ones too) weigh 0.25 times as much; every other tensor as
    before. A weight of 0 or below is refused, naming the role."""
    from glmc.matching.options import WeightMatchingOptions
    from glmc.matching.problem import tensor_weights

    a = h.make_tiny(arch, seed=1).canonical()
    plain = tensor_weights(a.spec, a.state, "tensor", bias_weight=0.3)
    w = tensor_weights(a.spec, a.state, "tensor", bias_weight=0.3, role_weights={"qk": 0.25})
    qk = {n for n in a.spec.axes if ".attn.q." in n or ".attn.k." in n}
    assert qk and all(n.endswith((".weight", ".bias")) for n in qk)
    for name in a.spec.axes:
        assert w[name] == plain[name] * (0.25 if name in qk else 1.0), name
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(GlmcError, match="qk weight"):
            WeightMatchingOptions(role_weights={"qk": bad})


# -- what makes it fast: the same numbers, computed with less ----------------------------------


def test_weighted_state_holds_only_what_the_steps_read_and_weighs_as_before(h):
    """A's weighted copies are kept except those of the tensors only the stream touches;
    B's are made on each read. Either way each equals √w·X with masked rows zeroed, in
    whole or by blocks of rows, and the norms are those of the weighted tensors."""
    from glmc.matching.problem import Problem

    a = h.make_tiny("gpt2", seed=1, tied=False, dtype=torch.float32).canonical()
    b = h.make_tiny("gpt2", seed=2, tied=False, dtype=torch.float32).canonical()
    mask = torch.arange(a.state["embed.tok"].shape[0]) % 3 != 0
    prob = Problem(a, b, WeightMatchingOptions(row_masks={"embed.tok": (0, mask)}))
    solo = {n for n in prob.spec.axes if prob.spec.spaces_of(n) == {"res"}}
    assert "embed.tok" in solo and "blocks.0.mlp.fc.weight" not in solo
    assert set(prob.A._held) == set(prob.spec.axes) - solo and not prob.B._held
    for name in prob.spec.axes:
        for model, side in ((a, prob.A), (b, prob.B)):
            x = model.state[name]
            if name == "embed.tok":
                x = x * mask[:, None].to(x.dtype)
            want = x * prob.w[name] ** 0.5
            assert torch.equal(side[name], want), name
            assert torch.equal(torch.cat(list(side.rows(name, 7))), want), name
            assert side.sq_norm(name, block=64) == pytest.approx(
                float(want.double().pow(2).sum()), rel=1e-12)
    prob.release(["embed.tok"])
    assert "embed.tok" not in prob.A and "embed.tok" not in prob.B


def test_solo_cross_by_rows_equals_the_column_chunks():
    """The embedding tables enter by blocks of rows weighed as they are read: bit for bit
    the chunks of columns of their weighted copies."""
    from types import SimpleNamespace

    from glmc.matching.problem import WeightedState
    from glmc.matching.residual import solo_cross

    g = torch.Generator().manual_seed(0)
    ta, tb = (torch.randn(5000, 24, generator=g) for _ in range(2))
    scale = 1e-2

    def weigh(name, t, rows):
        return t * scale

    spec = SimpleNamespace(occurrences=lambda s: [("tok", 1, "out")],
                           spaces={"res": SimpleNamespace(size=24)})
    prob = SimpleNamespace(spec=spec, A=WeightedState({"tok": ta}, ["tok"], weigh, set()),
                           B=WeightedState({"tok": tb}, ["tok"], weigh, set()),
                           device=torch.device("cpu"))
    want = torch.zeros(24, 24, dtype=F64)
    a, b = (ta * scale).T, (tb * scale).T
    for j in range(0, a.shape[1], 2048):
        want += (a[:, j:j + 2048] @ b[:, j:j + 2048].T).double()
    assert torch.equal(solo_cross(prob, "res", ["tok"]), want)


def test_angle_cost_by_blocks_equals_the_whole_matrix_formula():
    from glmc.matching.problem import angle_cost

    g = torch.Generator().manual_seed(0)
    c = torch.randn(300, 200, generator=g)
    na = torch.rand(300, generator=g, dtype=F64) * 10 + 10
    nb = torch.rand(200, generator=g, dtype=F64) * 10 + 10
    c[0, 0] = float(na[0] * nb[0])  # cos = 1: clamped at 0
    want = (c.double() / (na[:, None] * nb[None])).mul_(-2).add_(2).clamp_(min=0).sqrt_().neg_()
    assert torch.equal(angle_cost(c, na, nb, block=1000), want)


def test_workspace_buffers_are_kept_only_by_threads_that_enable_them():
    import threading

    from glmc.matching import workspace

    def fresh_twice() -> list[bool]:
        x = workspace.buffer("k", (3, 4), torch.float64)
        y = workspace.buffer("k", (3, 4), torch.float64)
        owned = workspace.owned(x.view(3, 4))
        z = workspace.buffer("k", (4, 4), torch.float64)
        return [x is y, owned, workspace.owned(z), x is z]

    out = {}

    def worker(name: str, enable: bool) -> None:
        if enable:
            workspace.enable()
        out[name] = fresh_twice()

    for name, enable in (("kept", True), ("plain", False)):
        t = threading.Thread(target=worker, args=(name, enable))
        t.start()
        t.join()
    assert out["kept"] == [True, True, True, False]  # (a new shape replaces the buffer)
    assert out["plain"] == [False, False, False, False]


def test_assignment_on_a_worker_buffer_negates_it_in_place_and_back():
    """The solver's input is the buffer negated in place; afterwards it holds the costs
    again, and the answer is the copying path's. NaN and ±inf are refused either way."""
    import threading

    from glmc.matching import workspace

    g = torch.Generator().manual_seed(0)
    m = torch.randn(40, 40, generator=g, dtype=F64)
    want = assignment(m)
    out = {}

    def worker() -> None:
        workspace.enable()
        buf = workspace.buffer("cost", (40, 40), F64)
        buf.copy_(m)
        out["perm"] = assignment(buf)
        out["kept"] = torch.equal(buf, m)
        errors = []
        for bad in (float("nan"), float("inf"), -float("inf")):
            buf.copy_(m)
            buf[3, 5] = bad
            try:
                assignment(buf)
            except ValueError:
                errors.append(bad)
        out["errors"] = len(errors)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert torch.equal(out["perm"], want) and out["kept"] and out["errors"] == 3
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="NaN or infinity"):
            assignment(torch.where(torch.eye(40, dtype=torch.bool), bad, m))


def test_weight_matching_with_and_without_kept_buffers_is_bit_identical(h, monkeypatch):
    """Reused buffers, shared residual steps and released memory change no number."""
    from glmc.matching import workspace

    a, b = (h.make_tiny("gpt2", n_layer=2, d=48, n_head=4, seed=s,
                        dtype=torch.float32).canonical() for s in (0, 3))
    runs = [weight_matching(a, b, WeightMatchingOptions(max_iter=4))]
    monkeypatch.setattr(workspace, "enable", lambda: None)
    monkeypatch.setattr(workspace, "release_freed", lambda: None)
    runs.append(weight_matching(a, b, WeightMatchingOptions(max_iter=4)))
    kept, plain = runs
    assert [r["distance"] for r in kept.trace] == [r["distance"] for r in plain.trace]
    for space, e in kept.transform.elements.items():
        x, y = e.tensors(), plain.transform.elements[space].tensors()
        assert all(torch.equal(x[k], y[k]) for k in x), space


@pytest.mark.parametrize("case", ["full-group", "full-group-fix-ones"])
def test_planted_recovery_from_activation_matchings_residual_map(h, arch, case):
    """Started from activation matching's residual map (what the methods do when they have
    data), weight matching still brings a planted B back onto A; a map that keeps the
    all-ones direction (a centred B) stays one that does."""
    from glmc.matching.activation import activation_matching
    from glmc.matching.problem import stream_space
    from glmc.verify import random_inputs

    tiny = h.make_tiny(arch, n_layer=2, d=32, n_head=4)
    a = tiny.canonical()
    b = plant(a, case)
    batches = [(random_inputs(a.config, n=32, seq=16, seed=5, dtype=a.dtype), None)]
    stream = stream_space(a.spec)
    start = activation_matching(a, b, batches).elements[stream]
    match = weight_matching(a, b, WeightMatchingOptions(init="activation", stream_start=start))
    aligned = b.transformed(match.transform, like=a)
    assert h.rel_weight_distance(a, aligned) < 1e-5
    if case == "full-group-fix-ones":
        res = match.transform.elements[stream].matrix(F64)
        ones = torch.ones(res.shape[0], dtype=F64)
        torch.testing.assert_close(res @ ones, ones)


def test_an_activation_start_without_its_map_is_one_clear_error():
    with pytest.raises(GlmcError, match="stream_start"):
        WeightMatchingOptions(init="activation")


def test_a_large_assignment_negates_a_float32_worker_buffer_in_place(monkeypatch, h):
    """Above LARGE_ASSIGNMENT lapx's float32 kernel reads the worker's float32 cost negated
    in place (no n x n copy: 485 MB at n = 11008); afterwards the buffer holds the costs
    again and the answer is scipy's."""
    import threading

    from scipy.optimize import linear_sum_assignment

    from glmc.matching import solvers, workspace

    h.require(solvers._LAP is not None, "lapx: pip install 'glmc[fast]'")
    monkeypatch.setattr(solvers, "LARGE_ASSIGNMENT", 16)
    g = torch.Generator().manual_seed(1)
    m = torch.randn(40, 40, generator=g, dtype=torch.float32)
    want = torch.from_numpy(linear_sum_assignment(m.numpy(), maximize=True)[1])
    seen, out = [], {}
    lapjvs = solvers._LAP.lapjvs

    def spy(cost, **kwargs):
        seen.append(cost)
        return lapjvs(cost, **kwargs)

    monkeypatch.setattr(solvers._LAP, "lapjvs", spy)

    def worker() -> None:
        workspace.enable()
        buf = workspace.buffer("cross", (40, 40), torch.float32)
        buf.copy_(m)
        out["perm"] = assignment(buf)
        out["shared"] = np.shares_memory(seen[-1], buf.numpy())
        out["kept"] = torch.equal(buf, m)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert torch.equal(out["perm"], want) and out["shared"] and out["kept"]
    assert torch.equal(assignment(m), want) and not np.shares_memory(seen[-1], m.numpy())
