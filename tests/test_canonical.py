"""The canonical rewrite (LayerNorm -> RMSNorm, writers centred, affine folded) and circuit
form compute the stock model's function."""

from __future__ import annotations

import pytest
import torch

from glmc.families.importers import NotRepresentable
from glmc.families.transformer.circuit import to_circuit
from glmc.families.transformer.gpt2 import NORM_F_BIAS_MIN_GAMMA
from glmc.families.transformer.model import CanonicalConfig, rms_norm
from glmc.io.folders import load_model, write_model
from glmc.symmetry.groups import OrthogonalGroup, PermutationGroup

F64_TOL, F32_TOL = 1e-9, 1e-4

VARIANTS = [
    ("gpt2", {"tied": True}),
    ("gpt2", {"tied": False, "n_layer": 3, "n_head": 2}),
    ("gpt2", {"activation_function": "relu", "n_inner": 48}),
    ("gpt2", {"scale_attn_weights": False, "d": 16}),
    ("vit", {"qkv_bias": True}),
    ("vit", {"qkv_bias": False, "n_layer": 3, "n_head": 1}),
    ("vit", {"hidden_act": "gelu_new", "patch_size": 2}),
]
IDS = [f"{a}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for a, o in VARIANTS]


@pytest.mark.parametrize(("arch", "opts"), VARIANTS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_canonical_and_circuit_match_stock(h, arch, opts, dtype):
    tiny = h.make_tiny(arch, dtype=dtype, **opts)
    x = tiny.inputs()
    ref = tiny.logits(x)
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    canon = tiny.canonical()
    assert canon.dtype == dtype
    assert h.rel_diff(ref, h.canonical_output(canon, x)) < tol
    circuit = to_circuit(canon)
    assert circuit.config.attention == "circuit"
    assert h.rel_diff(ref, h.canonical_output(circuit, x)) < tol


def test_canonical_model_is_centred_and_has_a_valid_spec(h, arch):
    canon = h.make_tiny(arch).canonical()
    assert canon.uncentred_writer() is None
    spec = canon.spec  # validated against the state's shapes
    assert set(spec.axes) == set(canon.state)
    for name, axis, _ in spec.occurrences("res"):
        x = canon.state[name]
        # Writers, and the readers inside blocks, have no all-ones component. (GPT-2's head
        # reads norm_f.bias, which has one, so it cannot be centred.)
        if name.startswith(("embed.", "blocks.")):
            assert float(x.mean(axis).abs().max()) < 1e-12 * float(x.abs().max()), name
    # The residual group is orthogonal and there is one permutation space per MLP.
    assert spec.spaces["res"] == OrthogonalGroup(canon.config.d_model)
    assert sorted(s for s, r in spec.roles.items() if r == "mlp") == ["mlp.0", "mlp.1"]


def test_uncentred_writer_is_reported(h):
    canon = h.make_tiny("gpt2").canonical()
    state = dict(canon.state)
    state["blocks.1.mlp.proj.bias"] = state["blocks.1.mlp.proj.bias"] + 1.0
    bad = canon.with_state(state).uncentred_writer()
    assert bad is not None and bad[0] == "blocks.1.mlp.proj.bias"


def test_canonical_config_round_trips_through_json(h, arch):
    cfg = h.make_tiny(arch).canonical().config
    assert CanonicalConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="unknown transformer config keys"):
        CanonicalConfig.from_json({**cfg.to_json(), "bogus": 1})
    with pytest.raises(ValueError, match="unknown task"):
        cfg.replace(task="seq2seq")


def test_rms_norm_commutes_with_orthogonal_maps():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, generator=g)
    o = OrthogonalGroup(7).random(g).matrix()
    torch.testing.assert_close(rms_norm(x @ o.T, 1e-5), rms_norm(x, 1e-5) @ o.T)


def test_to_circuit_is_idempotent(h):
    circuit = to_circuit(h.make_tiny("vit").canonical())
    assert to_circuit(circuit) is circuit
    spec = circuit.spec
    assert spec.spaces["heads.0"] == PermutationGroup(circuit.config.n_head)
    assert not any(r in ("qk", "ov") for r in spec.roles.values())


# -- GPT-2 whose final LayerNorm has a zero, or a tiny entry, in gamma ---------------------


@pytest.fixture(params=[0.0, 1e-4], ids=["zero", "tiny"])
def gpt2_zero_gamma(h, request):
    """γ_3 of ln_f is 0, or 1e-4 times the rest's rms: β/γ would be ill conditioned."""
    tiny = h.make_tiny("gpt2", tied=True)
    with torch.no_grad():
        gamma = tiny.stock.transformer.ln_f.weight
        gamma[3] = request.param * gamma.square().mean().sqrt()
    return tiny


def test_well_conditioned_final_gamma_keeps_the_norm_bias(h):
    """A normal γ (and one whose smallest |γ_i| is just above the threshold) keeps β as the
    residual vector norm_f.bias = β/γ, and the model a stock GPT-2."""
    for smallest in (None, 2 * NORM_F_BIAS_MIN_GAMMA):
        tiny = h.make_tiny("gpt2", tied=True)
        if smallest is not None:
            with torch.no_grad():
                gamma = tiny.stock.transformer.ln_f.weight
                gamma[3] = smallest * gamma.square().mean().sqrt()
        canon = tiny.canonical()
        assert canon.config.norm_f_bias and not canon.config.head_bias
        assert "norm_f.bias" in canon.state and "head.bias" not in canon.state
        x = tiny.inputs()
        assert h.rel_diff(tiny.logits(x), h.canonical_output(canon, x)) < F64_TOL
        tiny.importer.to_stock(canon)  # (representable)


def test_zero_final_gamma_uses_head_bias_and_stays_exact(h, gpt2_zero_gamma):
    tiny = gpt2_zero_gamma
    canon = tiny.canonical()
    assert canon.config.head_bias and not canon.config.norm_f_bias
    assert "norm_f.bias" not in canon.state and "head.bias" in canon.state
    x = tiny.inputs()
    ref = tiny.logits(x)
    assert h.rel_diff(ref, h.canonical_output(canon, x)) < F64_TOL
    assert float((ref - h.canonical_output(canon, x)).abs().max()) < F64_TOL
    assert h.rel_diff(ref, h.canonical_output(to_circuit(canon), x)) < F64_TOL
    with pytest.raises(NotRepresentable, match="head bias"):
        tiny.importer.to_stock(canon)


def test_zero_final_gamma_writes_a_glmc_folder(h, gpt2_zero_gamma, tmp_path):
    tiny = gpt2_zero_gamma
    canon = tiny.canonical()
    fmt = write_model(tmp_path, canon)
    assert fmt.startswith("glmc (GPT-2's lm_head has no bias")
    back = load_model(tmp_path, dtype=torch.float64)
    assert back.kind == "glmc"
    x = tiny.inputs()
    assert h.rel_diff(tiny.logits(x), h.canonical_output(back.canonical, x)) < F64_TOL
