"""Rotary decoders (Llama, Mistral, Qwen2, GPT-NeoX): exact canonical forms, their symmetry
group checked against transformers' own classes, and weight matching recovering a symmetry
that the test applies to the stock weights itself (not through glmc's transform code).

The group (per layer): one orthogonal map of the residual stream once the norms' gains are
folded into their readers (fixing the all-ones direction for GPT-NeoX's LayerNorms), a
permutation of the key/value heads, a permutation of the query heads inside each key/value
group, per key/value head a map of its query/key basis that commutes with every rotary
rotation (one complex scalar per frequency pair, rotate-half layout; any invertible map on
GPT-NeoX's unrotated coordinates) and an invertible map of its value basis, and one
permutation of each MLP's units (SwiGLU's gate and up rows and down columns together).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glmc.errors import GlmcError
from glmc.families import importer_for
from glmc.matching.weight import weight_matching
from glmc.tensors import interpolate

F64 = torch.float64
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
VARIANTS = {
    "llama-gqa": ("llama", {}),
    "llama-tied": ("llama", {"n_kv_head": 4, "tied": True}),
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama3-mqa": ("llama", {"n_kv_head": 1, "rope_parameters": LLAMA3}),
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "qwen2-biases-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 4,
                                      "max_window_layers": 1}),
    "neox-parallel": ("gpt_neox", {"use_parallel_residual": True}),
    "neox-sequential-half": ("gpt_neox", {"use_parallel_residual": False, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
}
#: HF's RMSNorm and rotary angles run in float32 even on float64 inputs: the stock logits of
#: the RMSNorm models agree with float64 arithmetic to about 1e-7; GPT-NeoX's to 1e-15.
STOCK_TOL = {"llama": 1e-5, "mistral": 1e-5, "qwen2": 1e-5, "gpt_neox": 1e-10}


@pytest.fixture(params=list(VARIANTS))
def variant(request):
    return request.param


def tiny(h, name: str, seed: int = 0):
    arch, opts = VARIANTS[name]
    return h.make_tiny(arch, seed=seed, **opts)


def tokens(n: int = 3, t: int = 12, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


# -- canonical form --------------------------------------------------------------------------


def test_canonical_form_computes_the_stock_function(h, variant):
    t = tiny(h, variant)
    x = tokens()  # (12 positions: longer than every sliding window above)
    canon = t.canonical()
    assert h.rel_diff(t.logits(x), h.canonical_output(canon, x)) < STOCK_TOL[t.arch]
    assert canon.config.stock_norm == ("layernorm" if t.arch == "gpt_neox" else "rmsnorm")
    assert canon.spec.export == ({"res": "fix_ones"} if t.arch == "gpt_neox" else {})


def test_export_loads_strictly_into_the_stock_class(h, variant):
    t = tiny(h, variant)
    canon = t.canonical()
    hf, state = t.importer.to_stock(canon)
    stock = t.importer.stock_model(hf).to(F64)
    stock.load_state_dict(state, strict=True)
    x = tokens()
    with torch.no_grad():
        back = t.importer.stock_logits(stock, x)
    assert h.rel_diff(t.logits(x), back) < STOCK_TOL[t.arch]
    assert not hf.tie_word_embeddings  # (the final norm's gain folded into the head)


def test_the_spec_nests_query_heads_inside_their_key_value_group(h):
    spec = tiny(h, "llama-gqa").canonical().spec  # 4 query heads, 2 key/value heads
    assert spec.axes["blocks.0.attn.q.weight"][0] == (("qk.0", "out"), ("qheads.0", "out"),
                                                      ("heads.0", "out"))
    assert spec.axes["blocks.0.attn.k.weight"][0] == (("qk.0", "in"), ("heads.0", "in"))
    assert spec.axes["blocks.0.attn.o.weight"][1] == (("ov.0", "in"), ("qheads.0", "in"),
                                                      ("heads.0", "in"))
    assert spec.spaces["qk.0"].kind == "rotary" and spec.spaces["qheads.0"].groups == 2
    assert spec.axes["blocks.0.mlp.gate.weight"][0] == (("mlp.0", "out"),)


# -- the symmetry group, checked on transformers' classes -----------------------------------


def head_view(w: torch.Tensor, heads: int, dh: int) -> torch.Tensor:
    """Rows (heads·dh, ·) as (heads, dh, ·)."""
    return w.reshape(heads, dh, *w.shape[1:])


def invertible(k: int, g: torch.Generator) -> torch.Tensor:
    """A well-conditioned invertible (k, k) map: singular values in [e^-0.5, e^0.5]."""
    q1, _ = torch.linalg.qr(torch.randn(k, k, generator=g, dtype=F64))
    q2, _ = torch.linalg.qr(torch.randn(k, k, generator=g, dtype=F64))
    return q1 @ torch.diag(torch.exp(torch.rand(k, generator=g, dtype=F64) - 0.5)) @ q2


def commutant(rotary: int, dh: int, g: torch.Generator) -> torch.Tensor:
    """A random (dh, dh) map commuting with every rotary rotation, built by the test: a
    complex scalar on each pair (i, i + rotary/2), an invertible map on the other coords."""
    m = torch.zeros(dh, dh, dtype=F64)
    half = rotary // 2
    for i in range(half):
        scale = math.exp(float(torch.rand(1, generator=g)) - 0.5)
        angle = 2 * math.pi * float(torch.rand(1, generator=g))
        a, b = scale * math.cos(angle), scale * math.sin(angle)
        m[i, i], m[i + half, i + half], m[i, i + half], m[i + half, i] = a, a, -b, b
    if dh > rotary:
        m[rotary:, rotary:] = invertible(dh - rotary, g)
    return m


def qk_names(arch: str, i: int) -> tuple[str, str] | None:
    return None if arch == "gpt_neox" else (f"model.layers.{i}.self_attn.q_proj",
                                            f"model.layers.{i}.self_attn.k_proj")


def map_qk(t, state: dict, m: torch.Tensor) -> dict:
    """The stock state with layer 0's query rows of every head times ``m`` and its key rows
    times m⁻ᵀ (each key/value head's map read by each query head of its group)."""
    c = t.hf_config
    h = c.num_attention_heads
    dh = c.hidden_size // h
    out = dict(state)
    if t.arch == "gpt_neox":  # (fused: per head the rows of q, then k, then v)
        name = "gpt_neox.layers.0.attention.query_key_value"
        for kind in ("weight", "bias"):
            w = head_view(state[f"{name}.{kind}"], h, 3 * dh).clone()
            w[:, :dh] = torch.einsum("ij,hj...->hi...", m, w[:, :dh])
            w[:, dh:2 * dh] = torch.einsum("ij,hj...->hi...", torch.linalg.inv(m).T,
                                           w[:, dh:2 * dh])
            out[f"{name}.{kind}"] = w.reshape(state[f"{name}.{kind}"].shape)
        return out
    q, k = qk_names(t.arch, 0)
    kv = c.num_key_value_heads
    for name, heads, a in ((q, h, m), (k, kv, torch.linalg.inv(m).T)):
        for kind in ("weight", "bias"):
            if f"{name}.{kind}" in state:
                w = head_view(state[f"{name}.{kind}"], heads, dh)
                out[f"{name}.{kind}"] = torch.einsum("ij,hj...->hi...", a, w).reshape(
                    state[f"{name}.{kind}"].shape)
    return out


def stock_logits(t, state: dict, x: torch.Tensor, hf_config=None) -> torch.Tensor:
    model = t.importer.stock_model(hf_config or t.hf_config).to(F64)
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        return t.importer.stock_logits(model, x)


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(["llama-gqa", "qwen2-biases-window", "neox-parallel",
                             "neox-sequential-half"]), seed=st.integers(0, 2**31 - 1))
