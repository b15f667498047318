"""The symmetry spec of a canonical transformer, as a table.

Spaces, per layer i:

- ``res``: the residual stream, orthogonal (a LayerNorm model's must fix the all-ones
  direction to be written back as its stock class: ``export``);
- ``mlp.{i}``: the hidden units, a permutation (a gated MLP's gate and up rows and down
  columns share it);
- ``heads.{i}``: the order of the key/value heads (of the heads, without grouped-query
  attention), a permutation of head-sized chunks; with grouped-query attention each chunk of
  the query rows holds the group's query heads, which ``qheads.{i}`` reorders among themselves;
- ``qk.{i}`` / ``ov.{i}`` (head form): each key/value head's inner bases, one map per key/value
  head acting on its key (value) rows and on every query head (output column) of its group:
  invertible, or for rotary positions the maps that commute with every rotation
  (:class:`~glmc.symmetry.groups.RotaryGroup`).

An axis lists its spaces inner first: a query row carries the QK map, then the query heads'
order in their group, then the groups' order.

A post-norm encoder's stream is read and written through LayerNorms whose gain and bias stay
on it, so ``res`` is a permutation there (every LayerNorm's gain and bias move with it); the
masked-LM head's transform units are ``head`` (the stream's own map when the head is tied to
the token embedding) and the classifier's pooled units ``pool``, both permutations.
"""

from __future__ import annotations

from glmc.families.transformer.model import CanonicalConfig
from glmc.symmetry.groups import (
    BlockInvertibleGroup,
    Group,
    GroupedPermutationGroup,
    OrthogonalGroup,
    PermutationGroup,
    RotaryGroup,
)
from glmc.symmetry.spec import AxisTag, SymmetrySpec, inp, out

RES = "res"
Axes = dict[str, tuple[AxisTag, ...]]


def _norm_axes(name: str, space: str = RES) -> Axes:
    return {f"{name}.weight": (out(space),), f"{name}.bias": (out(space),)}


def _embedding_axes(cfg: CanonicalConfig) -> Axes:
    if cfg.encoder:
        return {"embed.tok": (None, out(RES)), "embed.pos": (None, out(RES)),
                "embed.token_type": (None, out(RES)), **_norm_axes("embed.norm")}
    if cfg.task == "causal_lm":
        axes: Axes = {"embed.tok": (None, out(RES))}
        if cfg.learned_positions:
            axes["embed.pos"] = (None, out(RES))
        return axes
    return {
        "embed.patch.weight": (out(RES), None, None, None),
        "embed.patch.bias": (out(RES),),
        "embed.cls": (out(RES),),
        "embed.pos": (None, out(RES)),
    }


def _with_biases(axes: Axes, biased: dict[str, bool]) -> Axes:
    """``axes`` plus each ``*.weight``'s bias (its output axis) where ``biased`` says so."""
    out_axes = dict(axes)
    for name, tags in axes.items():
        prefix = name.removesuffix(".weight")
        if biased.get(prefix.rsplit(".", 1)[-1]):
            out_axes[f"{prefix}.bias"] = (tags[0],)
    return out_axes


def _attention_axes(cfg: CanonicalConfig, i: int) -> Axes:
    a, heads = f"blocks.{i}.attn", f"heads.{i}"
    if cfg.attention == "circuit":
        return {
            f"{a}.qk.weight": (out(heads), inp(RES), inp(RES)),  # (H, d_key, d_query)
            f"{a}.qk.bias": (out(heads), inp(RES)),
            f"{a}.ov.weight": (out(heads), out(RES), inp(RES)),  # (H, d_out, d_in)
            f"{a}.o.bias": (out(RES),),
        }
    qk, ov = f"qk.{i}", f"ov.{i}"
    # Query heads are reordered inside their key/value group when a group holds several.
    query = (qk, f"qheads.{i}", heads) if cfg.group_size > 1 else (qk, heads)
    output = (ov, f"qheads.{i}", heads) if cfg.group_size > 1 else (ov, heads)
    axes = {
        f"{a}.q.weight": (out(*query), inp(RES)),
        # Keys pair with queries: they carry the inverse-transpose of the QK inner map.
        f"{a}.k.weight": (inp(qk, heads), inp(RES)),
        f"{a}.v.weight": (out(ov, heads), inp(RES)),
        f"{a}.o.weight": (out(RES), inp(*output)),
    }
    return _with_biases(axes, {"q": cfg.attn_bias, "k": cfg.attn_bias, "v": cfg.attn_bias,
                               "o": cfg.o_bias})


