"""Llama, Mistral and Qwen2 (transformers' *ForCausalLM) <-> canonical.

The three share one layout: ``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``
(grouped-query attention: ``num_key_value_heads`` key/value heads), ``model.layers.N.mlp.
{gate,up,down}_proj`` (SwiGLU), ``input_layernorm`` and ``post_attention_layernorm``
(RMSNorm with a gain), ``model.norm`` and ``lm_head`` (possibly tied to the embedding). They
differ in their biases (Llama's ``attention_bias`` and ``mlp_bias``; Qwen2's q/k/v biases)
and sliding windows (Mistral's ``sliding_window`` on every layer, Qwen2's per ``layer_types``).

Canonical form: each RMSNorm's gain is folded into the linear layers that read it (q, k, v;
gate and up; the final norm's into the head, which unties a tied head), so every norm is a
weightless RMSNorm and the residual stream carries any orthogonal map. Nothing is centred:
written back, every norm's gain is 1.
"""

from __future__ import annotations

from typing import Any

import torch

from glmc.errors import GlmcError
from glmc.families.importers import NotRepresentable
from glmc.families.transformer.hf import TableImporter
from glmc.families.transformer.stock import base_config, require_stock_form, rotary_of
from glmc.families.transformer.tables import TABLES
from glmc.model import CanonicalModel
from glmc.tensors import StateDict


class DecoderImporter(TableImporter):
    """The Llama layout; subclasses name their table and what differs."""

    def check_fields(self, raw: dict, where: str) -> None:
        heads, kv = raw.get("num_attention_heads"), raw.get("num_key_value_heads")
        if isinstance(heads, int) and isinstance(kv, int) and (kv < 1 or heads % kv):
            raise GlmcError(f"{where}: num_key_value_heads {kv} does not divide "
                            f"num_attention_heads {heads}")

    # -- what the three differ in ---------------------------------------------------------
    def biases(self, c: Any) -> dict[str, bool]:
        """Which linear layers carry a bias: attn (q, k, v), o, mlp."""
        attn = bool(getattr(c, "attention_bias", False))
        return {"attn": attn, "o": attn, "mlp": bool(getattr(c, "mlp_bias", False))}

    def windows(self, c: Any) -> list[int | None]:
        """The sliding window of each layer (None: full attention)."""
        window = getattr(c, "sliding_window", None)
        return [window] * c.num_hidden_layers if window else []

    # -- conversion -----------------------------------------------------------------------
    def to_canonical(self, hf_config: Any, state: StateDict) -> CanonicalModel:
        c, s = hf_config, state
        h, kv = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
        dh = getattr(c, "head_dim", None) or c.hidden_size // h
        where = f"{c.model_type} config"
        rotary_dim, inv_freq, scaling = rotary_of(c, dh, where)
        biased = self.biases(c)
        out: StateDict = {"embed.tok": s["model.embed_tokens.weight"]}
        for i in range(c.num_hidden_layers):
            n, a, m = self.layer_modules(i), f"blocks.{i}.attn", f"blocks.{i}.mlp"
            g1, g2 = s[f"{n['norm1']}.weight"], s[f"{n['norm2']}.weight"]
            for x in "qkv":
                out[f"{a}.{x}.weight"] = s[f"{n['attn.' + x]}.weight"] * g1[None, :]
                if biased["attn"]:
                    out[f"{a}.{x}.bias"] = s[f"{n['attn.' + x]}.bias"]
            out[f"{a}.o.weight"] = s[f"{n['attn.o']}.weight"]
            if biased["o"]:
                out[f"{a}.o.bias"] = s[f"{n['attn.o']}.bias"]
            for x, gain in (("gate", g2), ("fc", g2), ("proj", None)):
                w = s[f"{n['mlp.' + x]}.weight"]
                out[f"{m}.{x}.weight"] = w if gain is None else w * gain[None, :]
                if biased["mlp"]:
                    out[f"{m}.{x}.bias"] = s[f"{n['mlp.' + x]}.bias"]
        head = self.head_weight(s)
        out["head.weight"] = head * s["model.norm.weight"][None, :]
        cfg = base_config(
            c, "causal_lm", **self.copied_fields(c), n_kv_head=kv, head_dim=dh,
            rotary_dim=rotary_dim, inv_freq=inv_freq,
            rotary_scaling=scaling, mlp="gated", attn_bias=biased["attn"], o_bias=biased["o"],
            mlp_bias=biased["mlp"], windows=self.windows(c), stock_norm="rmsnorm",
        )
        return CanonicalModel(cfg, {k: v.contiguous() for k, v in out.items()})

    def to_stock(self, model: CanonicalModel) -> tuple[Any, StateDict]:
        require_stock_form(model, self.model_types())
        cfg, s = model.config, model.state
        if cfg.head_bias or cfg.norm_f_bias:
            raise NotRepresentable(f"{cfg.source['arch']}'s head has no bias")
        hf = self.config_class().from_dict({**cfg.source["config"],
                                            "tie_word_embeddings": False})
        ones = torch.ones(cfg.d_model, dtype=model.dtype)
        out: StateDict = {"model.embed_tokens.weight": s["embed.tok"],
                          "model.norm.weight": ones, "lm_head.weight": s["head.weight"]}
        for i in range(cfg.n_layer):
            n = self.layer_modules(i)
            out[f"{n['norm1']}.weight"] = out[f"{n['norm2']}.weight"] = ones
            for ours, theirs in n.items():  # (the norms have no canonical tensors)
                for kind in ("weight", "bias"):
                    if f"blocks.{i}.{ours}.{kind}" in s:
                        out[f"{theirs}.{kind}"] = s[f"blocks.{i}.{ours}.{kind}"]
        return hf, {k: v.clone().contiguous() for k, v in out.items()}

    def model_types(self) -> tuple[str, ...]:
        return (self.table.model_type,)


class LlamaImporter(DecoderImporter):
    table = TABLES["llama"]


class MistralImporter(DecoderImporter):
    table = TABLES["mistral"]


class Qwen2Importer(DecoderImporter):
    """Qwen2: q/k/v biases, no output bias; sliding windows on the layers ``layer_types``
    names ``sliding_attention``."""

    table = TABLES["qwen2"]

    def biases(self, c: Any) -> dict[str, bool]:
        return {"attn": True, "o": False, "mlp": False}

    def windows(self, c: Any) -> list[int | None]:
        types = list(getattr(c, "layer_types", None) or [])
        if not any(t == "sliding_attention" for t in types) or not c.sliding_window:
            return []
        return [c.sliding_window if t == "sliding_attention" else None for t in types]
