"""A narrower model embedded exactly into a wider one's shapes (residual width, heads, head
dimension, MLP width), then aligned with an orthogonal residual map and merged at the wider
width (glmc.families.transformer.widen)."""

from __future__ import annotations

import pytest
import torch
from conftest import images, random_model
from hypothesis import given, settings
from hypothesis import strategies as st

from glmc.errors import GlmcError
from glmc.families.transformer.widen import embed_into
from glmc.matching.weight import weight_matching
from glmc.symmetry.transform import Transform

F64 = torch.float64
WIDE = {"gpt2": dict(d=32, n_head=4, n_inner=64), "vit": dict(d=32, n_head=4, d_mlp=64),
        "llama": dict(d=32, n_head=4, n_kv_head=2, d_mlp=48)}
NARROW = {"gpt2": dict(d=16, n_head=2, n_inner=40), "vit": dict(d=16, n_head=4, d_mlp=24),
          "llama": dict(d=16, n_head=2, n_kv_head=1, d_mlp=24)}


@pytest.mark.parametrize("arch", list(WIDE))
def test_the_embedding_computes_the_narrow_models_function(h, arch):
    a = h.make_tiny(arch, seed=0, **WIDE[arch]).canonical()
    t = h.make_tiny(arch, seed=1, **NARROW[arch])
    wide = embed_into(t.canonical(), a.config)
    assert {k: v.shape for k, v in wide.state.items()} == {k: v.shape for k, v in a.state.items()}
    x = t.inputs()
    # (HF's RMSNorm runs in float32 even on float64 inputs: Llama's stock logits agree with
    # float64 arithmetic to about 1e-7)
    tol = 1e-5 if arch == "llama" else 1e-12
    assert h.rel_diff(t.logits(x), h.canonical_output(wide, x)) < tol
    if arch == "gpt2":  # (a centred stream stays centred: written back as A's stock class)
        assert wide.uncentred_writer() is None


@settings(max_examples=6, deadline=None)
@given(arch=st.sampled_from(list(WIDE)), seed=st.integers(0, 2**16))
def test_the_free_entries_are_not_read(h, arch, seed):
    """Whatever the entries the embedding marks free hold, B's function is unchanged, and
    they are every padded entry but the writers' and the keys' (float64, 1e-12)."""
    a = h.make_tiny(arch, seed=0, **WIDE[arch]).canonical()
    t = h.make_tiny(arch, seed=1, **NARROW[arch])
    wide = embed_into(t.canonical(), a.config)
    g = torch.Generator().manual_seed(seed)
    noisy = {k: torch.where(wide.free[k], torch.randn(v.shape, generator=g, dtype=F64), v)
             if k in wide.free else v for k, v in wide.state.items()}
    x = t.inputs()
    tol = 1e-5 if arch == "llama" else 1e-12
    assert h.rel_diff(t.logits(x), h.canonical_output(wide.with_state(noisy), x)) < tol
    for name in ("blocks.0.attn.q.weight", "blocks.0.attn.v.weight", "blocks.0.mlp.fc.weight"
                 if arch != "llama" else "blocks.0.mlp.gate.weight", "head.weight"):
        assert bool(wide.free[name].any()) and not bool(wide.state[name][wide.free[name]].any())
    assert not any(k.endswith((".o.weight", ".proj.weight")) or k.startswith("embed.")
                   for k in wide.free)


