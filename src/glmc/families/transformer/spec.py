"""The symmetry spec of a canonical transformer, as a table.

Spaces: ``res`` (residual stream, orthogonal), ``mlp.{i}`` (hidden units, permutation),
``heads.{i}`` (order of heads, block permutation), and in head form ``qk.{i}`` / ``ov.{i}``
(each head's inner bases, invertible per head).
"""

from __future__ import annotations

from glmc.families.transformer.model import CanonicalConfig
from glmc.symmetry.groups import BlockInvertibleGroup, Group, OrthogonalGroup, PermutationGroup
from glmc.symmetry.spec import AxisTag, SymmetrySpec, inp, out

RES = "res"


def _embedding_axes(cfg: CanonicalConfig) -> dict[str, tuple[AxisTag, ...]]:
    if cfg.task == "causal_lm":
        return {"embed.tok": (None, out(RES)), "embed.pos": (None, out(RES))}
    return {
        "embed.patch.weight": (out(RES), None, None, None),
        "embed.patch.bias": (out(RES),),
        "embed.cls": (out(RES),),
        "embed.pos": (None, out(RES)),
    }


def _attention_axes(cfg: CanonicalConfig, i: int) -> dict[str, tuple[AxisTag, ...]]:
    a, heads = f"blocks.{i}.attn", f"heads.{i}"
    if cfg.attention == "circuit":
        return {
            f"{a}.qk.weight": (out(heads), inp(RES), inp(RES)),  # (H, d_key, d_query)
            f"{a}.qk.bias": (out(heads), inp(RES)),
            f"{a}.ov.weight": (out(heads), out(RES), inp(RES)),  # (H, d_out, d_in)
            f"{a}.o.bias": (out(RES),),
        }
    qk, ov = f"qk.{i}", f"ov.{i}"
    return {
        f"{a}.q.weight": (out(qk, heads), inp(RES)),
        f"{a}.q.bias": (out(qk, heads),),
        # Keys pair with queries: they carry the inverse-transpose of the QK inner map.
        f"{a}.k.weight": (inp(qk, heads), inp(RES)),
        f"{a}.k.bias": (inp(qk, heads),),
        f"{a}.v.weight": (out(ov, heads), inp(RES)),
        f"{a}.v.bias": (out(ov, heads),),
        f"{a}.o.weight": (out(RES), inp(ov, heads)),
        f"{a}.o.bias": (out(RES),),
    }


def _mlp_axes(i: int) -> dict[str, tuple[AxisTag, ...]]:
    m, mlp = f"blocks.{i}.mlp", f"mlp.{i}"
    return {
        f"{m}.fc.weight": (out(mlp), inp(RES)),
        f"{m}.fc.bias": (out(mlp),),
        f"{m}.proj.weight": (out(RES), inp(mlp)),
        f"{m}.proj.bias": (out(RES),),
    }


def canonical_spec(cfg: CanonicalConfig) -> SymmetrySpec:
    d, h, dh = cfg.d_model, cfg.n_head, cfg.head_dim
    spaces: dict[str, Group] = {RES: OrthogonalGroup(d)}
    roles = {RES: "residual"}
    axes = _embedding_axes(cfg)
    for i in range(cfg.n_layer):
        spaces[f"mlp.{i}"] = PermutationGroup(cfg.d_mlp)
        roles[f"mlp.{i}"] = "mlp"
        if cfg.attention == "circuit":
            spaces[f"heads.{i}"] = PermutationGroup(h)
        else:
            spaces[f"heads.{i}"] = PermutationGroup(h * dh, block=dh)
            for inner in ("qk", "ov"):
                spaces[f"{inner}.{i}"] = BlockInvertibleGroup(h * dh, block=dh)
                roles[f"{inner}.{i}"] = inner
        roles[f"heads.{i}"] = "heads"
        axes |= _attention_axes(cfg, i)
        axes |= _mlp_axes(i)
    if cfg.norm_f_bias:
        axes["norm_f.bias"] = (out(RES),)
    axes["head.weight"] = (None, inp(RES))
    if cfg.head_bias:
        axes["head.bias"] = (None,)
    return SymmetrySpec(spaces=spaces, axes=axes, roles=roles)
