"""Importers: stock -> canonical -> stock export, model folders (HF and glmc), and errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2LMHeadModel, ViTForImageClassification
from transformers.utils import logging as hf_logging

from glmc.errors import GlmcError
from glmc.families import IMPORTERS, importer_for
from glmc.families.importers import NotRepresentable
from glmc.families.transformer.circuit import to_circuit
from glmc.io.folders import load_model, write_model
from glmc.symmetry.transform import Transform

F64_TOL = 1e-9
STOCK_CLASSES = {"gpt2": GPT2LMHeadModel, "vit": ViTForImageClassification}
#: Stock-model variants worth exporting: tied / untied embeddings, with / without qkv bias.
VARIANTS = [("gpt2", {"tied": True}), ("gpt2", {"tied": False}),
            ("vit", {"qkv_bias": True}), ("vit", {"qkv_bias": False})]
VARIANT_IDS = ["gpt2-tied", "gpt2-untied", "vit-qkv-bias", "vit-no-qkv-bias"]

hf_logging.disable_progress_bar()


def random_transform(model, seed: int, **subgroups: str) -> Transform:
    return Transform.random(model.spec, torch.Generator().manual_seed(seed), subgroups=subgroups)


@pytest.fixture(params=["canonical", "fix-ones-transformed"])
def export_case(request) -> str:
    return request.param


@pytest.fixture(params=VARIANTS, ids=VARIANT_IDS)
def variant(request, h, export_case):
    """(tiny stock model, canonical model exactly representable in the stock class): the
    canonical form itself, or it moved by a full random group element whose residual map
    fixes the all-ones direction (heads, inner head maps and MLP units all random)."""
    arch, opts = request.param
    tiny = h.make_tiny(arch, **opts)
    model = tiny.canonical()
    if export_case == "fix-ones-transformed":
        moved = model.transformed(random_transform(model, 3, residual="fix_ones"))
        assert h.rel_weight_distance(model, moved) > 1e-2
        model = moved
    return tiny, model


def test_export_loads_strictly_into_the_stock_class(h, variant):
    tiny, model = variant
    hf_config, state = tiny.importer.to_stock(model)
    stock = tiny.importer.stock_model(hf_config).to(torch.float64)
    result = stock.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = tiny.inputs()
    assert h.rel_diff(tiny.logits(x), tiny.importer.stock_logits(stock.eval(), x).detach()) \
        < F64_TOL


def test_written_folder_loads_with_from_pretrained(h, variant, tmp_path):
    tiny, model = variant
    assert write_model(tmp_path, model) == "hf"
    cls = STOCK_CLASSES[tiny.arch]
    stock, info = cls.from_pretrained(tmp_path, local_files_only=True, dtype=torch.float64,
                                      output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    x = tiny.inputs()
    with torch.no_grad():
        got = tiny.importer.stock_logits(stock.eval(), x)
    assert h.rel_diff(tiny.logits(x), got) < F64_TOL
    # glmc reads it back too, as an HF folder in canonical form.
    back = load_model(tmp_path, dtype=torch.float64)
    assert back.kind == "hf"
    assert h.rel_diff(tiny.logits(x), h.canonical_output(back.canonical, x)) < F64_TOL


@pytest.mark.parametrize("case", ["orthogonal-moves-ones", "circuit", "no-stock"])
def test_non_stock_models_write_glmc_folders(h, arch, case, tmp_path):
    tiny = h.make_tiny(arch)
    model = tiny.canonical()
    stock = True
    if case == "orthogonal-moves-ones":
        model = model.transformed(random_transform(model, 4))
        with pytest.raises(NotRepresentable, match="all-ones"):
            tiny.importer.to_stock(model)
    elif case == "circuit":
        model = to_circuit(model)
        with pytest.raises(NotRepresentable, match="circuit"):
            tiny.importer.to_stock(model)
    else:
        stock = False
    fmt = write_model(tmp_path, model, stock=stock)
    assert fmt.startswith("glmc")
    assert json.loads((tmp_path / "config.json").read_text())["glmc_format"] == 1
    back = load_model(tmp_path, dtype=torch.float64)
    assert back.kind == "glmc"
    # (The recorded source config goes through JSON, where id2label keys become strings.)
    assert back.canonical.config.replace(source={}) == model.config.replace(source={})
    assert back.canonical.config.source["arch"] == arch
    x = tiny.inputs()
    assert h.rel_diff(tiny.logits(x), h.canonical_output(back.canonical, x)) < F64_TOL


@pytest.mark.parametrize(("arch", "opts"), VARIANTS, ids=VARIANT_IDS)
def test_load_model_reads_save_pretrained_folders(h, arch, opts, tmp_path):
    tiny = h.make_tiny(arch, **opts)
    tiny.stock.save_pretrained(tmp_path)
    loaded = load_model(tmp_path, dtype=torch.float64)
    assert loaded.kind == "hf" and loaded.importer is IMPORTERS[arch]
    x = tiny.inputs()
    ref = tiny.logits(x)
    assert h.rel_diff(ref, h.canonical_output(loaded.canonical, x)) < F64_TOL
    with torch.no_grad():
        got = loaded.importer.stock_logits(loaded.stock_module(torch.float64), x)
    assert h.rel_diff(ref, got) < F64_TOL


def test_float32_folder_round_trip_is_close(h, arch, tmp_path):
    tiny = h.make_tiny(arch, dtype=torch.float32)
    assert write_model(tmp_path, tiny.canonical()) == "hf"
    loaded = load_model(tmp_path)  # float32 by default
    assert loaded.canonical.dtype == torch.float32
    x = tiny.inputs()
    assert h.rel_diff(tiny.logits(x), h.canonical_output(loaded.canonical, x)) < 1e-4


def test_to_stock_rejects_another_architecture(h):
    gpt2 = h.make_tiny("gpt2").canonical()
    with pytest.raises(NotRepresentable, match="gpt2"):
        IMPORTERS["vit"].to_stock(gpt2)


def test_importer_for_unknown_type_lists_supported():
    supported = "bert, gpt2, gpt_neox, llama, mistral, qwen2, roberta, vit"
    with pytest.raises(GlmcError, match=rf"'t5'.*supported: {supported}"):
        importer_for("t5", "somewhere/config.json")
    assert importer_for("gpt2").name == "gpt2"


def test_gpt2_model_checkpoint_keys_are_normalised(h):
    """A GPT2Model checkpoint (no 'transformer.' prefix, old causal-mask buffers)."""
    tiny = h.make_tiny("gpt2", tied=True)
    state = {k.removeprefix("transformer."): v for k, v in tiny.state().items()
             if k != "lm_head.weight"}
    state["h.0.attn.bias"] = torch.ones(1, 1, 16, 16)
    state["h.0.attn.masked_bias"] = torch.tensor(-1e4)
    normalised = tiny.importer.normalize_keys(state)
    assert set(normalised) == set(tiny.state()) - {"lm_head.weight"}
    x = tiny.inputs()
    canon = tiny.importer.to_canonical(tiny.hf_config, normalised)
    assert h.rel_diff(tiny.logits(x), h.canonical_output(canon, x)) < F64_TOL


def test_unsupported_variants_raise_glmc_errors(h):
    tiny = h.make_tiny("gpt2")
    tiny.hf_config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(GlmcError, match="scale_attn_by_inverse_layer_idx"):
        tiny.canonical()
    vit = h.make_tiny("vit", num_labels=0)
    with pytest.raises(GlmcError, match="num_labels"):
        vit.canonical()
