"""ViT (transformers' ViTForImageClassification) <-> canonical.

Stock layout (transformers 5): ``vit.embeddings.{cls_token, position_embeddings,
patch_embeddings.projection}``, ``vit.layers.N.attention.{q,k,v,o}_proj``,
``vit.layers.N.{layernorm_before, layernorm_after}``, ``vit.layers.N.mlp.{fc1, fc2}``,
``vit.layernorm`` and ``classifier`` reading the class token.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import ViTConfig

from glmc.errors import GlmcError
from glmc.families.importers import NotRepresentable
from glmc.families.transformer.hf import TableImporter
from glmc.families.transformer.rewrite import centre, fold_norm, settle_attention_biases
from glmc.families.transformer.stock import base_config, require_stock_form
from glmc.families.transformer.tables import TABLES
from glmc.model import CanonicalModel
from glmc.tensors import StateDict


class ViTImporter(TableImporter):
    table = TABLES["vit"]

    def to_canonical(self, hf_config: Any, state: StateDict) -> CanonicalModel:
        c, s = hf_config, state
        if c.num_labels <= 0:
            raise GlmcError("ViT without a classifier (num_labels = 0) is not supported")
        d, h = c.hidden_size, c.num_attention_heads
        e = "vit.embeddings"
        out: StateDict = {
            "embed.patch.weight": centre(s[f"{e}.patch_embeddings.projection.weight"], 0),
            "embed.patch.bias": centre(s[f"{e}.patch_embeddings.projection.bias"], 0),
            "embed.cls": centre(s[f"{e}.cls_token"].reshape(d), 0),
            "embed.pos": centre(s[f"{e}.position_embeddings"][0], 1),
        }
        for i in range(c.num_hidden_layers):
            n, a, m = self.layer_modules(i), f"blocks.{i}.attn", f"blocks.{i}.mlp"
            g1, b1 = s[f"{n['norm1']}.weight"], s[f"{n['norm1']}.bias"]
            for x in "qkv":
                w, b = fold_norm(s[f"{n['attn.' + x]}.weight"], s.get(f"{n['attn.' + x]}.bias"),
                                 g1, b1)
                out[f"{a}.{x}.weight"], out[f"{a}.{x}.bias"] = centre(w, 1), b
            out[f"{a}.o.weight"] = centre(s[f"{n['attn.o']}.weight"], 0)
            out[f"{a}.o.bias"] = centre(s[f"{n['attn.o']}.bias"], 0)
            w, b = fold_norm(s[f"{n['mlp.fc']}.weight"], s[f"{n['mlp.fc']}.bias"],
                             s[f"{n['norm2']}.weight"], s[f"{n['norm2']}.bias"])
            out[f"{m}.fc.weight"], out[f"{m}.fc.bias"] = centre(w, 1), b
            out[f"{m}.proj.weight"] = centre(s[f"{n['mlp.proj']}.weight"], 0)
            out[f"{m}.proj.bias"] = centre(s[f"{n['mlp.proj']}.bias"], 0)
        settle_attention_biases(out, c.num_hidden_layers)
        w, b = fold_norm(s["classifier.weight"], s["classifier.bias"],
                         s["vit.layernorm.weight"], s["vit.layernorm.bias"])
        out["head.weight"], out["head.bias"] = centre(w, 1), b
        cfg = base_config(c, "image_classifier", **self.copied_fields(c), head_dim=d // h,
                          head_bias=True)
        return CanonicalModel(cfg, {k: v.contiguous() for k, v in out.items()})

    def to_stock(self, model: CanonicalModel) -> tuple[ViTConfig, StateDict]:
        require_stock_form(model, "vit")
        cfg, s = model.config, model.state
        if cfg.norm_f_bias:
            raise NotRepresentable("ViT's final norm bias has no stock equivalent")
        hf = ViTConfig.from_dict({**cfg.source["config"], "qkv_bias": True})
        d, e = cfg.d_model, "vit.embeddings"
        ones, zeros = torch.ones(d, dtype=model.dtype), torch.zeros(d, dtype=model.dtype)
        out: StateDict = {
            f"{e}.patch_embeddings.projection.weight": s["embed.patch.weight"],
            f"{e}.patch_embeddings.projection.bias": s["embed.patch.bias"],
            f"{e}.cls_token": s["embed.cls"].reshape(1, 1, d),
            f"{e}.position_embeddings": s["embed.pos"][None],
        }
        for i in range(cfg.n_layer):
            n = self.layer_modules(i)
            for norm in ("norm1", "norm2"):  # (folded into their readers)
                out[f"{n[norm]}.weight"], out[f"{n[norm]}.bias"] = ones, zeros
            for ours in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc", "mlp.proj"):
                for kind in ("weight", "bias"):
                    out[f"{n[ours]}.{kind}"] = s[f"blocks.{i}.{ours}.{kind}"]
        out["vit.layernorm.weight"], out["vit.layernorm.bias"] = ones, zeros
        out["classifier.weight"], out["classifier.bias"] = s["head.weight"], s["head.bias"]
        return hf, {k: v.clone().contiguous() for k, v in out.items()}