@settings(max_examples=6, deadline=None)
@given(arch=st.sampled_from(list(WIDE)), seed=st.integers(0, 2**16))
def test_aligned_to_a_the_free_entries_take_as_values(h, arch, seed):
    """B embedded, moved by a random element of its group with A as ``like``: its free
    entries, brought back, are A's brought back; the function is B's (float64)."""
    a = h.make_tiny(arch, seed=0, **WIDE[arch]).canonical()
    t = h.make_tiny(arch, seed=1, **NARROW[arch])
    b = embed_into(t.canonical(), a.config)
    sub = {"residual": "fix_ones"} if arch == "gpt2" else {}
    tr = Transform.random(b.spec, torch.Generator().manual_seed(seed), subgroups=sub)
    moved = b.transformed(tr, like=a)
    back, a_back = (m.transformed(tr.inverse(b.spec)).state for m in (moved, a))
    for name, mask in b.free.items():
        assert torch.allclose(back[name][mask], a_back[name][mask], atol=1e-10)
        assert torch.allclose(back[name][~mask], b.state[name][~mask], atol=1e-10)
    x = t.inputs()
    tol = 1e-5 if arch == "llama" else 1e-10
    assert h.rel_diff(t.logits(x), h.canonical_output(moved, x)) < tol


def test_a_narrow_model_projected_from_a_wide_one_is_recovered(h):
    """B is A's function restricted to a random d_B-dimensional subspace of its stream... as
    a planted pair: B embedded, moved by a random orthogonal map, comes back onto itself."""
    a = h.make_tiny("gpt2", seed=0, **WIDE["gpt2"]).canonical()
    b = embed_into(h.make_tiny("gpt2", seed=1, **NARROW["gpt2"]).canonical(), a.config)
    moved = b.transformed(Transform.random(b.spec, torch.Generator().manual_seed(3),
                                           subgroups={"residual": "fix_ones"}))
    back = moved.transformed(weight_matching(b, moved).transform)
    num = sum(float((back.state[k] - b.state[k]).pow(2).sum()) for k in b.state)
    assert (num / sum(float(b.state[k].pow(2).sum()) for k in b.state)) ** 0.5 < 1e-6


def test_align_and_merge_a_narrower_model_at_the_wider_width(h, tmp_path):
    """glmc align of a narrow B to a wide A writes B at A's width in A's stock class,
    certified against B's own logits."""
    import json

    from transformers import AutoModelForCausalLM

    from glmc.cli.main import main

    for name, seed, shape in (("a", 0, WIDE["gpt2"]), ("b", 1, NARROW["gpt2"])):
        t = h.make_tiny("gpt2", seed=seed, tied=False, **shape)
        model = t.importer.stock_model(t.hf_config).float()
        model.load_state_dict({k: v.float() for k, v in t.state().items()})
        model.save_pretrained(str(tmp_path / name))
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                 str(tmp_path / "out"), "--json"]) == 0
    report = json.loads((tmp_path / "out" / "glmc_report.json").read_text())
    assert report["certificate"]["equal"]
    out = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True)
    assert out.config.n_embd == 32
    # (written from B's folder, B's free entries took A's values as in memory; the stock
    # class's import centres the readers on the stream, which a LayerNorm model's never
    # see: compared centred)
    import glmc

    written = glmc.load(tmp_path / "out").canonical.state
    aligned = glmc.align(tmp_path / "a", tmp_path / "b").aligned
    assert aligned.free == {} and set(written) == set(aligned.state)
    for name, x in aligned.state.items():
        y = written[name]
        if x.dim() == 2 and x.shape[1] == 32:
            x, y = x - x.mean(1, keepdim=True), y - y.mean(1, keepdim=True)
        assert torch.allclose(y, x, atol=1e-5), name
    assert main(["merge", str(tmp_path / "a"), str(tmp_path / "b"), "-o",
                 str(tmp_path / "merged")]) == 0


def test_a_narrower_a_is_refused_with_a_message_to_swap(h):
    a = h.make_tiny("gpt2", seed=0, **NARROW["gpt2"]).canonical()
    b = h.make_tiny("gpt2", seed=1, **WIDE["gpt2"]).canonical()
    with pytest.raises(GlmcError, match=r"B is wider than A \(the models differ in n_embd "
                       r"\(16 in A, 32 in B\).*swap A and B"):
        embed_into(b, a.config)