def _mlp_axes(cfg: CanonicalConfig, i: int) -> Axes:
    m, mlp = f"blocks.{i}.mlp", f"mlp.{i}"
    axes = {f"{m}.fc.weight": (out(mlp), inp(RES)),
            f"{m}.proj.weight": (out(RES), inp(mlp))}
    if cfg.mlp == "gated":
        axes[f"{m}.gate.weight"] = (out(mlp), inp(RES))
    return _with_biases(axes, dict.fromkeys(("fc", "gate", "proj"), cfg.mlp_bias))


def _head_spaces(cfg: CanonicalConfig, i: int) -> tuple[dict[str, Group], dict[str, str]]:
    kv, dh = cfg.kv_heads, cfg.head_dim
    if cfg.attention == "circuit":
        return {f"heads.{i}": PermutationGroup(cfg.n_head)}, {f"heads.{i}": "heads"}
    qk = (RotaryGroup(kv, dh, cfg.rotary_dim) if cfg.rotary_dim
          else BlockInvertibleGroup(kv, dh))
    spaces: dict[str, Group] = {f"heads.{i}": PermutationGroup(kv), f"qk.{i}": qk,
                                f"ov.{i}": BlockInvertibleGroup(kv, dh)}
    roles = {f"heads.{i}": "heads", f"qk.{i}": "qk", f"ov.{i}": "ov"}
    if cfg.group_size > 1:
        spaces[f"qheads.{i}"] = GroupedPermutationGroup(cfg.n_head, groups=kv)
        roles[f"qheads.{i}"] = "qheads"
    return spaces, roles


def _encoder_head(cfg: CanonicalConfig) -> tuple[dict[str, Group], Axes]:
    """The spaces and axes of an encoder's head (``head`` or ``pool`` units, a permutation
    each; a tied masked-LM head's units are the stream's)."""
    d = cfg.d_model
    if cfg.task == "masked_lm":
        units = RES if cfg.tied_head else "head"
        axes: Axes = {"head.dense.weight": (out(units), inp(RES)), "head.dense.bias": (out(units),),
                      **_norm_axes("head.norm", units),
                      "head.weight": (None, inp(units)), "head.bias": (None,)}
        return ({} if cfg.tied_head else {units: PermutationGroup(d)}), axes
    if cfg.task == "features":  # (the pooler's output is an output: its units stay)
        return {}, {"pool.weight": (None, inp(RES)), "pool.bias": (None,)}
    axes = {"pool.weight": (out("pool"), inp(RES)), "pool.bias": (out("pool"),),
            "head.weight": (None, inp("pool")), "head.bias": (None,)}
    return {"pool": PermutationGroup(d)}, axes


def canonical_spec(cfg: CanonicalConfig) -> SymmetrySpec:
    post = cfg.norm_position == "post"
    spaces: dict[str, Group] = {RES: PermutationGroup(cfg.d_model) if post
                                else OrthogonalGroup(cfg.d_model)}
    roles = {RES: "residual"}
    axes = _embedding_axes(cfg)
    for i in range(cfg.n_layer):
        spaces[f"mlp.{i}"] = PermutationGroup(cfg.d_mlp)
        roles[f"mlp.{i}"] = "mlp"
        head_spaces, head_roles = _head_spaces(cfg, i)
        spaces |= head_spaces
        roles |= head_roles
        axes |= _attention_axes(cfg, i)
        axes |= _mlp_axes(cfg, i)
        if post:
            axes |= _norm_axes(f"blocks.{i}.norm1") | _norm_axes(f"blocks.{i}.norm2")
    if cfg.encoder:
        head_spaces, head_axes = _encoder_head(cfg)
        spaces |= head_spaces
        roles |= dict.fromkeys(head_spaces, "head")
        output = out(RES) if cfg.task == "features" else None  # (the stream itself)
        return SymmetrySpec(spaces=spaces, axes=axes | head_axes, roles=roles, export={},
                            output=output)
    if cfg.norm_f_bias:
        axes["norm_f.bias"] = (out(RES),)
    axes["head.weight"] = (None, inp(RES))
    if cfg.head_bias:
        axes["head.bias"] = (None,)
    # (a LayerNorm model stays one only if the residual map fixes the all-ones direction)
    export = {RES: "fix_ones"} if cfg.stock_norm == "layernorm" else {}
    return SymmetrySpec(spaces=spaces, axes=axes, roles=roles, export=export)
