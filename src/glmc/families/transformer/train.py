"""The stock transformers ``glmc train`` trains: GPT-2, Llama and GPT-NeoX on text, BERT as a
masked-language model on text, ViT on images.

Each is the transformers class, built by the importers' ``stock_model`` (the modules
``glmc align`` and ``verify`` load) and saved as a Hugging Face folder the importers read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import BertConfig, GPT2Config, GPTNeoXConfig, LlamaConfig, ViTConfig

from glmc.data import Dataset
from glmc.families.base import Arch
from glmc.families.registry import importer_for
from glmc.families.transformer.options import mlp_width

GPT2_EOS = 50256  # GPT-2's <|endoftext|>; only meaningful with the BPE vocabulary


class _StockArch(Arch):
    """An architecture saved as a transformers folder (config.json + safetensors)."""

    config_class: type

    def describe(self, cfg: Any) -> str:
        return (f"{self.name}: {cfg.n_layer} layers, d={cfg.n_embd}, {cfg.n_head} heads, "
                f"MLP {mlp_width(cfg)}")

    def config_to_json(self, config: Any) -> dict:
        return config.to_dict()

    def config_from_json(self, raw: dict) -> Any:
        return self.config_class.from_dict(raw)

    def build(self, config: Any) -> nn.Module:
        return importer_for(config.model_type).stock_model(config)

    def save(self, model: nn.Module, config: Any, folder: Path) -> None:
        # save_original_format=False: keep transformers 5 tensor names (vit.layers.N...),
        # which glmc's importers read, rather than the legacy hub names.
        model.to("cpu").save_pretrained(str(folder), save_original_format=False)


class GPT2Arch(_StockArch):
    """GPT2LMHeadModel: untied embeddings (as in the paper), ``n_positions = context``,
    ``gelu_new``; the vocabulary comes from the data."""

    config_class = GPT2Config

    def model_config(self, cfg: Any, ds: Dataset) -> GPT2Config:
        p, vocab = cfg.dropout, ds.vocab_size
        eos = GPT2_EOS if vocab > GPT2_EOS else None  # small vocabularies have no special token
        return GPT2Config(
            vocab_size=vocab, n_positions=cfg.context, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
            n_head=cfg.n_head, n_inner=mlp_width(cfg), activation_function="gelu_new",
            resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, tie_word_embeddings=False,
            bos_token_id=eos, eos_token_id=eos,
        )

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x, use_cache=False).logits


class ViTArch(_StockArch):
    """ViTForImageClassification: image size, channels and classes from the data, GELU,
    q/k/v biases; ``--patch-size`` must divide the image side."""

    config_class = ViTConfig

    def model_config(self, cfg: Any, ds: Dataset) -> ViTConfig:
        from glmc.errors import GlmcError

        if ds.image_size % cfg.patch_size:
            raise GlmcError(
                f"patch size {cfg.patch_size} does not divide the {ds.image_size}x"
                f"{ds.image_size} images of '{ds.name}' (choose a divisor of {ds.image_size})"
            )
        p = cfg.dropout
        return ViTConfig(
            image_size=ds.image_size, patch_size=cfg.patch_size, num_channels=ds.num_channels,
            num_labels=ds.num_classes, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head, intermediate_size=mlp_width(cfg), hidden_act="gelu",
            qkv_bias=True, hidden_dropout_prob=p, attention_probs_dropout_prob=p,
        )

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(pixel_values=x).logits


class _DecoderArch(_StockArch):
    """A rotary decoder on text: the vocabulary from the data, ``max_position_embeddings =
    context``, untied embeddings, no dropout (transformers' decoders have no dropout on the
    stream)."""

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x, use_cache=False).logits


class LlamaArch(_DecoderArch):
    """LlamaForCausalLM: grouped-query attention (``--n-kv-head``; by default one key/value
    head per 2 query heads), SwiGLU MLP of ``--n-inner`` units (unset: 8/3·d rounded up to a
    multiple of 8), RMSNorm, rotary positions on whole heads."""

    config_class = LlamaConfig

    def describe(self, cfg: Any) -> str:
        return (f"{self.name}: {cfg.n_layer} layers, d={cfg.n_embd}, {cfg.n_head} query / "
                f"{kv_heads(cfg)} key-value heads, SwiGLU {llama_width(cfg)}")

    def model_config(self, cfg: Any, ds: Dataset) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=ds.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head, num_key_value_heads=kv_heads(cfg),
            intermediate_size=llama_width(cfg), max_position_embeddings=cfg.context,
            hidden_act="silu", tie_word_embeddings=False, attention_dropout=cfg.dropout,
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
        )


class GPTNeoXArch(_DecoderArch):
    """GPTNeoXForCausalLM as in Pythia: rotary positions on a quarter of each head, parallel
    attention and MLP, LayerNorms with bias, GELU MLP of ``--n-inner`` units (unset: 4·d)."""

    config_class = GPTNeoXConfig

    def model_config(self, cfg: Any, ds: Dataset) -> GPTNeoXConfig:
        return GPTNeoXConfig(
            vocab_size=ds.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head, intermediate_size=mlp_width(cfg),
            max_position_embeddings=cfg.context, hidden_act="gelu",
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.25},
            use_parallel_residual=True, tie_word_embeddings=False, attention_dropout=cfg.dropout,
            hidden_dropout=cfg.dropout, bos_token_id=None, eos_token_id=None,
        )


class BertArch(_StockArch):
    """BertForMaskedLM: a post-LayerNorm encoder, GELU MLP of ``--n-inner`` units (unset:
    4·d), ``max_position_embeddings = context``, the decoder tied to the word embeddings (as
    BERT's), one token type. The vocabulary is the data's plus one mask token, the last id
    (recorded as the config's ``mask_token_id``)."""

    config_class = BertConfig

    def model_config(self, cfg: Any, ds: Dataset) -> BertConfig:
        p, vocab = cfg.dropout, ds.vocab_size
        return BertConfig(
            vocab_size=vocab + 1, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head, intermediate_size=mlp_width(cfg),
            max_position_embeddings=cfg.context, type_vocab_size=1, hidden_act="gelu",
            hidden_dropout_prob=p, attention_probs_dropout_prob=p, layer_norm_eps=1e-12,
            tie_word_embeddings=True, pad_token_id=None, mask_token_id=vocab,
            architectures=["BertForMaskedLM"],
        )

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x).logits


def kv_heads(cfg: Any) -> int:
    """The key/value heads of a Llama run: ``--n-kv-head``, else one per two query heads."""
    chosen = getattr(cfg, "n_kv_head", None)
    return chosen if chosen else max(1, cfg.n_head // 2)


def llama_width(cfg: Any) -> int:
    return cfg.n_inner if cfg.n_inner is not None else -(-8 * cfg.n_embd // 3 // 8) * 8