def test_rotary_heads_of_other_dimensions_and_encoders_are_refused(h):
    a = h.make_tiny("llama", seed=0, d=32, n_head=2, n_kv_head=1).canonical()
    b = h.make_tiny("llama", seed=1, d=16, n_head=2, n_kv_head=1).canonical()
    with pytest.raises(GlmcError, match="rotary heads must have the same dimension"):
        embed_into(b, a.config)
    wide = h.make_tiny("bert", seed=0, d=32).canonical()
    narrow = h.make_tiny("bert", seed=1, d=16, n_head=2).canonical()
    with pytest.raises(GlmcError, match="post-LayerNorm encoder"):
        embed_into(narrow, wide.config)


def test_models_that_differ_beyond_widths_are_refused_naming_the_field(h):
    a = h.make_tiny("gpt2", seed=0, **WIDE["gpt2"]).canonical()
    b = h.make_tiny("gpt2", seed=1, n_layer=1, **NARROW["gpt2"]).canonical()
    with pytest.raises(GlmcError, match=r"n_layer \(2 in A, 1 in B\).*only their widths"):
        embed_into(b, a.config)
    from glmc.model import CanonicalModel

    same = h.make_tiny("gpt2", seed=1, **WIDE["gpt2"]).canonical()
    other = CanonicalModel(same.config.replace(head_bias=True, norm_f_bias=False), same.state)
    with pytest.raises(GlmcError, match=r"head_bias \(False in A, True in B\)"):
        embed_into(other, a.config)


# -- convnets: zero units and channels ----------------------------------------------------------


def convnet(arch: str, seed: int, **kw):
    """A random convnet of glmc's canonical form in float64 (BatchNorm statistics random
    too, so that the padding's are tested)."""
    from glmc.families.convnet import ConvNetConfig

    return random_model(ConvNetConfig(arch=arch, **(dict(image_size=8, num_channels=1,
                                                         num_labels=5) | kw)), seed)


CONVNETS = {"mlp": (dict(hidden=16), dict(hidden=8)),
            "vgg11": (dict(base=4, norm="batch"), dict(base=2, norm="batch")),
            "resnet20-batch": (dict(base=4, width=2, norm="batch"),
                               dict(base=4, width=1, norm="batch")),
            "resnet20-none": (dict(base=4, norm="none"), dict(base=3, norm="none"))}


def _convnet_pair(key: str):
    arch = key.split("-")[0]
    wide, narrow = CONVNETS[key]
    if arch == "vgg11":
        wide, narrow = wide | {"image_size": 32}, narrow | {"image_size": 32}
    return convnet(arch, 0, **wide), convnet(arch, 1, **narrow)


@pytest.mark.parametrize("key", list(CONVNETS))
def test_a_narrower_convnet_embedded_computes_its_function(key):
    from glmc.model import fitted

    a, b = _convnet_pair(key)
    wide = fitted(a, b)
    assert {k: v.shape for k, v in wide.state.items()} == {k: v.shape for k, v in a.state.items()}
    x = images(a.config)
    # (whatever the free entries hold: positive values, as a variance's would be)
    g = torch.Generator().manual_seed(5)
    noisy = wide.with_state({k: torch.where(wide.free[k], torch.rand(v.shape, generator=g,
                                                                     dtype=F64) + 0.5, v)
                             if k in wide.free else v for k, v in wide.state.items()})
    assert wide.free
    with torch.no_grad():
        want = b.module(F64).eval()(x)
        for model in (wide, noisy):
            got = model.module(F64).eval()(x)
            assert float((got - want).abs().max() / want.abs().max()) < 1e-12
    if key.startswith("resnet"):  # (the stream's writers stay zero; its readers are free)
        assert "stages.0.0.conv2.weight" not in wide.free
        assert wide.free["stages.0.0.conv1.weight"][:, -1].all()
    else:  # (the first layer's extra units: their rows, not their readers' columns)
        first = "layers.0.weight" if key == "mlp" else "features.0.conv.weight"
        assert wide.free[first][-1].all() and not wide.free[first][0].any()


