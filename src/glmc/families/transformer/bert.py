"""BERT and RoBERTa encoders (transformers' *ForMaskedLM and *ForSequenceClassification) <->
canonical.

Stock layout (prefix ``bert`` or ``roberta``): ``{p}.embeddings.{word, position,
token_type}_embeddings`` and their ``LayerNorm``; ``{p}.encoder.layer.N.attention.self.
{query, key, value}``, ``attention.output.{dense, LayerNorm}``, ``intermediate.dense``,
``output.{dense, LayerNorm}``: a post-LayerNorm residual, kept as it is in canonical form
(``norm_position="post"``). Heads:

- masked LM: BERT's ``cls.predictions.{transform.dense, transform.LayerNorm, decoder, bias}``
  (act = ``hidden_act``), RoBERTa's ``lm_head.{dense, layer_norm, decoder, bias}`` (act =
  GELU); the decoder is tied to the word embeddings unless ``tie_word_embeddings`` is false.
  A pre-training checkpoint's pooler and next-sentence head are not read (the model is read
  as, and written back as, its masked-LM class);
- sequence classifier: BERT's ``bert.pooler.dense`` then ``classifier``, RoBERTa's
  ``classifier.dense`` then ``classifier.out_proj``: both tanh(dense(first token)), then a
  linear map;
- none (``BertModel``, ``RobertaModel``; names without the ``bert.`` prefix): the output is
  the last hidden state, the stream itself, so an aligned model's output is B's in the
  aligned coordinates (the spec says so, and certificates compare it so); the pooler is kept
  with its output as it is.

RoBERTa counts positions over the tokens that are not padding, from ``pad_token_id + 1``; the
canonical model does the same (``position_pad_id``). The only rewrite is that of every
transformer: key biases zero, value biases moved into the output bias.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from glmc.errors import GlmcError
from glmc.families.transformer.hf import TableImporter
from glmc.families.transformer.rewrite import settle_attention_biases
from glmc.families.transformer.stock import base_config, require_stock_form
from glmc.families.transformer.tables import TABLES
from glmc.model import CanonicalModel
from glmc.tensors import StateDict


class EncoderImporter(TableImporter):
    """The BERT layout under ``prefix``; RoBERTa differs in its positions and head names.

    Its task is the head a config's ``architectures`` names (a masked LM when it names none;
    the bare encoder, whose output is the stream itself, for ``BertModel``/``RobertaModel``).
    """

    #: The masked-LM head's modules (transform, its norm, decoder, bias) under its prefix.
    lm_head: ClassVar[tuple[str, str, str, str]]
    #: The classifier's (pooler, output) modules.
    classifier: ClassVar[tuple[str, str]]

    @property
    def prefix(self) -> str:
        """The stock names' prefix under a head: the model type (``bert``, ``roberta``)."""
        return self.table.model_type

    def base(self, task: str) -> str:
        """The stock names' prefix: none for the bare encoder, ``bert.`` under a head."""
        return "" if task == "features" else f"{self.prefix}."

    def check_fields(self, raw: dict, where: str) -> None:
        position = raw.get("position_embedding_type", "absolute")
        if position != "absolute":
            raise GlmcError(f"{where}: position_embedding_type {position!r} is not supported "
                            "(relative positions change attention; glmc reads absolute ones)")
        for key in ("is_decoder", "add_cross_attention"):
            if raw.get(key):
                raise GlmcError(f"{where}: {key} is true; glmc reads encoders only")
        names = set(self.table.classes.values())
        stem = self.table.classes["masked_lm"].removesuffix("ForMaskedLM")
        arch = (raw.get("architectures") or [""])[0]
        if arch and arch not in names | {f"{stem}ForPreTraining"}:
            raise GlmcError(f"{where}: architectures {arch!r} is not supported (glmc reads "
                            f"{', '.join(sorted(names))})")

    def module_names(self, c: Any, task: str) -> dict[str, str]:
        """Canonical module -> stock module, for every module with a weight and a bias."""
        names = {"embed.norm": f"{self.base(task)}embeddings.LayerNorm"}
        for i in range(c.num_hidden_layers):
            names |= {f"blocks.{i}.{ours}": theirs
                      for ours, theirs in self.layer_modules(i, self.base(task)).items()}
        if task == "masked_lm":
            head, transform, _, _ = self.lm_head
            names |= {"head.dense": f"{head}.{transform}", "head.norm": self.head_norm()}
        elif task == "features":  # (the pooler: its output is kept as it is)
            names |= {"pool": "pooler.dense"}
        else:
            pool, out = self.classifier
            names |= {"pool": pool, "head": out}
        return names

    def head_norm(self) -> str:
        raise NotImplementedError

    def head_activation(self, c: Any) -> str:
        return c.hidden_act

    def to_canonical(self, hf_config: Any, state: StateDict) -> CanonicalModel:
        c, s, task = hf_config, state, self.task(hf_config)
        e = f"{self.base(task)}embeddings"
        tok = s[f"{e}.word_embeddings.weight"]
        out: StateDict = {"embed.tok": tok, "embed.pos": s[f"{e}.position_embeddings.weight"],
                          "embed.token_type": s[f"{e}.token_type_embeddings.weight"]}
        for ours, theirs in self.module_names(c, task).items():
            out[f"{ours}.weight"], out[f"{ours}.bias"] = s[f"{theirs}.weight"], s[f"{theirs}.bias"]
        settle_attention_biases(out, c.num_hidden_layers)
        tied = task == "masked_lm" and bool(c.tie_word_embeddings)
        if task == "masked_lm":
            head, _, decoder, bias = self.lm_head
            out["head.weight"] = tok if tied else s[f"{head}.{decoder}.weight"]
            # (the decoder's own bias is the one applied; tied to the head's, a file may
            # store only the latter)
            out["head.bias"] = s.get(f"{head}.{decoder}.bias", s[f"{head}.{bias}"])
        cfg = base_config(
            c, task, **self.copied_fields(c), head_dim=c.hidden_size // c.num_attention_heads,
            num_labels=c.num_labels if task == "sequence_classifier" else 0,
            head_bias=task != "features", norm_position="post",
            head_activation=self.head_activation(c), tied_head=tied,
            position_pad_id=self.position_pad_id(c),
            mask_token_id=getattr(c, "mask_token_id", None),
        )
        return CanonicalModel(cfg, {k: v.contiguous() for k, v in out.items()})

    def position_pad_id(self, c: Any) -> int | None:
        return None

    def to_stock(self, model: CanonicalModel) -> tuple[Any, StateDict]:
        require_stock_form(model, self.prefix)
        cfg, s = model.config, model.state
        # (tied when the source was and the two still agree: the same map moved both)
        tied = (cfg.tied_head and torch.equal(s["head.weight"], s["embed.tok"])
                if cfg.task == "masked_lm"  # (a classifier has no decoder: as it came)
                else cfg.source["config"].get("tie_word_embeddings", True))
        hf = self.config_class().from_dict({
            **cfg.source["config"], "tie_word_embeddings": tied,
            "architectures": [self.table.classes[cfg.task]]})
        e = f"{self.base(cfg.task)}embeddings"
        out: StateDict = {f"{e}.word_embeddings.weight": s["embed.tok"],
                          f"{e}.position_embeddings.weight": s["embed.pos"],
                          f"{e}.token_type_embeddings.weight": s["embed.token_type"]}
        for ours, theirs in self.module_names(hf, cfg.task).items():
            out[f"{theirs}.weight"], out[f"{theirs}.bias"] = s[f"{ours}.weight"], s[f"{ours}.bias"]
        if cfg.task == "masked_lm":
            head, _, decoder, bias = self.lm_head
            out[f"{head}.{bias}"] = out[f"{head}.{decoder}.bias"] = s["head.bias"]
            out[f"{head}.{decoder}.weight"] = s["head.weight"]
        return hf, {k: v.clone().contiguous() for k, v in out.items()}


class BertImporter(EncoderImporter):
    table = TABLES["bert"]
    lm_head = ("cls.predictions", "transform.dense", "decoder", "bias")
    classifier = ("bert.pooler.dense", "classifier")

    def head_norm(self) -> str:
        return "cls.predictions.transform.LayerNorm"


class RobertaImporter(EncoderImporter):
    """RoBERTa: positions counted from ``pad_token_id + 1`` over the tokens that are not
    padding; the masked-LM head's activation is GELU whatever ``hidden_act`` says."""

    table = TABLES["roberta"]
    lm_head = ("lm_head", "dense", "decoder", "bias")
    classifier = ("classifier.dense", "classifier.out_proj")

    def head_norm(self) -> str:
        return "lm_head.layer_norm"

    def head_activation(self, c: Any) -> str:
        return "gelu"

    def position_pad_id(self, c: Any) -> int | None:
        return int(c.pad_token_id)