def test_rotary_commuting_qk_maps_keep_the_function_and_general_ones_do_not(h, name, seed):
    """The spec can never silently allow a map that is not a symmetry: a general invertible
    query/key map changes the stock model's logits; one that commutes with the rotations
    keeps them (to float64 precision in GPT-NeoX, whose norms run in float64)."""
    t = tiny(h, name)
    c = t.hf_config
    dh = c.hidden_size // c.num_attention_heads
    rotary = int(dh * c.rope_parameters.get("partial_rotary_factor", 1.0))
    g = torch.Generator().manual_seed(seed)
    x = tokens(t=10)
    ref = stock_logits(t, t.state(), x)
    kept = stock_logits(t, map_qk(t, t.state(), commutant(rotary, dh, g)), x)
    assert h.rel_diff(ref, kept) < (1e-12 if t.arch == "gpt_neox" else 1e-6)
    general = torch.eye(dh, dtype=F64) + 0.3 * torch.randn(dh, dh, generator=g, dtype=F64)
    changed = stock_logits(t, map_qk(t, t.state(), general), x)
    assert h.rel_diff(ref, changed) > 1e-3
    if rotary >= 4:  # a rotation of the adjacent coordinates (0, 1), not a frequency pair
        adjacent = torch.eye(dh, dtype=F64)
        adjacent[:2, :2] = torch.tensor([[0.6, -0.8], [0.8, 0.6]], dtype=F64)
        assert h.rel_diff(ref, stock_logits(t, map_qk(t, t.state(), adjacent), x)) > 1e-3


