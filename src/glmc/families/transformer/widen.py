"""A narrower pre-norm transformer embedded exactly into a wider one's shapes.

B's residual width d_B, heads (key/value heads and the query heads of each group), head
dimension and MLP width may each be at most A's; everything else (depth, task, vocabulary,
positions, norms, activation, biases, rotary layout) must agree. The embedding pads every
axis with zeros and keeps B's function:

- MLP units and heads beyond B's are zero: act(0) = 0 (GELU, ReLU, SiLU), and a zero head's
  value and output are zero;
- the head dimension is padded with zero coordinates, which add nothing to a score; B's
  score scale is kept by scaling its queries by s_B / s_A;
- the residual stream lives in its first d_B coordinates, scaled by c = √(d_A / d_B): a
  weightless RMSNorm over d_A coordinates then gives c·RMSNorm_B(x) on them, eps included
  (mean_A((cx)²) = mean_B(x²)), so every reader of a norm is divided by c and every writer
  (embeddings, attention and MLP outputs, their biases, the final norm's bias) multiplied by
  c. A centred stream stays centred over d_A (its padding is zero), so a LayerNorm model's
  embedding is written back as A's stock class.

Aligning the embedded B to A with an orthogonal residual map is aligning B's stream to a
d_B-dimensional subspace of A's: a rectangular map with orthonormal columns.

Not all of the padding must be zero: only what writes. A padded unit's or head's inputs (its
rows in the fc/gate, query, key and value projections) are never read, since its output
columns are zero; nor are the readers' columns on the padded stream, which is zero; nor a
query's padded head dimensions, since the key's are zero. These entries are B's *free* ones
(``CanonicalModel.free``): aligned to A, B takes A's values there (brought back through the
transform), which changes nothing of B's function and makes the path between the two keep
A's units whole (their inputs are A's at every λ, their outputs scaled by λ) instead of
fading their inputs and outputs together.
"""

from __future__ import annotations

import math

import torch

from glmc.errors import GlmcError
from glmc.families.transformer.model import CanonicalConfig
from glmc.model import CanonicalModel
from glmc.tensors import StateDict, pad_to

#: The sizes that may be smaller in B than in A.
SIZES = ("d_model", "d_mlp", "head_dim", "kv_heads", "group_size")
#: Fields that only follow from the sizes, or say where the model came from.
_FOLLOWING = {"d_model", "d_mlp", "head_dim", "n_head", "n_kv_head", "attn_scale", "source"}


def check_narrower(a: CanonicalConfig, b: CanonicalConfig, where: str = "") -> None:
    """Raise GlmcError unless B fits into A's shapes (see the module's docstring)."""
    at = f"{where}: " if where else ""
    if b.norm_position != "pre":
        raise GlmcError(f"{at}a post-LayerNorm encoder cannot be embedded into a wider one "
                        "(its LayerNorms would see the padding)")
    if b.rotary_dim and b.head_dim != a.head_dim:
        raise GlmcError(f"{at}rotary heads must have the same dimension to be embedded "
                        f"(head_dim {a.head_dim} in A, {b.head_dim} in B)")
    if b.attention != "heads" or a.attention != "heads":
        raise GlmcError(f"{at}models of different widths are aligned in head form (not "
                        "--heads circuit)")
    fields = set(a.to_json()) - _FOLLOWING
    # (in the stock configs' terms where both came from one; else, or where those agree
    # and only the canonical forms differ, in the canonical fields)
    said = a.differences(b) or [f"{k} ({getattr(a, k)} in A, {getattr(b, k)} in B)"
                                for k in sorted(fields | set(SIZES))
                                if getattr(a, k) != getattr(b, k)]
    listed = ", ".join(said[:3]) + (f" and {len(said) - 3} more" if len(said) > 3 else "")
    if any(getattr(b, k) > getattr(a, k) for k in SIZES):
        raise GlmcError(f"{at}B is wider than A (the models differ in {listed}): give the "
                        "wider model as A (swap A and B)")
    # (named as the users' own configs call them: num_hidden_layers, not n_layer)
    other = [f"{a.field_name(k, b)} ({getattr(a, k)} in A, {getattr(b, k)} in B)"
             for k in sorted(fields) if getattr(a, k) != getattr(b, k)]
    if other:
        raise GlmcError(f"{at}the models differ in {', '.join(other[:3])}: only their widths "
                        "(residual, heads, MLP) may differ")


def _heads(x: torch.Tensor, b: CanonicalConfig, a: CanonicalConfig, query: bool) -> torch.Tensor:
    """Rows of heads (n·dh, ...) of B laid out as A's: key/value head j at group j, query
    head r of a group at slot r, each head's coordinates padded."""
    groups_b, per_b = b.kv_heads, (b.group_size if query else 1)
    groups_a, per_a = a.kv_heads, (a.group_size if query else 1)
    rest = x.shape[1:]
    h = x.reshape(groups_b, per_b, b.head_dim, *rest)
    return pad_to(h, (groups_a, per_a, a.head_dim, *rest)).reshape(
        groups_a * per_a * a.head_dim, *rest)


