"""One table per Hugging Face architecture: what its checkpoints are called, as plain data.

A table says how a checkpoint's keys map onto the stock model's (buffers to drop, old names to
rename, the prefix a bare ``*Model`` checkpoint lacks), which stock module each canonical one
of a block is (both directions of a conversion read it), which head may be tied to which
embedding, which transformers classes hold it, and which stock config field each canonical
field is copied from. :class:`~glmc.families.transformer.hf.TableImporter` reads it (key
handling, ties, the stock model and its call); each architecture's module holds only the
arithmetic of its conversion (folding norms, splitting fused projections). Torch-free and
transformers-free: classes are named, not imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: Canonical field -> the stock field it is copied from, for the fields every transformers
#: decoder and encoder names alike (``hidden_size``, ``num_hidden_layers``, ...).
_COMMON = {"d_model": "hidden_size", "n_layer": "num_hidden_layers",
           "n_head": "num_attention_heads", "d_mlp": "intermediate_size",
           "activation": "hidden_act"}
_TEXT = {"vocab_size": "vocab_size", "n_positions": "max_position_embeddings"}


@dataclass(frozen=True)
class Tied:
    """A head that may be stored as the embedding itself (``tie_word_embeddings``): its stock
    name, the embedding's, and the tasks whose head it is."""

    head: str
    embedding: str
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class HFTable:
    """One Hugging Face architecture's names.

    Attributes:
        model_type: transformers' ``config.model_type``.
        config_class: the transformers config class's name.
        classes: task -> the transformers model class's name (the first: the task of a
            config whose ``architectures`` names no other).
        fields: canonical config field -> the stock config field it is copied from as is
            (so a message about a canonical field names the user's own).
        bare_prefix: the prefix of every stock key but ``heads``' that a bare ``*Model``
            checkpoint lacks (added back); None: keys are read as they are.
        heads: key prefixes outside ``bare_prefix`` (the head's modules).
        ignored: key suffixes dropped (buffers older checkpoints stored).
        dropped: key prefixes dropped (modules the stock class does not read).
        dropped_beside: (key, prefixes): the prefixes dropped where the key is present (a
            pre-training checkpoint's extra heads beside the masked-LM head).
        renames: (regex, replacement) of older checkpoint names, the first that matches.
        layer: the stock prefix of layer ``{i}`` (under a prefix the importer adds: BERT's
            bare encoder has none).
        modules: a block's canonical module (``attn.q``; the norms ``norm1``, ``norm2``) ->
            its stock module under ``layer``, where the two correspond one to one (both
            directions read this; fused modules are the conversion's own).
        tied: the head that may be tied to the embedding, or None.
        optional: keys a checkpoint may always omit.
        checked: whether a stock config's fields are checked against those glmc knows
            (:func:`~glmc.families.transformer.stock.check_config_keys`), with ``also``
            known besides, and its ``hidden_act`` against ``activation`` (None: unchecked).
        inputs: the keyword the stock model takes its inputs by.
        call: further keywords of the stock model's call.
    """

    model_type: str
    config_class: str
    classes: Mapping[str, str]
    fields: Mapping[str, str]
    bare_prefix: str | None = None
    heads: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    dropped_beside: tuple[tuple[str, tuple[str, ...]], ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    layer: str = ""
    modules: Mapping[str, str] = field(default_factory=dict)
    tied: Tied | None = None
    optional: tuple[str, ...] = ()
    checked: bool = False
    also: tuple[str, ...] = ()
    activation: str | None = None
    inputs: str = "input_ids"
    call: Mapping[str, object] = field(default_factory=dict)


def _decoder(model_type: str, stem: str) -> HFTable:
    """Llama's layout, shared by Mistral and Qwen2."""
    return HFTable(
        model_type=model_type, config_class=f"{stem}Config",
        classes={"causal_lm": f"{stem}ForCausalLM"},
        fields={**_COMMON, **_TEXT, "norm_eps": "rms_norm_eps"},
        bare_prefix="model", heads=("lm_head.",), ignored=("rotary_emb.inv_freq",),
        layer="model.layers.{i}",
        modules={"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
                 "attn.v": "self_attn.v_proj", "attn.o": "self_attn.o_proj",
                 "mlp.gate": "mlp.gate_proj", "mlp.fc": "mlp.up_proj",
                 "mlp.proj": "mlp.down_proj", "norm1": "input_layernorm",
                 "norm2": "post_attention_layernorm"},
        tied=Tied("lm_head.weight", "model.embed_tokens.weight", ("causal_lm",)),
        checked=True, activation="silu", call={"use_cache": False})


def _encoder(model_type: str, stem: str, head: str, transform: str) -> HFTable:
    """BERT's layout under ``model_type``'s prefix, its masked-LM head under ``head`` (its
    first layer ``transform``, its decoder ``decoder``)."""
    return HFTable(
        model_type=model_type, config_class=f"{stem}Config",
        classes={"masked_lm": f"{stem}ForMaskedLM",
                 "sequence_classifier": f"{stem}ForSequenceClassification",
                 "features": f"{stem}Model"},
        fields={**_COMMON, **_TEXT, "norm_eps": "layer_norm_eps",
                "type_vocab": "type_vocab_size"},
        ignored=(".position_ids", ".token_type_ids"),  # (non-persistent buffers)
        layer="encoder.layer.{i}",
        modules={"attn.q": "attention.self.query", "attn.k": "attention.self.key",
                 "attn.v": "attention.self.value", "attn.o": "attention.output.dense",
                 "norm1": "attention.output.LayerNorm", "mlp.fc": "intermediate.dense",
                 "mlp.proj": "output.dense", "norm2": "output.LayerNorm"},
        dropped_beside=((f"{head}.{transform}.weight",
                         (f"{model_type}.pooler.", "cls.seq_relationship.")),),
        tied=Tied(f"{head}.decoder.weight", f"{model_type}.embeddings.word_embeddings.weight",
                  ("masked_lm",)),
        optional=(f"{head}.decoder.weight", f"{head}.decoder.bias"),
        checked=True, activation="gelu",
        # (fields of older encoder checkpoints that change nothing here when their value is
        # the one glmc reads, and the mask token id glmc's own masked-LM training records)
        also=("position_embedding_type", "gradient_checkpointing", "mask_token_id",
              "classifier_dropout", "output_past"))


def _vit_original(module: str, ours: str) -> tuple[str, str]:
    return (rf"^vit\.encoder\.layer\.(\d+)\.{module}\.", rf"vit.layers.\1.{ours}.")


TABLES: Mapping[str, HFTable] = MappingProxyType({t.model_type: t for t in (
    HFTable(
        model_type="gpt2", config_class="GPT2Config", classes={"causal_lm": "GPT2LMHeadModel"},
        fields={"d_model": "n_embd", "n_layer": "n_layer", "n_head": "n_head",
                "activation": "activation_function", "norm_eps": "layer_norm_epsilon",
                "vocab_size": "vocab_size", "n_positions": "n_positions"},
        bare_prefix="transformer", heads=("lm_head.",),
        ignored=(".attn.bias", ".attn.masked_bias"),  # (causal-mask buffers of old files)
        tied=Tied("lm_head.weight", "transformer.wte.weight", ("causal_lm",))),
    HFTable(
        model_type="gpt_neox", config_class="GPTNeoXConfig",
        classes={"causal_lm": "GPTNeoXForCausalLM"},
        fields={**_COMMON, **_TEXT, "norm_eps": "layer_norm_eps"},
        bare_prefix="gpt_neox", heads=("lm_head.",),
        # (masks and rotary frequencies older checkpoints stored)
        ignored=(".attention.bias", ".attention.masked_bias", "rotary_emb.inv_freq"),
        renames=((r"^embed_out\.", "lm_head."),),  # (the head's original name)
        tied=Tied("lm_head.weight", "gpt_neox.embed_in.weight", ("causal_lm",)),
        checked=True, activation="gelu", call={"use_cache": False}),
    _decoder("llama", "Llama"),
    _decoder("mistral", "Mistral"),
    _decoder("qwen2", "Qwen2"),
    _encoder("bert", "Bert", "cls.predictions", "transform.dense"),
    _encoder("roberta", "Roberta", "lm_head", "dense"),
    HFTable(
        model_type="vit", config_class="ViTConfig",
        classes={"image_classifier": "ViTForImageClassification"},
        fields={**_COMMON, "norm_eps": "layer_norm_eps", "image_size": "image_size",
                "patch_size": "patch_size", "num_channels": "num_channels",
                "num_labels": "num_labels"},
        dropped=("vit.pooler.",),  # (ViTModel's pooler: the classifier never reads it)
        # (transformers' save_pretrained still writes the original hub names)
        renames=(_vit_original(r"attention\.attention\.query", "attention.q_proj"),
                 _vit_original(r"attention\.attention\.key", "attention.k_proj"),
                 _vit_original(r"attention\.attention\.value", "attention.v_proj"),
                 _vit_original(r"attention\.output\.dense", "attention.o_proj"),
                 _vit_original(r"intermediate\.dense", "mlp.fc1"),
                 _vit_original(r"output\.dense", "mlp.fc2"),
                 (r"^vit\.encoder\.layer\.(\d+)\.", r"vit.layers.\1.")),
        layer="vit.layers.{i}",
        modules={"attn.q": "attention.q_proj", "attn.k": "attention.k_proj",
                 "attn.v": "attention.v_proj", "attn.o": "attention.o_proj",
                 "mlp.fc": "mlp.fc1", "mlp.proj": "mlp.fc2", "norm1": "layernorm_before",
                 "norm2": "layernorm_after"},
        inputs="pixel_values"),
)})


def stock_field(model_type: str | None, name: str) -> str:
    """The stock config field of ``model_type`` that canonical field ``name`` is copied from
    (the user's own name for it), else ``name`` itself."""
    table = TABLES.get(model_type or "")
    return table.fields.get(name, name) if table is not None else name
