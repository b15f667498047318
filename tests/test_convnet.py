"""The convnet family (MLP, VGG-11/16, ResNet-20): its spec's transforms keep the function,
the ResNet ties are needed, probes observe their spaces, configs round-trip, archs save."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import images, random_model
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import glmc.families.convnet  # noqa: F401  (registers the family and its archs)
from glmc.families import ARCHS, FAMILIES
from glmc.families.convnet import ConvNetConfig, build, convnet_probes
from glmc.model import CanonicalModel
from glmc.symmetry.groups import Permutation, PermutationGroup
from glmc.symmetry.spec import SymmetrySpec
from glmc.symmetry.transform import Transform
from glmc.training.options import TrainConfig

KINDS = [("mlp", "none")] + [(a, n) for a in ("vgg11", "vgg16", "resnet20")
                            for n in ("batch", "layer", "none")]
SMALL = settings(max_examples=8)


@st.composite
def configs(draw: st.DrawFn, arch: str, norm: str) -> ConvNetConfig:
    """A small random config of ``arch`` with ``norm``."""
    shape = dict(image_size=draw(st.integers(3, 9)), num_channels=draw(st.integers(1, 3)),
                 num_labels=draw(st.integers(2, 5)), width=draw(st.integers(1, 2)))
    if arch == "mlp":
        return ConvNetConfig(arch, hidden=draw(st.integers(2, 6)),
                             depth=draw(st.integers(1, 3)), **shape)
    return ConvNetConfig(arch, norm=norm, base=draw(st.integers(1, 3)), **shape)


def logits(model: CanonicalModel, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.module()(x)


# --------------------------------------------------------------------------------------------
# (a, b) the spec: complete, consistent, and its transforms keep the function
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "norm"), KINDS)
@SMALL
@given(data=st.data())
def test_random_transform_keeps_logits(arch: str, norm: str, data: st.DataObject) -> None:
    config = data.draw(configs(arch, norm))
    model = random_model(config, seed=data.draw(st.integers(0, 2**16)))
    spec = model.spec  # validates shapes
    assert set(spec.axes) == set(model.state), "every state tensor is in the spec"
    assert spec.buffers == {k for k in model.state if "running_" in k}
    assert set(spec.roles) == set(spec.spaces)
    t = Transform.random(spec, torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    moved = model.transformed(t)
    x = images(config)
    assert (logits(model, x) - logits(moved, x)).abs().max() < 1e-9


def test_family_is_registered() -> None:
    assert FAMILIES["convnet"].config_class is ConvNetConfig
    assert {"mlp", "vgg11", "vgg16", "resnet20"} <= set(ARCHS)


def test_vgg_drops_pools_below_one_pixel() -> None:
    """MNIST-sized VGG-11: four of its five pools fit; the spec still matches the module."""
    config = ConvNetConfig("vgg11", image_size=28, num_channels=1, num_labels=10, base=2)
    model = random_model(config, 0)
    pools = [b.pool for b in model.module().features]
    assert pools == [True, True, False, True, False, True, False, False]
    assert logits(model, images(config)).shape == (3, 10)


# --------------------------------------------------------------------------------------------
# (e) the ResNet ties are needed
# --------------------------------------------------------------------------------------------


def untie(spec: SymmetrySpec, prefixes: tuple[str, ...], space: str) -> SymmetrySpec:
    """``spec`` with the axes of ``space`` on tensors under ``prefixes`` moved to a space of
    their own, ``"untied"``."""
    axes = {}
    for name, tags in spec.axes.items():
        if name.startswith(prefixes):
            tags = tuple(None if tag is None else tuple(
                ("untied" if s == space else s, v) for s, v in tag) for tag in tags)
        axes[name] = tags
    spaces = {**spec.spaces, "untied": PermutationGroup(spec.spaces[space].size)}
    return SymmetrySpec(spaces, axes, spec.roles, spec.buffers)


@pytest.mark.parametrize("norm", ["batch", "layer", "none"])
def test_resnet_untied_block_output_breaks_function(norm: str) -> None:
    """Permuting one block's conv2/norm2 output alone (not the stream it adds to) changes
    the logits: the stream of a stage must be one space."""
    config = ConvNetConfig("resnet20", image_size=8, num_channels=3, num_labels=4, base=2,
                           norm=norm)
    model = random_model(config, 3)
    spec = untie(model.spec, ("stages.1.1.conv2.", "stages.1.1.norm2."), "stages.1")
    size = spec.spaces["untied"].size
    t = Transform({"untied": Permutation(torch.roll(torch.arange(size), 1))})
    broken = model.with_state(t.apply(spec, model.state))
    x = images(config)
    ref = logits(model, x)
    assert (ref - logits(broken, x)).abs().max() > 1e-3 * ref.abs().max()
    # The same permutation of the whole stream keeps the function.
    tied = Transform({"stages.1": Permutation(torch.roll(torch.arange(size), 1))})
    assert (ref - logits(model.transformed(tied), x)).abs().max() < 1e-9


# --------------------------------------------------------------------------------------------
# (c) probes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "norm"), KINDS)
@SMALL
@given(data=st.data())
def test_probes_observe_their_spaces(arch: str, norm: str, data: st.DataObject) -> None:
    """Each probe is a submodule whose output's axis 1 has its space's size and moves with
    the space under a transform; its affine tensors are indexed by that axis. A ResNet
    stream's probes where it is the stream itself (the stem's and every block's output) have
    no affine: every other probe has one."""
    config = data.draw(configs(arch, norm))
    model = random_model(config, seed=data.draw(st.integers(0, 2**16)))
    spec, probes = model.spec, convnet_probes(config)
    assert probes == FAMILIES["convnet"].probes(config)
    assert {p.space for p in probes} == set(spec.spaces)
    t = Transform.random(spec, torch.Generator().manual_seed(0))
    seen = [observe(model, probes, config), observe(model.transformed(t), probes, config)]
    for p, before, after in zip(probes, *seen, strict=True):
        size = spec.spaces[p.space].size
        assert before.shape[1] == size
        assert torch.allclose(t.elements[p.space].apply(before, 1, "out"), after, atol=1e-10)
        assert (p.point, p.axis) == ("output", 1)
        assert (p.affine is None) == p.stream
        assert not p.stream or (arch == "resnet20" and p.activation is None)
        for name in p.affine or ():
            assert model.state[name].shape[0] == size
    if arch == "resnet20":  # (the stem and every block show the stream they write)
        blocks = [n for n, m in model.module().named_modules() if type(m).__name__ in
                  ("Stem", "BasicBlock")]
        assert [p.module for p in probes if p.stream] == blocks


def observe(model: CanonicalModel, probes: list, config: ConvNetConfig) -> list[torch.Tensor]:
    """The output of every probe's module on a fixed batch, in the probes' order."""
    module = model.module()
    named, got = dict(module.named_modules()), {}
    hooks = [named[p.module].register_forward_hook(lambda m, i, o, k=k: got.__setitem__(k, o))
             for k, p in enumerate(probes)]
    with torch.no_grad():
        module(images(config))
    for h in hooks:
        h.remove()
    return [got[k] for k in range(len(probes))]


# --------------------------------------------------------------------------------------------
# (d) configs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "norm"), KINDS)
@SMALL
@given(data=st.data())
def test_config_round_trips(arch: str, norm: str, data: st.DataObject) -> None:
    config = data.draw(configs(arch, norm))
    raw = json.loads(json.dumps(config.to_json()))
    assert ConvNetConfig.from_json(raw) == config
    assert config.replace(width=config.width + 1).width == config.width + 1


def test_config_defaults() -> None:
    shape = dict(image_size=32, num_channels=3, num_labels=10)
    assert ConvNetConfig("mlp", **shape).norm == "none"
    assert ConvNetConfig("mlp", **shape).base is None
    assert (ConvNetConfig("vgg16", **shape).norm, ConvNetConfig("vgg16", **shape).base) == (
        "batch", 64)
    assert ConvNetConfig("resnet20", **shape).base == 16


@pytest.mark.parametrize(("changes", "word"), [
    ({"arch": "vgg19"}, "vgg19"),
    ({"norm": "group"}, "group"),
    ({"arch": "mlp", "norm": "batch"}, "batch"),
    ({"arch": "mlp", "base": 8}, "8"),
    ({"width": 0}, "width"),
    ({"width": True}, "width"),
    ({"base": -1}, "base"),
    ({"image_size": 0}, "image_size"),
    ({"num_labels": 1.5}, "num_labels"),
    ({"task": "causal_lm"}, "causal_lm"),
    ({"norm_eps": 0.0}, "norm_eps"),
])
def test_config_rejects_bad_values(changes: dict, word: str) -> None:
    raw = {"arch": "vgg11", "image_size": 8, "num_channels": 3, "num_labels": 4, **changes}
    with pytest.raises(ValueError, match=word):
        ConvNetConfig.from_json(raw)


def test_config_rejects_unknown_keys() -> None:
    raw = {"arch": "vgg11", "image_size": 8, "num_channels": 3, "num_labels": 4, "depthh": 2}
    with pytest.raises(ValueError, match="depthh"):
        ConvNetConfig.from_json(raw)


# --------------------------------------------------------------------------------------------
# Training architectures
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "vgg11", "vgg16", "resnet20"])
def test_arch_trains_and_saves(name: str, tmp_path) -> None:
    """model_config from the options and data, a training step (BatchNorm without its batch
    counter), and a glmc folder whose weights load strictly into the same config."""
    arch = ARCHS[name]
    assert arch.task == "image_classifier" and arch.help
    cfg = TrainConfig(arch=name, data="digits", width=2, norm="layer", base=2)
    ds = SimpleNamespace(image_size=8, num_channels=3, num_classes=5)
    config = arch.model_config(cfg, ds)
    assert (config.arch, config.width, config.num_labels) == (name, 2, 5)
    assert config.norm == ("none" if name == "mlp" else "layer")
    assert arch.config_from_json(arch.config_to_json(config)) == config
    plain = arch.model_config(TrainConfig(arch=name, data="digits"), ds)  # the defaults
    assert plain.width == 1 and plain.norm == ("none" if name == "mlp" else "batch")
    assert plain.hidden == 512 if name == "mlp" else plain.base is not None
    torch.manual_seed(0)
    model = arch.build(plain).train()
    x = torch.randn(4, 3, 8, 8)
    arch.logits(model, x).logsumexp(1).mean().backward()
    arch.save(model, plain, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["canonical"]
    assert ConvNetConfig.from_json(saved) == plain
    state = load_file(str(tmp_path / "model.safetensors"))
    assert all(v.is_floating_point() for v in state.values())
    reloaded = build(plain, state)
    with torch.no_grad():
        assert torch.allclose(reloaded(x), model.eval()(x), atol=1e-6)
