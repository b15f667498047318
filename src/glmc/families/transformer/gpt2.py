"""GPT-2 (transformers' GPT2LMHeadModel) <-> canonical.

Stock layout: Conv1D weights are (in, out); ``c_attn`` fuses q, k, v along its output;
``lm_head`` may be tied to ``wte``; ``ln_f``'s bias has no reader bias to fold into, so it
becomes the canonical ``norm_f.bias`` (β/γ in residual coordinates) when γ is well conditioned
(see :func:`~glmc.families.transformer.rewrite.fold_final_norm`), else an LM-head bias
(head @ β; no stock equivalent).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import GPT2Config

from glmc.errors import GlmcError
from glmc.families.importers import NotRepresentable
from glmc.families.transformer.hf import TableImporter
from glmc.families.transformer.rewrite import (
    NORM_F_BIAS_MIN_GAMMA,
    centre,
    fold_final_norm,
    fold_norm,
    settle_attention_biases,
)
from glmc.families.transformer.stock import base_config, require_stock_form
from glmc.families.transformer.tables import TABLES
from glmc.model import CanonicalModel
from glmc.tensors import StateDict


class GPT2Importer(TableImporter):
    table = TABLES["gpt2"]

    def to_canonical(self, hf_config: Any, state: StateDict) -> CanonicalModel:
        c, s = hf_config, state  # (each tensor read when needed: never the whole model)
        if c.scale_attn_by_inverse_layer_idx:
            raise GlmcError("GPT-2 with scale_attn_by_inverse_layer_idx=True is not supported")
        d, h = c.n_embd, c.n_head
        t = "transformer"
        out: StateDict = {
            "embed.tok": centre(s[f"{t}.wte.weight"], 1),
            "embed.pos": centre(s[f"{t}.wpe.weight"], 1),
        }
        for i in range(c.n_layer):
            p, a, m = f"{t}.h.{i}", f"blocks.{i}.attn", f"blocks.{i}.mlp"
            w, b = fold_norm(s[f"{p}.attn.c_attn.weight"].T, s[f"{p}.attn.c_attn.bias"],
                             s[f"{p}.ln_1.weight"], s[f"{p}.ln_1.bias"])
            w = centre(w, 1)  # readers only ever see mean-zero inputs
            for j, name in enumerate("qkv"):
                out[f"{a}.{name}.weight"] = w[j * d:(j + 1) * d].contiguous()
                out[f"{a}.{name}.bias"] = b[j * d:(j + 1) * d].contiguous()
            out[f"{a}.o.weight"] = centre(s[f"{p}.attn.c_proj.weight"].T, 0).contiguous()
            out[f"{a}.o.bias"] = centre(s[f"{p}.attn.c_proj.bias"], 0)
            w, b = fold_norm(s[f"{p}.mlp.c_fc.weight"].T, s[f"{p}.mlp.c_fc.bias"],
                             s[f"{p}.ln_2.weight"], s[f"{p}.ln_2.bias"])
            out[f"{m}.fc.weight"] = centre(w, 1).contiguous()
            out[f"{m}.fc.bias"] = b
            out[f"{m}.proj.weight"] = centre(s[f"{p}.mlp.c_proj.weight"].T, 0).contiguous()
            out[f"{m}.proj.bias"] = centre(s[f"{p}.mlp.c_proj.bias"], 0)
        settle_attention_biases(out, c.n_layer)
        head = self.head_weight(s)
        out |= fold_final_norm(head, s[f"{t}.ln_f.weight"], s[f"{t}.ln_f.bias"])
        norm_f_bias = "norm_f.bias" in out
        cfg = base_config(
            c, "causal_lm", **self.copied_fields(c), head_dim=d // h, d_mlp=c.n_inner or 4 * d,
            attn_scale=1.0 / math.sqrt(d // h) if c.scale_attn_weights else 1.0,
            norm_f_bias=norm_f_bias, head_bias=not norm_f_bias,
        )
        return CanonicalModel(cfg, out)

    def to_stock(self, model: CanonicalModel) -> tuple[GPT2Config, StateDict]:
        require_stock_form(model, "gpt2")
        cfg, s = model.config, model.state
        if cfg.head_bias:
            raise NotRepresentable(
                "GPT-2's lm_head has no bias (the final LayerNorm's γ has an entry below "
                f"{NORM_F_BIAS_MIN_GAMMA:g}·rms(γ), so its β was folded into a head bias)")
        hf = GPT2Config.from_dict({**cfg.source["config"], "tie_word_embeddings": False})
        d, t = cfg.d_model, "transformer"
        ones, zeros = torch.ones(d, dtype=model.dtype), torch.zeros(d, dtype=model.dtype)
        out: StateDict = {f"{t}.wte.weight": s["embed.tok"], f"{t}.wpe.weight": s["embed.pos"]}
        for i in range(cfg.n_layer):
            p, a, m = f"{t}.h.{i}", f"blocks.{i}.attn", f"blocks.{i}.mlp"
            out[f"{p}.ln_1.weight"], out[f"{p}.ln_1.bias"] = ones, zeros
            out[f"{p}.ln_2.weight"], out[f"{p}.ln_2.bias"] = ones, zeros
            qkv = torch.cat([s[f"{a}.{n}.weight"] for n in "qkv"], 0)
            out[f"{p}.attn.c_attn.weight"] = qkv.T.contiguous()
            out[f"{p}.attn.c_attn.bias"] = torch.cat([s[f"{a}.{n}.bias"] for n in "qkv"])
            out[f"{p}.attn.c_proj.weight"] = s[f"{a}.o.weight"].T.contiguous()
            out[f"{p}.attn.c_proj.bias"] = s[f"{a}.o.bias"]
            out[f"{p}.mlp.c_fc.weight"] = s[f"{m}.fc.weight"].T.contiguous()
            out[f"{p}.mlp.c_fc.bias"] = s[f"{m}.fc.bias"]
            out[f"{p}.mlp.c_proj.weight"] = s[f"{m}.proj.weight"].T.contiguous()
            out[f"{p}.mlp.c_proj.bias"] = s[f"{m}.proj.bias"]
        out[f"{t}.ln_f.weight"] = ones
        out[f"{t}.ln_f.bias"] = s["norm_f.bias"] if cfg.norm_f_bias else zeros
        out["lm_head.weight"] = s["head.weight"]
        return hf, {k: v.clone() for k, v in out.items()}