# -- planted pairs: a symmetry applied by the test to the stock weights ----------------------


def folded(t) -> dict:
    """The stock state with every norm's gain folded into the linear layers after it (and
    a LayerNorm's bias into their biases), the norms left at gain 1 and bias 0: the same
    function, in the form where the residual stream carries an orthogonal map."""
    s = {k: v.clone() for k, v in t.state().items()}
    c = t.hf_config
    if t.arch == "gpt_neox":
        readers = {"input_layernorm": ["attention.query_key_value"],
                   "post_attention_layernorm": ["mlp.dense_h_to_4h"]}
        prefix, final, head = "gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head"
    else:
        readers = {"input_layernorm": [f"self_attn.{n}_proj" for n in "qkv"],
                   "post_attention_layernorm": ["mlp.gate_proj", "mlp.up_proj"]}
        prefix, final, head = "model.layers", "model.norm", "lm_head"
    if c.tie_word_embeddings:
        s[f"{head}.weight"] = s["model.embed_tokens.weight"].clone()
    norms = [(f"{prefix}.{i}.{ln}", [f"{prefix}.{i}.{r}" for r in rs])
             for i in range(c.num_hidden_layers) for ln, rs in readers.items()]
    gain = s[f"{final}.weight"]  # (the final norm's β stays with it, as β/γ: the head has no
    s[f"{head}.weight"] = s[f"{head}.weight"] * gain[None, :]  # bias to take it)
    if f"{final}.bias" in s:
        s[f"{final}.bias"] = s[f"{final}.bias"] / gain
    s[f"{final}.weight"] = torch.ones_like(gain)
    for norm, rs in norms:
        gain, beta = s[f"{norm}.weight"], s.get(f"{norm}.bias")
        for r in rs:
            if beta is not None:
                b = s.get(f"{r}.bias", torch.zeros(s[f"{r}.weight"].shape[0], dtype=F64))
                s[f"{r}.bias"] = b + s[f"{r}.weight"] @ beta
            s[f"{r}.weight"] = s[f"{r}.weight"] * gain[None, :]
        s[f"{norm}.weight"] = torch.ones_like(gain)
        if beta is not None:
            s[f"{norm}.bias"] = torch.zeros_like(beta)
    return s


def residual_map(d: int, fix_ones: bool, g: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=F64))
    o = q * torch.sign(torch.diagonal(r))
    if not fix_ones:
        return o
    u = torch.ones(d, dtype=F64) / d**0.5  # a Householder reflection sends e0 to u ...
    v = u - torch.eye(d, dtype=F64)[0]
    hh = torch.eye(d, dtype=F64) - 2 * torch.outer(v, v) / v.dot(v)
    small = o[1:, 1:]
    small, rr = torch.linalg.qr(small)
    small = small * torch.sign(torch.diagonal(rr))
    inner = torch.block_diag(torch.ones(1, dtype=F64), small)
    return hh @ inner @ hh  # ... so this fixes u (and the all-ones direction)


