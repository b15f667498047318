"""Property tests: random elements of the symmetry group preserve the function.

Over random tiny GPT-2 and ViT configurations with random (non-trivial) LayerNorm affines,
the canonical model moved by a random group element computes the stock model's logits:
float64 to ~1e-9 of the logit scale, float32 to ~1e-4.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glmc.families.transformer.circuit import to_circuit
from glmc.symmetry.groups import Matrix
from glmc.symmetry.transform import Transform

F64_TOL, F32_TOL = 1e-9, 1e-4


@st.composite
def tiny_configs(draw, arch: str | None = None) -> tuple[str, dict]:
    """(arch, config options): 1-3 layers, 1-4 heads, width 8-64 divisible by the heads."""
    arch = arch or draw(st.sampled_from(["gpt2", "vit"]))
    n_head = draw(st.integers(1, 4))
    head_dim = draw(st.integers(max(1, -(-8 // n_head)), 64 // n_head))
    d = n_head * head_dim
    opts = {"n_layer": draw(st.integers(1, 3)), "d": d, "n_head": n_head,
            "seed": draw(st.integers(0, 2**16))}
    if arch == "gpt2":
        opts |= {"tied": draw(st.booleans()), "n_positions": 8, "vocab": draw(st.integers(5, 40)),
                 "n_inner": draw(st.sampled_from([None, 2 * d]))}
    else:
        opts |= {"qkv_bias": draw(st.booleans()), "d_mlp": draw(st.sampled_from([d, 2 * d])),
                 "image_size": 8, "patch_size": draw(st.sampled_from([4, 8]))}
    return arch, opts


#: Which spaces a case moves (by role) and the subgroups it draws from.
CASES = {
    "residual-permutation": ({"residual"}, {"residual": "permutation"}),
    "residual-orthogonal": ({"residual"}, {}),
    "residual-fix-ones": ({"residual"}, {"residual": "fix_ones"}),
    "heads-inner-invertible": ({"heads", "qk", "ov"}, {}),
    "heads-inner-orthogonal": ({"heads", "qk", "ov"}, {"qk": "orthogonal", "ov": "orthogonal"}),
    "inner-only": ({"qk", "ov"}, {}),
    "mlp-permutation": ({"mlp"}, {}),
    "full-group": ({"residual", "heads", "qk", "ov", "mlp"}, {}),
}


def random_element(spec, seed: int, roles: set[str], subgroups: dict) -> Transform:
    g = torch.Generator().manual_seed(seed)
    t = Transform.random(spec, g, subgroups=subgroups)
    kept = {k: e for k, e in t.elements.items() if spec.roles.get(k) in roles}
    assert kept, "the case moves no space"
    return Transform(kept)


def check(h, arch: str, opts: dict, case: str, g_seed: int, dtype: torch.dtype, circuit=False):
    tiny = h.make_tiny(arch, dtype=dtype, **opts)
    x = tiny.inputs(n=2)
    ref = tiny.logits(x)
    model = tiny.canonical()
    if circuit:
        model = to_circuit(model)
    roles, subgroups = CASES[case]
    moved = model.transformed(random_element(model.spec, g_seed, roles, subgroups))
    tol = F64_TOL if dtype == torch.float64 else F32_TOL
    assert h.rel_diff(ref, h.canonical_output(moved, x)) < tol
    # The transform moved the weights (the check above is not vacuous).
    assert h.rel_weight_distance(model, moved) > 1e-3


@pytest.mark.parametrize("case", list(CASES))
@settings(max_examples=12)
@given(cfg=tiny_configs(), g_seed=st.integers(0, 2**16))
def test_group_elements_preserve_function_float64(h, case, cfg, g_seed):
    arch, opts = cfg
    check(h, arch, opts, case, g_seed, torch.float64)


@pytest.mark.parametrize("case", ["residual-orthogonal", "heads-inner-invertible", "full-group"])
@settings(max_examples=8)
@given(cfg=tiny_configs(), g_seed=st.integers(0, 2**16))
def test_group_elements_preserve_function_float32(h, case, cfg, g_seed):
    arch, opts = cfg
    check(h, arch, opts, case, g_seed, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@settings(max_examples=10)
@given(cfg=tiny_configs(), g_seed=st.integers(0, 2**16))
def test_circuit_form_group_elements_preserve_function(h, dtype, cfg, g_seed):
    """Circuit form: residual orthogonal, head permutations, MLP permutations."""
    arch, opts = cfg
    check(h, arch, opts, "full-group", g_seed, dtype, circuit=True)


@pytest.mark.parametrize("arch", ["gpt2", "vit"])
def test_map_outside_the_group_changes_the_function(h, arch):
    """Control: the harness detects a broken symmetry (an invertible, non-orthogonal map of
    the residual stream does not commute with RMSNorm)."""
    tiny = h.make_tiny(arch)
    model = tiny.canonical()
    g = torch.Generator().manual_seed(0)
    d = model.config.d_model
    m = torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(d, d, generator=g,
                                                              dtype=torch.float64) / d**0.5
    moved = model.transformed(Transform({"res": Matrix(m, orthogonal=False)}))
    x = tiny.inputs(n=2)
    assert h.rel_diff(tiny.logits(x), h.canonical_output(moved, x)) > 1e-3
