"""GPT-NeoX (transformers' GPTNeoXForCausalLM: Pythia's architecture) <-> canonical.

Stock layout: ``gpt_neox.embed_in``, ``gpt_neox.layers.N.attention.query_key_value`` (q, k
and v fused per head: the rows of head h are its q, then k, then v, ``head_size`` each),
``attention.dense``, ``mlp.dense_h_to_4h`` / ``dense_4h_to_h``, LayerNorms with bias
(``input_layernorm``, ``post_attention_layernorm``, ``final_layer_norm``) and an untied head
(``lm_head`` in transformers 5; ``embed_out`` in checkpoints saved in the original names).
Rotary positions on the first ``partial_rotary_factor`` of each head (Pythia: a quarter), and
in Pythia a parallel residual: ``x + attn(ln1(x)) + mlp(ln2(x))``.

Canonical form as for GPT-2: every residual writer centred, each LayerNorm's γ and β folded
into the readers after it (q, k, v and the MLP's first layer), the final one's into the head
(β kept as ``norm_f.bias`` when γ is well conditioned). A value bias becomes part of the
output bias (the attention weights sum to one); a key bias matters only on the rotary
coordinates (elsewhere it adds a constant to every score of a query), so it is zero on the
others.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GPTNeoXConfig

from glmc.families.importers import NotRepresentable
from glmc.families.transformer.hf import TableImporter
from glmc.families.transformer.rewrite import centre, fold_final_norm, fold_norm
from glmc.families.transformer.stock import base_config, require_stock_form, rotary_of
from glmc.families.transformer.tables import TABLES
from glmc.model import CanonicalModel
from glmc.tensors import StateDict


class GPTNeoXImporter(TableImporter):
    table = TABLES["gpt_neox"]

    def to_canonical(self, hf_config: Any, state: StateDict) -> CanonicalModel:
        c, s = hf_config, state
        d, h = c.hidden_size, c.num_attention_heads
        dh = d // h
        rotary_dim, inv_freq, scaling = rotary_of(c, dh, "gpt_neox config")
        t = "gpt_neox"
        out: StateDict = {"embed.tok": centre(s[f"{t}.embed_in.weight"], 1)}
        for i in range(c.num_hidden_layers):
            p, a, m = f"{t}.layers.{i}", f"blocks.{i}.attn", f"blocks.{i}.mlp"
            w, b = fold_norm(s[f"{p}.attention.query_key_value.weight"],
                             s.get(f"{p}.attention.query_key_value.bias"),
                             s[f"{p}.input_layernorm.weight"], s[f"{p}.input_layernorm.bias"])
            w = centre(w, 1).view(h, 3, dh, d)  # (readers only ever see mean-zero inputs)
            b = b.view(h, 3, dh)
            for j, n in enumerate("qkv"):
                out[f"{a}.{n}.weight"] = w[:, j].reshape(h * dh, d).contiguous()
                out[f"{a}.{n}.bias"] = b[:, j].reshape(h * dh).contiguous()
            out[f"{a}.o.weight"] = centre(s[f"{p}.attention.dense.weight"], 0)
            o_bias = s.get(f"{p}.attention.dense.bias")
            out[f"{a}.o.bias"] = centre(o_bias if o_bias is not None
                                        else torch.zeros(d, dtype=w.dtype), 0)
            # The value bias passes straight through (weights sum to one); the key bias off
            # the rotary coordinates adds one constant to every score of a query.
            out[f"{a}.o.bias"] = out[f"{a}.o.bias"] + out[f"{a}.o.weight"] @ out[f"{a}.v.bias"]
            out[f"{a}.v.bias"] = torch.zeros_like(out[f"{a}.v.bias"])
            kb = out[f"{a}.k.bias"].view(h, dh).clone()
            kb[:, rotary_dim:] = 0
            out[f"{a}.k.bias"] = kb.reshape(-1)
            w, b = fold_norm(s[f"{p}.mlp.dense_h_to_4h.weight"], s[f"{p}.mlp.dense_h_to_4h.bias"],
                             s[f"{p}.post_attention_layernorm.weight"],
                             s[f"{p}.post_attention_layernorm.bias"])
            out[f"{m}.fc.weight"], out[f"{m}.fc.bias"] = centre(w, 1), b
            out[f"{m}.proj.weight"] = centre(s[f"{p}.mlp.dense_4h_to_h.weight"], 0)
            out[f"{m}.proj.bias"] = centre(s[f"{p}.mlp.dense_4h_to_h.bias"], 0)
        head = self.head_weight(s)
        final = fold_final_norm(head, s[f"{t}.final_layer_norm.weight"],
                                s[f"{t}.final_layer_norm.bias"])
        out |= final
        cfg = base_config(
            c, "causal_lm", **self.copied_fields(c), head_dim=dh, rotary_dim=rotary_dim,
            inv_freq=inv_freq, rotary_scaling=scaling,
            parallel=bool(c.use_parallel_residual), norm_f_bias="norm_f.bias" in final,
            head_bias="head.bias" in final,
        )
        return CanonicalModel(cfg, {k: v.contiguous() for k, v in out.items()})

    def to_stock(self, model: CanonicalModel) -> tuple[Any, StateDict]:
        require_stock_form(model, "gpt_neox")
        cfg, s = model.config, model.state
        if cfg.head_bias:
            raise NotRepresentable("GPT-NeoX's head has no bias (the final LayerNorm's "
                                   "γ had near-zero entries, so its β went into a head bias)")
        # (biases on q, k, v come from the LayerNorms' β: the stock layers hold them)
        hf = GPTNeoXConfig.from_dict({**cfg.source["config"], "tie_word_embeddings": False,
                                      "attention_bias": True})
        d, h, dh, t = cfg.d_model, cfg.n_head, cfg.head_dim, "gpt_neox"
        ones, zeros = torch.ones(d, dtype=model.dtype), torch.zeros(d, dtype=model.dtype)
        out: StateDict = {f"{t}.embed_in.weight": s["embed.tok"],
                          f"{t}.final_layer_norm.weight": ones,
                          f"{t}.final_layer_norm.bias": s.get("norm_f.bias", zeros),
                          "lm_head.weight": s["head.weight"]}
        for i in range(cfg.n_layer):
            p, a, m = f"{t}.layers.{i}", f"blocks.{i}.attn", f"blocks.{i}.mlp"
            for ln in ("input_layernorm", "post_attention_layernorm"):
                out[f"{p}.{ln}.weight"], out[f"{p}.{ln}.bias"] = ones, zeros
            w = torch.stack([s[f"{a}.{n}.weight"].view(h, dh, d) for n in "qkv"], dim=1)
            b = torch.stack([s[f"{a}.{n}.bias"].view(h, dh) for n in "qkv"], dim=1)
            out[f"{p}.attention.query_key_value.weight"] = w.reshape(3 * h * dh, d)
            out[f"{p}.attention.query_key_value.bias"] = b.reshape(-1)
            out[f"{p}.attention.dense.weight"] = s[f"{a}.o.weight"]
            out[f"{p}.attention.dense.bias"] = s[f"{a}.o.bias"]
            out[f"{p}.mlp.dense_h_to_4h.weight"] = s[f"{m}.fc.weight"]
            out[f"{p}.mlp.dense_h_to_4h.bias"] = s[f"{m}.fc.bias"]
            out[f"{p}.mlp.dense_4h_to_h.weight"] = s[f"{m}.proj.weight"]
            out[f"{p}.mlp.dense_4h_to_h.bias"] = s[f"{m}.proj.bias"]
        return hf, {k: v.clone().contiguous() for k, v in out.items()}
