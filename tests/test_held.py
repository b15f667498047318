"""A bfloat16 pair handed over to weight matching (what ``glmc align`` does) is loaded and
matched in bfloat16 (:mod:`glmc.matching.held`): A's copies and B moved held at half the
bytes of float32 ones, the same transform whether the models were loaded in bfloat16 or in
float32, a planted permutation still recovered exactly, and the output, made from B's
files, stored in bfloat16 and certified equal. (A float32 pair is matched as before, bit for
bit: ``tests/test_memory.py``.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from test_matching import PLANTED
from test_memory import same_elements

import glmc
import glmc.io.folders
import glmc.io.outputs
from glmc.cli.main import main
from glmc.io.folders import folder_stamp, load_model, write_model
from glmc.io.moved import Moved
from glmc.matching.descent import Descent, same_element
from glmc.matching.held import HeldState
from glmc.matching.problem import Problem
from glmc.matching.weight import WeightMatchingOptions, fixes_ones
from glmc.methods import AlignOptions
from glmc.symmetry.elements import Permutation
from glmc.symmetry.transform import Transform
from glmc.verify import canonical_logits, folder_logits, random_inputs

BF16 = torch.bfloat16


def save_llama(h, folder: Path, seed: int, dtype: torch.dtype = BF16, arch: str = "llama",
               **save_kw) -> Path:
    """A random tiny Llama (from its config: grouped-query heads, non-trivial RMSNorm
    gains; or a GPT-2, untied) saved in ``dtype`` as transformers saves it."""
    t = (h.make_tiny("llama", seed=seed, n_layer=2, n_head=4, n_kv_head=2, d_mlp=40,
                     dtype=torch.float32) if arch == "llama" else
         h.make_tiny(arch, seed=seed, tied=False, dtype=torch.float32))
    t.stock.to(dtype).save_pretrained(str(folder), **save_kw)
    return folder


def pair(h, root: Path, dtype: torch.dtype = BF16, **save_kw) -> tuple[Path, Path]:
    return (save_llama(h, root / "a", 0, dtype, **save_kw),
            save_llama(h, root / "b", 1, dtype, **save_kw))


def started(monkeypatch) -> list[Descent]:
    """The descents weight matching starts from, as they are at its end."""
    made: list[Descent] = []
    start = Descent.start.__func__  # type: ignore[attr-defined]

    def spy(cls, prob, dtype):
        made.append(start(cls, prob, dtype))
        return made[-1]

    monkeypatch.setattr(Descent, "start", classmethod(spy))
    return made


def held_bytes(d: Descent) -> int:
    """The bytes of A's kept copies, of B moved and of the residual cache's
    cross-correlations."""
    a = [t for t, _ in d.prob.A._packed.values()] + list(d.prob.A._held.values())
    b = d.bt_all._data.values() if isinstance(d.bt_all, HeldState) else d.bt_all.values()
    return sum(t.numel() * t.element_size() for t in [*a, *b, *d.cache.cross.values()])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_align_of_a_bfloat16_pair_matches_in_it_and_writes_it_certified(h, tmp_path,
                                                                        monkeypatch, arch):
    """``glmc align`` of two sharded bfloat16 checkpoints: the models are loaded in
    bfloat16, the matching holds A's copies and B moved in it, and OUT (B's files moved) is
    bfloat16, certified equal to B, and loads with transformers computing B's function. (A
    GPT-2's writers, centred, are still centred once rounded: its residual map fixes the
    all-ones direction, and OUT is the stock class.)"""
    from transformers import AutoModelForCausalLM

    fa, fb = (save_llama(h, tmp_path / n, seed, arch=arch, max_shard_size="10KB")
              for n, seed in (("a", 0), ("b", 1)))
    assert len(list(fb.glob("model-*-of-*.safetensors"))) > 2
    loaded = []
    load = glmc.io.folders.load_model

    def spy(*args, **kwargs):
        m = load(*args, **kwargs)
        loaded.append({t.dtype for t in m.canonical.state.values()})
        return m

    monkeypatch.setattr(glmc.io.folders, "load_model", spy)
    descents = started(monkeypatch)
    out = tmp_path / "out"
    assert main(["align", str(fa), str(fb), "-o", str(out), "--iters", "3", "--json"]) == 0
    assert loaded == [{BF16}, {BF16}]
    (d,) = descents
    assert d.prob.half == BF16 and d.prob.dtype == torch.float32
    assert not d.prob.A._held and {t.dtype for t, _ in d.prob.A._packed.values()} == {BF16}
    assert isinstance(d.bt_all, HeldState) and {t.dtype for t in d.bt_all._data.values()} \
        == {BF16}
    assert {t.dtype for t in d.cache.cross.values()} == {torch.float32}
    assert all(e.tensors()[k].dtype in (torch.float32, torch.int64)
               for e in d.el.values() for k in e.tensors())
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}  # noqa: SIM118
    report = json.loads((out / "glmc_report.json").read_text())
    assert report["certificate"]["equal"] and report["certificate"]["stored_dtype"] == "bfloat16"
    assert report["format"] == "hf"
    if arch == "gpt2":
        assert d.prob.opts.fix_ones
        ones = torch.ones(d.el["res"].size, dtype=torch.float64)
        torch.testing.assert_close(d.el["res"].matrix() @ ones, ones)
    aligned = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert next(aligned.parameters()).dtype == BF16
    x = random_inputs(load(fb).canonical.config)
    with torch.no_grad():
        got = aligned.double()(input_ids=x, use_cache=False).logits
    assert h.rel_diff(folder_logits(load(fb))(x), got) < 4e-2


def test_a_bfloat16_pair_is_held_in_half_the_bytes_of_a_float32_one(h, tmp_path):
    """The same pair stored in float32 and in bfloat16, handed over: loaded (``half``) and
    held by the matching (A's copies, B moved, the residual cache) in exactly half the bytes,
    every model tensor freed as before; the float32 pair's copies stay float32 (and its
    cache float64)."""
    held = {}
    for dtype in (torch.float32, BF16):
        fa, fb = pair(h, tmp_path / str(dtype), dtype)
        a, b = (load_model(f, half=True).canonical for f in (fa, fb))
        loaded = sum(t.numel() * t.element_size() for m in (a, b) for t in m.state.values())
        prob = Problem(a, b, WeightMatchingOptions(hand_over=True, fix_ones=fixes_ones(a, b)))
        assert all(t.is_meta for n, t in a.state.items() if n in prob.A._packed)
        d = Descent.start(prob, prob.dtype)
        assert not b.state and isinstance(d.bt_all, HeldState) == (dtype == BF16)
        held[dtype] = loaded, held_bytes(d)
        copies = [t for t, _ in prob.A._packed.values()] + list(prob.A._held.values())
        assert {t.dtype for t in copies} == {dtype} and d.cache.cross
        assert {t.dtype for t in d.cache.cross.values()} == {
            torch.float64 if dtype == torch.float32 else torch.float32}
    assert held[BF16][0] * 2 == held[torch.float32][0]
    assert held[BF16][1] * 2 == held[torch.float32][1] > 0


def test_loading_in_bfloat16_rounds_the_canonical_tensors_part_by_part(h, tmp_path,
                                                                       monkeypatch):
    """``load_model(half=True)``: each canonical tensor of a bfloat16 folder is the float32
    one rounded, bit for bit, made a few at a time; a float32 folder loads as without it."""
    runs = []
    canonical_of = glmc.io.folders.canonical_of

    def spy(m, only=None):
        runs.append(only)
        return canonical_of(m, only)

    fa = save_llama(h, tmp_path / "a", 0)
    whole = load_model(fa).canonical
    monkeypatch.setattr(glmc.io.folders, "PART_BYTES", 4 * 2000)
    monkeypatch.setattr(glmc.io.folders, "canonical_of", spy)
    half = load_model(fa, half=True).canonical
    made = [r for r in runs if r]
    assert len(made) > 3 and sorted(n for r in made for n in r) == sorted(whole.state)
    assert half.state.keys() == whole.state.keys() and half.config == whole.config
    for n, t in whole.state.items():
        assert half.state[n].dtype == BF16 and torch.equal(half.state[n], t.to(BF16)), n
    f32 = save_llama(h, tmp_path / "f32", 0, torch.float32)
    kept, loaded = load_model(f32).canonical, load_model(f32, half=True).canonical
    assert all(torch.equal(loaded.state[n], t) and loaded.state[n].dtype == torch.float32
               for n, t in kept.state.items())


def test_the_rounding_is_the_matchings_not_the_loads(h, tmp_path):
    """A bfloat16 pair handed over gives the same transform and trace, bit for bit, loaded
    in float32 (the API's ``load_model``; torchrun's ranks) or in bfloat16 (``glmc
    align``); kept in memory, it is matched in float32 as before, which the rounding moves
    only slightly."""
    fa, fb = pair(h, tmp_path)
    options = AlignOptions(max_iter=4, hand_over=True)
    wide = glmc.align(load_model(fa), load_model(fb), options=options)
    half = glmc.align(load_model(fa, half=True), load_model(fb, half=True), options=options)
    same_elements(wide, half)
    strip = [{k: v for k, v in row.items() if "seconds" not in k} for row in wide.match.trace]
    assert [{k: v for k, v in row.items() if "seconds" not in k}
            for row in half.match.trace] == strip
    kept = glmc.align(load_model(fa), load_model(fb), max_iter=4)
    assert abs(kept.match.relative - half.match.relative) < 1e-2 * kept.match.relative


@pytest.mark.parametrize("case", ["permutation-only", "mlp-permutations"])
def test_a_planted_permutation_of_a_bfloat16_model_is_recovered(h, tmp_path, case):
    """B = g·A written back in bfloat16, g a permutation (B as matched is then g applied to
    A as matched, both rounded: exact). ``glmc align`` finds every permutation of g's
    inverse exactly and its residual map to 1e-3; B moved from its files (in float32) lands
    on A as matched closer than A's own rounding to bfloat16 (B moved is held rounded: its
    orthogonal maps on the way leave a trace), and its midpoint with A computes A's function
    where the plain midpoint does not."""
    fa = save_llama(h, tmp_path / "a", 0)
    a = load_model(fa).canonical
    roles, subgroups = PLANTED[case]
    g = Transform.random(a.spec, torch.Generator().manual_seed(1), subgroups=subgroups)
    g = Transform({k: e for k, e in g.elements.items() if a.spec.roles[k] in roles})
    b = a.transformed(g)
    (tmp_path / "b").mkdir()
    assert write_model(tmp_path / "b", b) == "hf"
    out = tmp_path / "out"
    assert main(["align", str(fa), str(tmp_path / "b"), "-o", str(out), "--json"]) == 0
    report = json.loads((out / "glmc_report.json").read_text())
    assert report["certificate"]["equal"] and abs(report["matching"]["relative"]) < 1e-4
    found = Transform.load(out / "transform.safetensors").elements
    perms = [s for s in g.elements if isinstance(found[s], Permutation)]
    assert len(perms) >= 2 and "mlp.0" in perms
    for space in perms:
        assert same_element(found[space], g.elements[space].inverse()), space
    if "res" in g.elements:
        torch.testing.assert_close(found["res"].matrix(), g.elements["res"].inverse().matrix(),
                                   atol=1e-3, rtol=0)
    like = load_model(tmp_path / "b", only=()).canonical
    aligned = Moved(tmp_path / "b", like, Transform(found),
                    folder_stamp(tmp_path / "b")).whole()
    rounded = a.with_state({n: t.to(BF16).float() for n, t in a.state.items()})
    assert h.rel_weight_distance(rounded, aligned) < h.rel_weight_distance(a, rounded) / 4
    assert h.rel_weight_distance(a, load_model(tmp_path / "b").canonical) > 1e-1
    x = random_inputs(a.config)
    ref = canonical_logits(rounded)(x)
    mid = rounded.with_state({n: (t + aligned.state[n]) / 2 for n, t in rounded.state.items()})
    plain = rounded.with_state({n: (t + b.state[n]) / 2 for n, t in rounded.state.items()})
    assert h.rel_diff(ref, canonical_logits(mid)(x)) < 1e-3
    assert h.rel_diff(ref, canonical_logits(plain)(x)) > 1e-2


def test_the_memory_check_counts_a_bfloat16_pair_in_bfloat16(h, tmp_path, monkeypatch):
    """``glmc align`` of a bfloat16 pair is estimated with the models in bfloat16 and the
    working set of their matching held in it: a machine with that much memory runs it,
    while a merge (the models kept in float32) is refused there, in one line; a float32 pair
    is estimated as before."""
    fa, fb = pair(h, tmp_path / "bf16")
    ga, gb = pair(h, tmp_path / "f32", torch.float32)
    n = glmc.io.outputs.stored_params(fb)
    pair_f32, _ = glmc.io.outputs.pair_memory(fa, fb)
    pair_half, working = glmc.io.outputs.pair_memory(fa, fb, half=True)
    assert pair_f32 == 2 * 4 * n and pair_half == 2 * 2 * n
    assert working - glmc.io.outputs.pair_memory(fa, fb)[1] == int(
        4 * n * glmc.io.outputs.HALF_MATCHING_COPIES) - int(
        4 * n * glmc.io.outputs.MATCHING_COPIES)
    assert glmc.io.outputs.pair_memory(ga, gb, half=True) == glmc.io.outputs.pair_memory(ga, gb)
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: pair_half + working)
    assert main(["align", str(fa), str(fb), "-o", str(tmp_path / "out"), "--iters", "1",
                 "--json"]) == 0
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: pair_half + working - 1)
    with pytest.raises(glmc.GlmcError, match=r"need about .* in bfloat16 plus .* of working"):
        glmc.io.outputs.check_pair_memory(fa, fb, half=True)
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: pair_half + working)
    assert main(["merge", str(fa), str(fb), "-o", str(tmp_path / "merged")]) == 2


@pytest.mark.parametrize(("options", "half"), [
    ([], True), (["--align", "weight-perm"], True), (["--data", "shakespeare"], False),
    (["--align", "learned", "--data", "shakespeare"], False), (["--heads", "circuit"], False),
])
def test_align_loads_in_bfloat16_only_what_weight_matching_alone_reads(options, half):
    """Handed over without data (weight matching alone reads the models); with data,
    activation matching's start reads them as models first, and other methods keep them."""
    from glmc.cli.align import holds_half
    from glmc.cli.main import build_parser

    args = build_parser().parse_args(["align", "a", "b", "-o", "out", *options])
    assert holds_half(args) is half