def planted(t, g: torch.Generator) -> dict:
    """B = g·A for a random element g of the group, applied to A's folded stock weights by
    this test (see the module's docstring for the group)."""
    c = t.hf_config
    s = folded(t)
    d, h = c.hidden_size, c.num_attention_heads
    dh = d // h
    neox = t.arch == "gpt_neox"
    kv = h if neox else c.num_key_value_heads
    rep = h // kv
    rotary = int(dh * c.rope_parameters.get("partial_rotary_factor", 1.0))
    o = residual_map(d, fix_ones=neox, g=g)
    embed, head = ("gpt_neox.embed_in.weight" if neox else "model.embed_tokens.weight",
                   "lm_head.weight")
    s[embed] = s[embed] @ o.T
    s[head] = s[head] @ o.T
    if neox:  # (the final norm's bias is a vector of the stream)
        s["gpt_neox.final_layer_norm.bias"] = o @ s["gpt_neox.final_layer_norm.bias"]
    for i in range(c.num_hidden_layers):
        sigma = torch.randperm(kv, generator=g)
        tau = [torch.randperm(rep, generator=g) for _ in range(kv)]
        qmaps = [commutant(rotary, dh, g) for _ in range(kv)]
        vmaps = [invertible(dh, g) for _ in range(kv)]
        mlp = torch.randperm(c.intermediate_size, generator=g)

        def heads_out(w: torch.Tensor, maps: list, per: int, order: list | None,
                      sigma: torch.Tensor = sigma) -> torch.Tensor:
            """Rows of kv·per heads: head (j, r) mapped by maps[j]; new group jj holds old
            group sigma[jj], its slot r old slot order[sigma[jj]][r]."""
            x = w.reshape(kv, per, dh, *w.shape[1:])
            x = torch.stack([torch.einsum("ab,rb...->ra...", maps[j], x[j]) for j in range(kv)])
            x = torch.stack([x[j][order[j]] if order is not None else x[j] for j in range(kv)])
            return x[sigma].reshape(w.shape)

        if neox:
            p = f"gpt_neox.layers.{i}"
            for kind in ("weight", "bias"):
                w = s[f"{p}.attention.query_key_value.{kind}"].reshape(h, 3, dh, *(
                    (d,) if kind == "weight" else ()))
                rest = w.shape[3:]
                parts = [heads_out(w[:, j].reshape(h * dh, *rest), ms, 1, None).reshape(
                    h, dh, *rest) for j, ms in enumerate(
                        (qmaps, [torch.linalg.inv(m).T for m in qmaps], vmaps))]
                w = torch.stack(parts, dim=1)
                if kind == "weight":
                    w = w @ o.T
                s[f"{p}.attention.query_key_value.{kind}"] = w.reshape(-1, *((d,) if kind ==
                                                                             "weight" else ()))
            dense = s[f"{p}.attention.dense.weight"]
            cols = heads_out(dense.T, [torch.linalg.inv(m).T for m in vmaps], 1, None).T
            s[f"{p}.attention.dense.weight"] = o @ cols
            s[f"{p}.attention.dense.bias"] = o @ s[f"{p}.attention.dense.bias"]
            fc, proj = f"{p}.mlp.dense_h_to_4h", f"{p}.mlp.dense_4h_to_h"
            s[f"{fc}.weight"] = s[f"{fc}.weight"][mlp] @ o.T
            s[f"{fc}.bias"] = s[f"{fc}.bias"][mlp]
            s[f"{proj}.weight"] = o @ s[f"{proj}.weight"][:, mlp]
            s[f"{proj}.bias"] = o @ s[f"{proj}.bias"]
            continue
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        for n, maps, per in (("q", qmaps, rep), ("k", [torch.linalg.inv(m).T for m in qmaps], 1),
                             ("v", vmaps, 1)):
            for kind in ("weight", "bias"):
                key = f"{a}.{n}_proj.{kind}"
                if key in s:
                    w = heads_out(s[key], maps, per, tau if per > 1 else None)
                    s[key] = w @ o.T if kind == "weight" else w
        ow = s[f"{a}.o_proj.weight"]
        cols = heads_out(ow.T, [torch.linalg.inv(m).T for m in vmaps], rep,
                         tau if rep > 1 else None).T
        s[f"{a}.o_proj.weight"] = o @ cols
        if f"{a}.o_proj.bias" in s:
            s[f"{a}.o_proj.bias"] = o @ s[f"{a}.o_proj.bias"]
        for n in ("gate", "up"):
            s[f"{p}.mlp.{n}_proj.weight"] = s[f"{p}.mlp.{n}_proj.weight"][mlp] @ o.T
            if f"{p}.mlp.{n}_proj.bias" in s:
                s[f"{p}.mlp.{n}_proj.bias"] = s[f"{p}.mlp.{n}_proj.bias"][mlp]
        s[f"{p}.mlp.down_proj.weight"] = o @ s[f"{p}.mlp.down_proj.weight"][:, mlp]
        if f"{p}.mlp.down_proj.bias" in s:
            s[f"{p}.mlp.down_proj.bias"] = o @ s[f"{p}.mlp.down_proj.bias"]
    return s