def test_a_narrow_mlp_cut_from_a_wide_one_is_matched_onto_its_units():
    """B is A's MLP restricted to a random subset of each layer's units: weight matching of
    the embedded B to A sends each of B's units to the unit of A it was cut from."""
    from glmc.model import CanonicalModel, fitted

    a = convnet("mlp", 0, hidden=16)
    g = torch.Generator().manual_seed(4)
    keep = [torch.randperm(16, generator=g)[:10] for _ in range(a.config.depth)]
    state, prev = {}, None
    for i, idx in enumerate(keep):
        w = a.state[f"layers.{i}.weight"][idx]
        state[f"layers.{i}.weight"] = w if prev is None else w[:, prev]
        state[f"layers.{i}.bias"] = a.state[f"layers.{i}.bias"][idx]
        prev = idx
    state["head.weight"], state["head.bias"] = a.state["head.weight"][:, prev], a.state["head.bias"]
    b = CanonicalModel(a.config.replace(hidden=10), state)
    t = weight_matching(a, fitted(a, b)).transform
    for i, idx in enumerate(keep):
        perm = t.elements[f"layers.{i}"].perm  # (A's unit j holds B's unit perm[j])
        assert torch.equal(perm[idx], torch.arange(10)), (i, perm, idx)


def test_convnets_wider_in_b_or_with_channel_layernorm_are_refused():
    from glmc.model import fitted

    a, b = convnet("resnet20", 0, base=4, norm="none"), convnet("resnet20", 1, base=6,
                                                               norm="none")
    with pytest.raises(GlmcError, match=r"B is wider than A \(base 4 in A, 6 in B\).*swap"):
        fitted(a, b)
    a, b = convnet("resnet20", 0, base=4, norm="layer"), convnet("resnet20", 1, base=2,
                                                                norm="layer")
    with pytest.raises(GlmcError, match="channel-LayerNorm convnet cannot be embedded"):
        fitted(a, b)
    a, b = convnet("mlp", 0, hidden=16), convnet("mlp", 1, hidden=8, depth=2)
    with pytest.raises(GlmcError, match=r"depth \(3 in A, 2 in B\).*only their widths"):
        fitted(a, b)


def test_learned_matchings_path_fills_a_narrower_b_from_a(h):
    """On learned matching's path, a narrower B's free entries take A's values through the
    latents' elements at every step: at λ = 0 the path is B moved with A as ``like``, B's
    function (float64); and the default λ spans the whole segment for such a pair."""
    from glmc.matching.learned import Latents, PathModel
    from glmc.matching.options import LearnedMatchingOptions

    a = h.make_tiny("gpt2", seed=0, **WIDE["gpt2"]).canonical()
    t = h.make_tiny("gpt2", seed=1, **NARROW["gpt2"])
    b = embed_into(t.canonical(), a.config)
    init = weight_matching(a, b).transform
    latents = Latents(a, b, init, "orthogonal", "invertible", True)
    path = PathModel(a, b, latents, torch.float64)
    at_b = path.state(0.0)
    want = b.transformed(latents.transform(), like=a).state
    assert all(torch.allclose(at_b[k], want[k], atol=1e-12) for k in want)
    assert not torch.allclose(at_b["blocks.0.mlp.fc.weight"],
                              b.transformed(latents.transform()).state["blocks.0.mlp.fc.weight"])
    x = t.inputs()
    assert h.rel_diff(t.logits(x), h.canonical_output(a.with_state(at_b), x)) < 1e-10
    assert LearnedMatchingOptions().lam_for(narrower=True) == "uniform:0,1"
    assert LearnedMatchingOptions().lam_for(narrower=False) == "uniform:0.4,0.6"
