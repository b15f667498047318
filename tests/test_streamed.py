"""A model streamed from its folder (``load_model``'s ``stream``, :mod:`glmc.io.streamed`):
none of its tensors held, each made when read, bit for bit the tensor loading in bfloat16
holds; weight matching of a bfloat16 pair with A streamed keeps no copy of A and finds the
same transform and trace, bit for bit, as with A held. The residual cache kept in files
(``spill``, :mod:`glmc.matching.spilled`; what ``glmc align`` does when it streams) gives the
same transform too, and leaves no file behind.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_held import BF16, pair, save_llama, started
from test_memory import same_elements

import glmc
import glmc.io.folders
import glmc.io.outputs
from glmc.cli.main import main
from glmc.io.folders import load_model
from glmc.io.streamed import StreamedState
from glmc.matching import spilled
from glmc.matching.spilled import SpilledTensors
from glmc.methods import AlignOptions


def test_a_streamed_model_reads_each_tensor_as_loading_in_bfloat16_holds_it(h, tmp_path):
    """Every canonical tensor read from the streamed state is the held one, bit for bit, a
    fresh copy at each read; nothing is read to open it; names can be forgotten (and are then
    gone), never set."""
    fa = save_llama(h, tmp_path / "a", 0)
    held = load_model(fa, half=True).canonical
    streamed = load_model(fa, half=True, stream=True).canonical
    state = streamed.state
    assert isinstance(state, StreamedState) and list(state) == list(held.state)
    assert all(m.is_meta and m.shape == held.state[n].shape and m.dtype == BF16
               for n, m in state.meta.items())
    for n, t in held.state.items():
        assert torch.equal(state[n], t) and state[n].dtype == t.dtype, n
    name = next(iter(state))
    assert state[name] is not state[name]
    with pytest.raises(TypeError):
        state[name] = held.state[name]
    del state[name]
    assert name not in state and len(state) == len(held.state) - 1
    with pytest.raises(KeyError):
        state[name]  # noqa: B018
    state.clear()
    assert not state


def test_a_float32_folder_is_not_streamed(h, tmp_path):
    """Streaming is for a model held in bfloat16: a float32 folder loads as without it."""
    f32 = save_llama(h, tmp_path / "f32", 0, torch.float32)
    assert isinstance(load_model(f32, half=True, stream=True).canonical.state, dict)


def test_weight_matching_with_a_streamed_gives_the_held_transform(h, tmp_path, monkeypatch):
    """A bfloat16 pair handed over, A streamed: no weighted copy of A is kept (every step
    reads A from its files) and the transform and the trace, bit for bit, are those of A
    held."""
    fa, fb = pair(h, tmp_path)
    options = AlignOptions(max_iter=4, hand_over=True)
    held = glmc.align(load_model(fa, half=True), load_model(fb, half=True), options=options)
    descents = started(monkeypatch)
    streamed = glmc.align(load_model(fa, half=True, stream=True), load_model(fb, half=True),
                          options=options)
    (d,) = descents
    assert not d.prob.A._held and not d.prob.A._packed
    same_elements(held, streamed)
    strip = [{k: v for k, v in row.items() if "seconds" not in k} for row in held.match.trace]
    assert [{k: v for k, v in row.items() if "seconds" not in k}
            for row in streamed.match.trace] == strip
    assert held.match.scale == streamed.match.scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_spilled_tensors_come_back_bit_for_bit_and_leave_nothing_behind(tmp_path, dtype):
    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(s, generator=g).to(dtype) for s in ((5, 7), (3,), (4, 4)))
    m = SpilledTensors(tmp_path)
    m["x"], m["y"] = x, y
    m["x"] = z  # (rewritten in place: the name keeps its file)
    del m["y"]
    m["w"] = x.T  # (not contiguous)
    assert list(m) == ["x", "w"] and len(m) == 2 and "y" not in m
    assert m["x"].dtype == dtype and torch.equal(m["x"], z) and torch.equal(m["w"], x.T)
    assert m["x"].data_ptr() != m["x"].data_ptr()  # (read afresh each time: none held)
    assert len(list(m.folder.glob("*.bin"))) == 2
    m.close()
    assert list(tmp_path.iterdir()) == [] and len(m) == 0


def test_weight_matching_with_its_cache_in_files_gives_the_same_transform(h, tmp_path,
                                                                          monkeypatch):
    """The residual cache spilled to files (A streamed, as ``glmc align`` runs it): the
    transform and the trace of the cache in memory, bit for bit; its files are removed when
    the matching ends."""
    fa, fb = pair(h, tmp_path)
    options = AlignOptions(max_iter=4, hand_over=True)
    kept = glmc.align(load_model(fa, half=True, stream=True), load_model(fb, half=True),
                      options=options)
    made: list[SpilledTensors] = []
    spill = tmp_path / "spill"
    spill.mkdir()

    class Spy(SpilledTensors):
        def __init__(self, root):
            super().__init__(root)
            made.append(self)

    monkeypatch.setattr("glmc.matching.residual.SpilledTensors", Spy)
    spilt = glmc.align(load_model(fa, half=True, stream=True), load_model(fb, half=True),
                       options=AlignOptions(max_iter=4, hand_over=True, spill=str(spill)))
    assert len(made) == 1 and made[0].folder.parent == spill
    same_elements(kept, spilt)
    strip = [{k: v for k, v in row.items() if "seconds" not in k} for row in kept.match.trace]
    assert [{k: v for k, v in row.items() if "seconds" not in k}
            for row in spilt.match.trace] == strip
    assert list(spill.iterdir()) == []


def report_of(folder) -> dict:
    return json.loads((folder / "glmc_report.json").read_text())


def test_align_streams_a_where_the_pair_held_would_not_fit(h, tmp_path, monkeypatch):
    """``glmc align`` of a bfloat16 pair: held where it fits; where only B and the working
    set fit, A is streamed (``--stream auto``), with the same transform, bit for bit, and a
    certified output; where even that does not fit, refused before loading, in one line
    naming the streamed mode (exit 2); ``--stream always`` streams wherever it fits, and is
    refused where it cannot apply."""
    fa, fb = pair(h, tmp_path)
    held_need = sum(glmc.io.outputs.pair_memory(fa, fb, half=True))
    stream_need = sum(glmc.io.outputs.pair_memory(fa, fb, half=True, stream=True))
    n = glmc.io.outputs.stored_params(fa)
    out = glmc.io.outputs  # (A's bfloat16 copy, and the working set's share it no longer has)
    assert held_need - stream_need == 2 * n + int(4 * n * out.HALF_MATCHING_COPIES) - int(
        4 * n * out.STREAMED_MATCHING_COPIES)
    loads: list[bool] = []
    load = glmc.io.folders.load_model

    def spy(*args, **kwargs):
        m = load(*args, **kwargs)
        loads.append(isinstance(m.canonical.state, StreamedState))
        return m

    monkeypatch.setattr(glmc.io.folders, "load_model", spy)
    run = ["align", str(fa), str(fb), "--iters", "2", "--json"]
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: held_need)
    assert main([*run, "-o", str(tmp_path / "held")]) == 0
    assert loads[:2] == [False, False]
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: held_need - 1)
    loads.clear()
    spills: list[str] = []
    spill = spilled.SpilledTensors.__init__

    def spy_spill(self, root):
        spills.append(str(root))
        spill(self, root)

    monkeypatch.setattr(spilled.SpilledTensors, "__init__", spy_spill)
    assert main([*run, "-o", str(tmp_path / "streamed")]) == 0
    assert loads[:2] == [True, False]
    assert spills == [str(tmp_path.resolve())]  # (the cache in files beside OUT, then gone)
    assert not list(tmp_path.glob(".glmc-spill-*"))
    held, streamed = (report_of(tmp_path / k) for k in ("held", "streamed"))
    assert held["certificate"]["equal"] and streamed["certificate"]["equal"]
    tx, ty = (load_file(str(tmp_path / k / "transform.safetensors"))
              for k in ("held", "streamed"))
    assert tx.keys() == ty.keys() and all(torch.equal(tx[k], ty[k]) for k in tx)
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: stream_need - 1)
    with pytest.raises(glmc.GlmcError, match=r"in bfloat16 \(B alone: A streamed from its "
                       r"files\) plus .* of working set"):
        glmc.io.outputs.check_pair_memory(fa, fb, half=True, stream=None)
    assert main([*run, "-o", str(tmp_path / "refused")]) == 2
    assert not (tmp_path / "refused").exists()
    monkeypatch.setattr(glmc.io.outputs, "available_memory", lambda: held_need)
    loads.clear()
    assert main([*run, "-o", str(tmp_path / "always"), "--stream", "always"]) == 0
    assert loads[:2] == [True, False]
    assert main([*run, "-o", str(tmp_path / "data"), "--stream", "always",
                 "--align", "learned", "--data", "shakespeare"]) == 2
