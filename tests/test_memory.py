"""``glmc align`` hands the pair over to weight matching: the models' tensors are freed as the
matching stops reading them and B aligned is made from B's folder read again (part by part as
it is written: ``tests/test_moved.py``), with the same transform and the same written
weights, bit for bit, as aligning the models kept in memory (a pair stored in bfloat16 is
matched in bfloat16 when handed over: ``tests/test_held.py``).
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import glmc
import glmc.cli.align
from glmc.cli.main import main
from glmc.io.folders import folder_stamp, load_model
from glmc.io.moved import Moved
from glmc.matching.descent import Descent
from glmc.matching.problem import Problem
from glmc.matching.weight import WeightMatchingOptions, fixes_ones
from glmc.methods import AlignOptions

PAIRS = ("gpt2", "llama")


def save_pair(h, root: Path, arch: str, dtype: torch.dtype = torch.float32) -> tuple[Path, Path]:
    """A random pair of tiny ``arch`` models (Llama with grouped-query attention) saved as
    transformers saves them."""
    folders = []
    for seed in (0, 1):
        t = (h.make_tiny(arch, seed=seed, tied=False) if arch == "gpt2" else
             h.make_tiny(arch, seed=seed, n_layer=2, n_head=4, n_kv_head=2, d_mlp=40))
        t.stock.to(dtype).save_pretrained(str(root / f"m{seed}"))
        folders.append(root / f"m{seed}")
    return folders[0], folders[1]


def same_elements(x: glmc.api.Alignment, y: glmc.api.Alignment) -> None:
    ex, ey = x.transform.elements, y.transform.elements
    assert ex.keys() == ey.keys()
    for name in ex:
        tx, ty = ex[name].tensors(), ey[name].tensors()
        assert tx.keys() == ty.keys(), name
        for key in tx:
            assert tx[key].dtype == ty[key].dtype and torch.equal(tx[key], ty[key]), (name, key)


@pytest.mark.parametrize("arch", PAIRS)
@pytest.mark.parametrize("method", ["weight", "weight-perm"])
def test_a_handed_over_pair_aligns_as_one_kept_in_memory(h, tmp_path, arch, method):
    """Every element of the transform torch.equal, the same trace, B aligned the same tensor
    by tensor; the handed-over models are left empty. (A pair stored in bfloat16 is matched
    in it when handed over: ``tests/test_held.py``.)"""
    fa, fb = save_pair(h, tmp_path, arch)
    kept = glmc.align(load_model(fa), load_model(fb), method=method, max_iter=4)
    la, lb = load_model(fa), load_model(fb)
    over = glmc.align(la, lb, method=method, options=AlignOptions(max_iter=4, hand_over=True))
    assert over.aligned is None and not la.canonical.state and not lb.canonical.state
    same_elements(kept, over)
    strip = [{k: v for k, v in row.items() if "seconds" not in k} for row in kept.match.trace]
    assert [{k: v for k, v in row.items() if "seconds" not in k}
            for row in over.match.trace] == strip
    assert over.match.init_distance == kept.match.init_distance
    aligned = Moved(fb, over.b, over.transform, folder_stamp(fb)).whole()
    assert aligned.state.keys() == kept.aligned.state.keys()
    for name, t in kept.aligned.state.items():
        assert torch.equal(aligned.state[name], t), name
    assert aligned.files == kept.aligned.files


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_handed_over_tensors_are_freed_as_the_matching_stops_reading_them(h, tmp_path,
                                                                              dtype):
    """After the problem is made, A's own tensors that the steps read are gone (their weighted
    copies replace them; stored in bfloat16, the tensors themselves rounded to it, weighed
    when read: see ``tests/test_held.py``); after the start, B's and the tensors only the
    stream touches too."""
    fa, fb = save_pair(h, tmp_path, "llama", dtype=dtype)
    a, b = load_model(fa).canonical, load_model(fb).canonical
    opts = WeightMatchingOptions(hand_over=True, fix_ones=fixes_ones(a, b))
    kept = Problem(load_model(fa).canonical, load_model(fb).canonical, replace(opts,
                                                                              hand_over=False))
    raw = {n: t.clone() for n, t in a.state.items()}
    refs = {(who, n): weakref.ref(t) for who, m in (("a", a), ("b", b))
            for n, t in m.state.items()}
    prob = Problem(a, b, opts)
    solo = {n for n in prob.names if prob.spec.spaces_of(n) == {prob.stream}}
    steps = [n for n in prob.names if n not in solo]
    assert solo and all(refs["a", n]() is None for n in steps)
    assert all(refs["a", n]() is not None for n in solo)
    for n in steps:
        want = (kept.A[n] if dtype == torch.float32 else
                kept.A._weigh(n, raw[n].to(dtype).float(), None))
        assert torch.equal(prob.A[n], want) and prob.A[n].dtype == torch.float32, n
        if n in prob.A._packed:  # (a placeholder: the values are kept in bfloat16)
            assert a.state[n].device.type == "meta" and a.state[n].dtype == torch.float32
            assert prob.A._packed[n][0].dtype == torch.bfloat16
        else:
            assert a.state[n] is prob.A[n]
    assert set(prob.A._packed) == (set(steps) if dtype == torch.bfloat16 else set())
    if dtype == torch.float32:
        assert prob.sq_a == kept.sq_a and prob.sq_b == kept.sq_b
    descent = Descent.start(prob, torch.float32)
    assert all(r() is None for r in refs.values())
    assert set(a.state) == set(steps) and not b.state
    if dtype == torch.float32:
        assert descent.init_distance == Descent.start(kept, torch.float32).init_distance


@pytest.mark.parametrize("arch", PAIRS)
def test_align_writes_the_same_folder_handed_over(h, tmp_path, arch, monkeypatch):
    """``glmc align`` (handed over) and the same command with the models kept in memory
    write the same weights and the same transform, in the stored dtype. (A bfloat16 pair,
    matched in bfloat16 when handed over: ``tests/test_held.py``.)"""
    fa, fb = save_pair(h, tmp_path, arch)
    calls = []
    made = Moved.write_stock
    monkeypatch.setattr(Moved, "write_stock",
                        lambda self, *args: calls.append(self.folder) or made(self, *args))
    assert main(["align", str(fa), str(fb), "-o", str(tmp_path / "over"), "--iters", "3",
                 "--json"]) == 0
    assert calls == [fb]  # (B read again, part by part: it was handed over)
    monkeypatch.setattr(glmc.cli.align, "hands_over", lambda args: False)
    assert main(["align", str(fa), str(fb), "-o", str(tmp_path / "kept"), "--iters", "3",
                 "--json"]) == 0
    assert calls == [fb]
    for name in ("model.safetensors", "transform.safetensors"):
        over, kept = (load_file(str(tmp_path / d / name)) for d in ("over", "kept"))
        assert over.keys() == kept.keys()
        for k, t in kept.items():
            assert over[k].dtype == t.dtype and torch.equal(over[k], t), (name, k)
    assert {t.dtype for t in load_file(str(tmp_path / "over" / "model.safetensors")).values()} \
        == {torch.float32}


def test_a_finished_matching_is_freed_without_the_garbage_collector(h, monkeypatch):
    """Weight matching's problem (both models' weighted copies) is freed as soon as the
    matching returns, not when the cyclic garbage collector next runs: MergeMany's rounds
    and the N-model frames run one matching after another, and each left a model's worth
    behind (3 GPT-2s of 29.2M: 3.86 GB peak, 2.16 without the cycle)."""
    import gc

    made: list[weakref.ref] = []
    init = Problem.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(Problem, "__init__", recorded)
    a, b = (h.make_tiny("gpt2", seed=s, dtype=torch.float32).canonical() for s in (0, 1))
    enabled = gc.isenabled()
    gc.disable()
    try:
        glmc.matching.weight.weight_matching(a, b, WeightMatchingOptions(max_iter=2))
        assert made and all(ref() is None for ref in made)
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_a_head_step_frees_its_pairs_statistics_before_the_tensors_are_moved(h, arch,
                                                                              monkeypatch):
    """A head unit's step weighs every (A head, B head) pair: their cross-correlations and
    maps, n x n blocks of k x k in float64 (at Llama-2-7B's widths 0.8 GB a layer, the peak
    of a streamed 7B slice). Only the chosen pairs' elements outlive the assignment: when the
    step reads and moves its tensors (``Problem.terms``, before and after), its HeadCosts is
    gone (with the garbage collector off, so by reference counts alone)."""
    import gc
    import threading

    from glmc.matching import heads

    mine = threading.local()  # (units run on several threads: each checks its own)
    checked = []
    costs, terms = heads.head_costs, Problem.terms

    def recorded(*args, **kwargs):
        out = costs(*args, **kwargs)
        mine.costs = weakref.ref(out)
        return out

    def checking(self, *args, **kwargs):
        ref = getattr(mine, "costs", None)
        if ref is not None:
            checked.append(ref() is None)
        return terms(self, *args, **kwargs)

    monkeypatch.setattr(heads, "head_costs", recorded)
    monkeypatch.setattr(Problem, "terms", checking)
    kw = dict(n_layer=2, n_head=4, n_kv_head=2) if arch == "llama" else {}
    a, b = (h.make_tiny(arch, seed=s, dtype=torch.float32, **kw).canonical() for s in (0, 1))
    enabled = gc.isenabled()
    gc.disable()
    try:
        glmc.matching.weight.weight_matching(a, b, WeightMatchingOptions(max_iter=2))
    finally:
        if enabled:
            gc.enable()
    assert checked and all(checked), checked


@pytest.mark.parametrize("arch", ["gpt2", "vit", "llama", "qwen2", "gpt_neox", "bert"])
def test_loading_holds_the_canonical_form_and_a_layer_of_stored_tensors(h, tmp_path, arch,
                                                                       monkeypatch):
    """A folder's stored tensors are read as its importer needs them: those read and dropped
    (not kept as canonical tensors themselves) are never held together much beyond one
    layer's worth, so that loading costs the canonical form plus about one layer. (Measured
    on 4 layers: 6-10% of the stored bytes; a state read whole first is 100%.)"""
    import gc

    from glmc.io import folders

    clock, reads = [0], []
    read = folders.StoredState.read

    def counted(self, key, dtype=None):
        t = read(self, key, dtype)
        clock[0] += 1
        record = [clock[0], None, t.numel() * t.element_size()]  # read, dropped, bytes
        reads.append(record)
        weakref.finalize(t, lambda: record.__setitem__(1, clock[0]))
        return t

    monkeypatch.setattr(folders.StoredState, "read", counted)
    tiny = h.make_tiny(arch, seed=0, n_layer=4, **({"tied": False} if arch == "gpt2" else {}))
    tiny.stock.to(torch.float32).save_pretrained(str(tmp_path))
    model = load_model(tmp_path)
    gc.collect()
    dropped = [r for r in reads if r[1] is not None]
    held = max(sum(b for t0, t1, b in dropped if t0 <= now <= t1)
               for now in range(1, clock[0] + 1))
    assert held <= 0.2 * sum(r[2] for r in reads), (held, sum(r[2] for r in reads))
    assert len(model.canonical.state) > 0