def test_planted_pair_is_recovered_exactly(h, variant):
    """B is A moved by a random element of the whole group (applied here, to the stock
    weights): B computes A's function, and weight matching brings B back onto A."""
    t = tiny(h, variant)
    b_state = planted(t, torch.Generator().manual_seed(7))
    imp = t.importer
    cfg, _ = imp.untied(t.hf_config, b_state)  # (B's head is no longer its embedding)
    x = tokens()
    assert h.rel_diff(t.logits(x), stock_logits(t, b_state, x, cfg)) < STOCK_TOL[t.arch]
    a = t.canonical()
    b = imp.to_canonical(cfg, b_state)
    assert h.rel_weight_distance(a, b) > 0.5  # (the plant moved every tensor)
    result = weight_matching(a, b)
    aligned = b.transformed(result.transform)
    assert h.rel_weight_distance(a, aligned) < 1e-5
    midpoint = a.with_state(interpolate(a.state, aligned.state, 0.5))
    assert h.rel_diff(h.canonical_output(a, x), h.canonical_output(midpoint, x)) < 1e-6


def test_weight_matching_of_an_unrelated_pair_is_a_descent(h):
    """With the default options (units assigned by angle, heads by balanced maps) every
    iteration's distance is at most the one before."""
    a = tiny(h, "llama-gqa", seed=0).canonical()
    b = tiny(h, "llama-gqa", seed=1).canonical()
    trace = weight_matching(a, b).trace
    ds = [row["distance"] for row in trace]
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in zip(ds, ds[1:], strict=False))


# -- bad input ------------------------------------------------------------------------------


def save_stock(t, folder) -> None:
    model = t.importer.stock_model(t.hf_config).float()
    model.load_state_dict({k: v.float() for k, v in t.state().items()})
    model.save_pretrained(str(folder))


@pytest.mark.parametrize(("edit", "message"), [
    ({"qk_layernorm": True}, "config field 'qk_layernorm' is not one glmc knows"),
    ({"use_alibi": True}, "config field 'use_alibi' is not one glmc knows"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}},
     "rope_parameters.rope_type 'dynamic' is not supported"),
    ({"num_key_value_heads": 3}, "num_key_value_heads 3 does not divide num_attention_heads 4"),
])
def test_unsupported_variants_are_refused_naming_the_field(h, tmp_path, edit, message):
    import json

    from glmc.io.folders import load_model

    save_stock(tiny(h, "llama-gqa"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **edit}))
    with pytest.raises(GlmcError, match=message.replace("(", r"\(")):
        load_model(tmp_path)


def test_importers_are_declared_for_every_rotary_class():
    for t in ("llama", "mistral", "qwen2", "gpt_neox"):
        assert importer_for(t).name == t


# -- real checkpoints: dtypes, shards, their own tokenizer -----------------------------------