def embed_into(model: CanonicalModel, a: CanonicalConfig, where: str = "") -> CanonicalModel:
    """``model`` (B) as a model of A's config ``a`` that computes B's function, its free
    entries marked (``CanonicalModel.free``): every padded entry but those of the stream's
    writers (which keep the padding at zero) and of the keys' padded head dimensions (the
    queries' take the freedom: a score adds q·k over them)."""
    b = model.config
    check_narrower(a, b, where)
    out = _embedded(model.state, b, a)
    # (the padding is where B's entries, all set to one, do not land)
    used = _embedded({k: torch.ones(v.shape) for k, v in model.state.items()}, b, a)
    key_dims = _heads(torch.ones(b.kv_heads * b.head_dim), b, a, query=False)
    groups = torch.arange(a.kv_heads).repeat_interleave(a.head_dim)
    keep = (key_dims == 0) & (groups < b.kv_heads)  # (the padded dimensions of B's keys)
    free = {}
    for name, ones in used.items():
        if _writes_the_stream(name):
            continue
        mask = ones == 0
        if name.endswith(".k.weight") or name.endswith(".k.bias"):
            mask &= ~keep.reshape(-1, *([1] * (mask.dim() - 1)))
        if mask.any():
            free[name] = mask
    missing = sorted(set(model.state) - set(out))
    if missing:  # (a tensor this embedding does not know: refuse rather than drop it)
        raise GlmcError(f"{where or 'B'}: no embedding into a wider model for {missing[0]}")
    return CanonicalModel(a, out, model.files, free)


def _writes_the_stream(name: str) -> bool:
    return (name.startswith("embed.") or name == "norm_f.bias"
            or any(name.endswith(f".{n}.{p}") for n in ("o", "proj") for p in ("weight", "bias")))


def _embedded(s: StateDict, b: CanonicalConfig, a: CanonicalConfig) -> StateDict:
    """B's tensors ``s`` laid out in A's shapes, padded with zeros (see :func:`embed_into`)."""
    c = math.sqrt(a.d_model / b.d_model)
    q_scale = b.attn_scale / a.attn_scale
    d = a.d_model
    out: StateDict = {}
    for name, x in s.items():
        if name.startswith("embed.") or name == "norm_f.bias":  # writers of the stream
            shape = (d, *x.shape[1:]) if name in ("embed.patch.weight", "embed.patch.bias",
                                                  "embed.cls", "norm_f.bias") else (
                x.shape[0], d)
            out[name] = pad_to(x * c, shape)
        elif name == "head.weight":
            out[name] = pad_to(x / c, (x.shape[0], d))
        elif name == "head.bias":
            out[name] = x
    for i in range(b.n_layer):
        p, m = f"blocks.{i}.attn", f"blocks.{i}.mlp"
        for n, query in (("q", True), ("k", False), ("v", False)):
            scale = q_scale / c if n == "q" else 1 / c
            out[f"{p}.{n}.weight"] = pad_to(_heads(s[f"{p}.{n}.weight"] * scale, b, a, query),
                                          (_heads_rows(a, query), d))
            if f"{p}.{n}.bias" in s:
                bias = s[f"{p}.{n}.bias"] * (q_scale if n == "q" else 1.0)
                out[f"{p}.{n}.bias"] = _heads(bias, b, a, query)
        o = s[f"{p}.o.weight"] * c  # (d_B, H_B·dh_B): columns laid out as the query heads
        out[f"{p}.o.weight"] = pad_to(_heads(o.T, b, a, query=True).T, (d, _heads_rows(a, True)))
        if f"{p}.o.bias" in s:
            out[f"{p}.o.bias"] = pad_to(s[f"{p}.o.bias"] * c, (d,))
        for n in ("fc", "gate"):
            if f"{m}.{n}.weight" in s:
                out[f"{m}.{n}.weight"] = pad_to(s[f"{m}.{n}.weight"] / c, (a.d_mlp, d))
                if f"{m}.{n}.bias" in s:
                    out[f"{m}.{n}.bias"] = pad_to(s[f"{m}.{n}.bias"], (a.d_mlp,))
        out[f"{m}.proj.weight"] = pad_to(s[f"{m}.proj.weight"] * c, (d, a.d_mlp))
        if f"{m}.proj.bias" in s:
            out[f"{m}.proj.bias"] = pad_to(s[f"{m}.proj.bias"] * c, (d,))
    return out


def _heads_rows(cfg: CanonicalConfig, query: bool) -> int:
    return (cfg.n_head if query else cfg.kv_heads) * cfg.head_dim
