"""Plain state dicts read by name (glmc.families.convnet.layouts, ``glmc import``): a model
renamed to torchvision's names (or an MLP's fc1..fcN) reads back as the same function; a conv
bias before BatchNorm folds exactly; a layout that does not fit names the tensor."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import images, random_model
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from glmc.api import save
from glmc.cli.main import main
from glmc.errors import GlmcError
from glmc.families.convnet import ConvNetConfig, build
from glmc.families.convnet.layouts import read_state_dict, to_torchvision
from glmc.families.convnet.modules import vgg_layers
from glmc.io.folders import read_state_file


def torchvision_names(config: ConvNetConfig, state: dict) -> dict:
    """``state`` under the names torchvision's ResNet / VGG modules give the same tensors
    (VGG: a Sequential of conv, norm, ReLU and pool modules; MLP: fc1..fcN)."""
    if config.arch == "mlp":
        n = config.depth + 1
        return {re.sub(r"^(layers\.(\d+)|head)\.",
                       lambda m: f"fc{int(m[2]) + 1 if m[2] else n}.", k): v
                for k, v in state.items()}
    if config.arch == "resnet20":
        rules = [(r"^stem\.conv\.", "conv1."), (r"^stem\.norm\.", "bn1."),
                 (r"^stages\.(\d)\.(\d)\.shortcut\.conv\.", r"layer\1.\2.downsample.0."),
                 (r"^stages\.(\d)\.(\d)\.shortcut\.norm\.", r"layer\1.\2.downsample.1."),
                 (r"^stages\.(\d)\.(\d)\.norm(\d)\.", r"layer\1.\2.bn\3."),
                 (r"^stages\.(\d)\.", r"layer\1."), (r"^head\.", "fc.")]
        out = {}
        for k, v in state.items():
            for pattern, repl in rules:
                k = re.sub(pattern, repl, k)
            out[re.sub(r"^layer(\d)", lambda m: f"layer{int(m[1]) + 1}", k)] = v
        return out
    index, j = {}, 0  # features.{i} -> its conv's Sequential index
    for i, (_, pool) in enumerate(vgg_layers(config)):
        index[i] = j
        j += 2 + (config.norm != "none") + pool
    out = {}
    for k, v in state.items():
        m = re.match(r"features\.(\d+)\.(conv|norm)\.(\w+)", k)
        if m:
            k = f"features.{index[int(m[1])] + (m[2] == 'norm')}.{m[3]}"
        out[k.replace("head.", "classifier.")] = v
    return out


def logits(config: ConvNetConfig, state: dict) -> torch.Tensor:
    with torch.no_grad():
        return build(config, state)(images(config).to(next(iter(state.values())).dtype))


KINDS = [("mlp", "none")] + [(a, n) for a in ("vgg11", "vgg16", "resnet20")
                            for n in ("batch", "none")]


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(KINDS), width=st.integers(1, 2), base=st.integers(1, 3),
       side=st.integers(3, 9), seed=st.integers(0, 2**16))
def test_torchvision_names_read_back_as_the_same_function(kind, width, base, side, seed):
    arch, norm = kind
    shape = dict(image_size=side, num_channels=2, num_labels=3, width=width)
    config = (ConvNetConfig(arch, hidden=base + 2, depth=2, **shape) if arch == "mlp"
              else ConvNetConfig(arch, norm=norm, base=base, **shape))
    model = random_model(config, seed)
    state = torchvision_names(config, model.state)
    if norm == "batch":  # (torchvision stores it; glmc has no use for it)
        state |= {k.replace("running_mean", "num_batches_tracked"): torch.tensor(7)
                  for k in state if k.endswith("running_mean")}
    assert to_torchvision(config, model.state).keys() == state.keys()  # the way back
    read, canonical = read_state_dict(state, "ckpt", image_size=side, num_channels=2)
    assert (read.arch, read.norm, read.num_labels) == (arch, norm, 3)
    assert read.source["layout"] in ("torchvision", "linear chain")
    # float64 throughout: the renaming moves tensors, it never computes
    assert torch.equal(logits(read, canonical), logits(config, model.state))


def test_glmc_names_read_as_they_are_and_a_module_prefix_is_dropped():
    config = ConvNetConfig("resnet20", image_size=6, num_channels=1, num_labels=4, base=2)
    model = random_model(config, 0)
    read, canonical = read_state_dict({f"module.{k}": v for k, v in model.state.items()},
                                      "ckpt", image_size=6)
    assert read.source["layout"] == "glmc" and set(canonical) == set(model.state)
    assert torch.equal(logits(read, canonical), logits(config, model.state))


def test_a_conv_bias_before_batchnorm_folds_into_its_running_mean():
    """BN(conv(x) + c) with running mean m + c is BN(conv(x)) with mean m: exact in eval."""
    config = ConvNetConfig("vgg11", image_size=8, num_channels=3, num_labels=5, base=2)
    model = random_model(config, 3)
    state = dict(model.state)
    g = torch.Generator().manual_seed(1)
    for name in [k for k in state if k.endswith(".conv.weight")]:
        c = torch.randn(state[name].shape[0], generator=g, dtype=torch.float64)
        state[name.replace("weight", "bias")] = c
        mean = name.replace("conv.weight", "norm.running_mean")
        state[mean] = state[mean] + c
    read, canonical = read_state_dict(torchvision_names(config, state), "ckpt", image_size=8)
    assert not any(k.endswith("conv.bias") for k in canonical)
    torch.testing.assert_close(logits(read, canonical), logits(config, model.state),
                               rtol=0, atol=1e-12)


def test_an_mlp_reads_its_image_side_from_the_first_layer():
    config = ConvNetConfig("mlp", image_size=28, num_channels=1, num_labels=10, hidden=8)
    read, _ = read_state_dict(torchvision_names(config, random_model(config, 0).state), "ckpt")
    assert (read.image_size, read.num_channels, read.depth, read.hidden) == (28, 1, 3, 8)


def _resnet_state(**changes) -> dict:
    config = ConvNetConfig("resnet20", image_size=6, num_channels=3, num_labels=4, base=2)
    return torchvision_names(config, random_model(config, 0).state) | changes


@pytest.mark.parametrize("state, hints, words", [
    (_resnet_state(**{"layer4.0.conv1.weight": torch.zeros(8, 8, 3, 3)}), {"image_size": 6},
     ["layer4.0.conv1.weight", "[8, 8, 3, 3]"]),
    (_resnet_state(**{"conv1.weight": torch.zeros(2, 3, 7, 7)}), {"image_size": 6},
     ["conv1.weight", "[2, 3, 7, 7]", "[2, 3, 3, 3]"]),
    ({k: v for k, v in _resnet_state().items() if "downsample" not in k}, {"image_size": 6},
     ["shortcut", "projection shortcuts"]),
    (_resnet_state(), {}, ["--image-size"]),
    (_resnet_state(), {"image_size": 6, "num_channels": 1}, ["reads 3 image channels, not 1"]),
    ({k: v for k, v in _resnet_state().items() if "running" not in k}, {"image_size": 6},
     ["bn1.weight", "--norm layer"]),
    (_resnet_state(**{"fc.weight": torch.zeros(4, 8, dtype=torch.int64)}), {"image_size": 6},
     ["fc.weight", "int64"]),
    (torchvision_names(ConvNetConfig("vgg11", image_size=8, num_channels=3, num_labels=2,
                                     base=1), random_model(ConvNetConfig(
                                         "vgg11", image_size=8, num_channels=3, num_labels=2,
                                         base=1), 0).state)
     | {"classifier.3.weight": torch.zeros(2, 2)}, {"image_size": 8},
     ["classifier.3.weight", "single linear"]),
    ({"fc1.weight": torch.zeros(5, 784), "fc2.weight": torch.zeros(3, 6)}, {},
     ["fc2.weight", "does not read the 5 outputs of fc1.weight"]),
    ({"fc1.weight": torch.zeros(5, 783), "fc2.weight": torch.zeros(3, 5)}, {},
     ["783 inputs"]),
    (_resnet_state(**{"linear.weight": torch.zeros(4, 8), "linear.bias": torch.zeros(4)}),
     {"image_size": 6}, ["fc.weight and linear.weight would both be head.weight"]),
    (_resnet_state(**{"module.fc.bias": torch.zeros(4)}), {"image_size": 6},
     ["fc.bias and module.fc.bias are the same tensor twice"]),
    ({"input.weight": torch.zeros(5, 784), "hidden.weight": torch.zeros(5, 5),
      "output.weight": torch.zeros(3, 5)}, {}, ["cannot tell the order of the linear layers"]),
])
def test_a_layout_that_does_not_fit_names_the_tensor(state, hints, words):
    with pytest.raises(GlmcError) as e:
        read_state_dict(state, "ckpt.pt", **hints)
    assert str(e.value).startswith("ckpt.pt: ")
    for w in words:
        assert w in str(e.value)


def test_glmc_import_writes_a_folder_that_computes_the_checkpoint(tmp_path, capsys):
    config = ConvNetConfig("resnet20", image_size=8, num_channels=1, num_labels=10, base=2,
                           width=2)
    model = random_model(config, 5).to(torch.float32)
    save(model, tmp_path / "ref")
    nested = {"epoch": 3, "state_dict": torchvision_names(config, model.state)}
    torch.save(nested, tmp_path / "r20.pt")
    argv = ["import", str(tmp_path / "r20.pt"), "--image-size", "8", "-o", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "--allow-pickle" in capsys.readouterr().err
    assert main([*argv, "--allow-pickle"]) == 0
    assert "torchvision names" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "ref"), str(tmp_path / "out")]) == 0
    save_file(torchvision_names(config, model.state), str(tmp_path / "r20.safetensors"))
    assert main(["import", str(tmp_path / "r20.safetensors"), "--arch", "vgg11",
                 "--image-size", "8", "-o", str(tmp_path / "bad")]) == 2
    assert "bn1.bias (shape [4]) has no place in a VGG" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_glmc_export_writes_torchvision_names_that_import_reads_back(tmp_path, capsys):
    config = ConvNetConfig("vgg11", image_size=8, num_channels=3, num_labels=10, base=2)
    model = random_model(config, 2).to(torch.float32)
    save(model, tmp_path / "ref")
    out = tmp_path / "vgg.safetensors"
    assert main(["export", str(tmp_path / "ref"), "-o", str(out)]) == 0
    written = load_file(str(out))
    want = torchvision_names(config, model.state)
    assert {k for k in written if not k.endswith("num_batches_tracked")} == set(want)
    assert all(torch.equal(written[k], v) for k, v in want.items())
    assert main(["import", str(out), "--image-size", "8", "-o", str(tmp_path / "back")]) == 0
    assert main(["verify", str(tmp_path / "ref"), str(tmp_path / "back")]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "ref"), "-o", str(tmp_path / "vgg.pt")]) == 2
    assert "written as safetensors" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "ref"), "-o", str(out)]) == 2  # exists: --force
    assert "--force" in capsys.readouterr().err


def test_batchnorm_without_affine_reads_as_weight_one_and_bias_zero():
    config = ConvNetConfig("resnet20", image_size=6, num_channels=3, num_labels=4, base=2)
    model = random_model(config, 4)
    state = {k: v for k, v in model.state.items()
             if not re.search(r"norm\d?\.(weight|bias)$", k)}
    plain = {k: (torch.ones_like(v) if k.endswith("weight") else torch.zeros_like(v))
             if re.search(r"norm\d?\.(weight|bias)$", k) else v for k, v in model.state.items()}
    read, canonical = read_state_dict(torchvision_names(config, state), "ckpt", image_size=6)
    assert read.norm == "batch"
    assert torch.equal(logits(read, canonical), logits(config, plain))


def test_an_mlp_is_read_in_the_order_of_its_layer_indices():
    """classifier.0/2/4 (a Sequential with ReLUs between) and fc2 before fc10."""
    config = ConvNetConfig("mlp", image_size=4, num_channels=3, num_labels=3, hidden=5, depth=9)
    model = random_model(config, 1)
    seq = {re.sub(r"^(layers\.(\d+)|head)\.",
                  lambda m: f"classifier.{2 * int(m[2]) if m[2] else 18}.", k): v
           for k, v in model.state.items()}
    for state in (seq, torchvision_names(config, model.state)):
        read, canonical = read_state_dict(state, "ckpt", image_size=4)
        assert read.num_channels == 3  # (48 inputs of a 4x4 image)
        assert torch.equal(logits(read, canonical), logits(config, model.state))


def test_import_and_export_never_replace_their_input(tmp_path, capsys):
    config = ConvNetConfig("mlp", image_size=4, num_channels=1, num_labels=3, hidden=5)
    model = random_model(config, 0).to(torch.float32)
    (tmp_path / "ck").mkdir()
    save_file(torchvision_names(config, model.state), str(tmp_path / "ck" / "m.safetensors"))
    assert main(["import", str(tmp_path / "ck" / "m.safetensors"), "-o", str(tmp_path / "ck"),
                 "--force"]) == 2
    assert "would replace input" in capsys.readouterr().err
    assert (tmp_path / "ck" / "m.safetensors").is_file()
    save(model, tmp_path / "m")
    assert main(["export", str(tmp_path / "m"), "-o", str(tmp_path / "m" / "model.safetensors"),
                 "--force"]) == 2
    assert "would replace part of input" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "m"), str(tmp_path / "m")]) == 0


def test_a_checkpoint_nests_its_state_dict_beside_other_entries(tmp_path):
    config = ConvNetConfig("mlp", image_size=4, num_channels=1, num_labels=3, hidden=5)
    state = torchvision_names(config, random_model(config, 0).state)
    torch.save({"net": state, "acc": torch.tensor(0.9), "epoch": 3}, tmp_path / "c.pt")
    assert read_state_file(tmp_path / "c.pt", allow_pickle=True).keys() == state.keys()