def save_llama(h, folder, seed: int, dtype=torch.float32, **save_kw) -> None:
    t = tiny(h, "llama-gqa", seed=seed)
    model = t.importer.stock_model(t.hf_config)
    model.load_state_dict({k: v.float() for k, v in t.state().items()})
    model.to(dtype).save_pretrained(str(folder), **save_kw)


def test_a_bfloat16_pair_comes_back_in_bfloat16_certified_as_written(h, tmp_path):
    """Matched in float32, written in the checkpoint's own dtype (the same size), loadable
    with AutoModelForCausalLM; the certificate is that of the folder as written, which is
    what from_pretrained loads."""
    import json

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from glmc.cli.main import main
    from glmc.verify import random_inputs

    for name, seed in (("a", 0), ("b", 1)):
        save_llama(h, tmp_path / name, seed, dtype=torch.bfloat16)
    out = tmp_path / "out"
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert dtypes == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    size_b = (tmp_path / "b" / "model.safetensors").stat().st_size
    assert (out / "model.safetensors").stat().st_size < 1.1 * size_b
    cert = json.loads((out / "glmc_report.json").read_text())["certificate"]
    assert cert["stored_dtype"] == "bfloat16" and cert["equal"]
    loaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).double()
    b = AutoModelForCausalLM.from_pretrained(str(tmp_path / "b"), local_files_only=True).double()
    x = random_inputs(glmc_config(tmp_path / "b"))
    with torch.no_grad():
        got, want = loaded(input_ids=x).logits, b(input_ids=x).logits
    measured = float((got - want).abs().max())
    assert measured == pytest.approx(cert["max_abs_diff"], rel=1e-3, abs=1e-5)
    assert measured > 0  # (bfloat16 rounding of the aligned weights shows, and is reported)


def glmc_config(folder):
    from glmc.io.folders import load_model

    return load_model(folder).canonical.config


def test_sharded_checkpoints_load_and_a_missing_shard_is_named(h, tmp_path):
    from glmc.io.folders import load_model

    save_llama(h, tmp_path / "a", 0, max_shard_size="20KB")
    shards = sorted((tmp_path / "a").glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "a" / "model.safetensors.index.json").is_file()
    whole = tmp_path / "whole"
    save_llama(h, whole, 0)
    for k, v in load_model(whole).canonical.state.items():
        assert torch.equal(load_model(tmp_path / "a").canonical.state[k], v), k
    shards[1].unlink()
    with pytest.raises(GlmcError, match=f"{shards[1].name}: shard named in "
                                        "model.safetensors.index.json is missing"):
        load_model(tmp_path / "a")


def char_tokenizer_json(text: str, extra: int = 0) -> str:
    """A Hugging Face tokenizer.json with one token per character of ``text`` (and ``extra``
    unused ones)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    for i in range(extra):
        vocab[f"<extra{i}>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=next(iter(vocab))))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    return tok.to_str()


def test_a_checkpoints_own_tokenizer_reads_text_and_travels_to_outputs(h, tmp_path):
    """A folder's tokenizer.json (read by the tokenizers package) encodes text for
    evaluation; outputs carry it; one with more tokens than the model's embedding is refused."""
    from glmc.cli.main import main

    text = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to "
            "suffer\n") * 40
    (tmp_path / "text.txt").write_text(text)
    tok = char_tokenizer_json(text)
    for name, seed in (("a", 0), ("b", 1)):
        save_llama(h, tmp_path / name, seed)
        (tmp_path / name / "tokenizer.json").write_text(tok)
    rc = main(["barrier", str(tmp_path / "a"), str(tmp_path / "b"), "--data",
               str(tmp_path / "text.txt"), "--align", "weight", "--points", "3", "--json"])
    assert rc == 0
    out = tmp_path / "out"
    assert main(["align", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    assert (out / "tokenizer.json").read_text() == tok
    big = char_tokenizer_json(text, extra=60)  # (more tokens than the model's 50)
    for name in ("a", "b"):
        (tmp_path / name / "tokenizer.json").write_text(big)
    rc = main(["barrier", str(tmp_path / "a"), str(tmp_path / "b"), "--data",
               str(tmp_path / "text.txt"), "--points", "3"])
    assert rc == 2
