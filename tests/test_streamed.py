"""A model streamed from its folder (``load_model``'s ``stream``, :mod:`glmc.io.streamed`):
none of its tensors held, each made when read, bit for bit the tensor loading in bfloat16
holds; weight matching of a bfloat16 pair with A streamed keeps no copy of A and finds the
same transform and trace, bit for bit, as with A held.
"""

from __future__ import annotations

import pytest
import torch
from test_held import BF16, pair, save_llama, started
from test_memory import same_elements

import glmc
from glmc.io.folders import load_model
from glmc.io.streamed import StreamedState
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
