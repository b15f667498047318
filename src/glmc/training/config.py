"""What a training run is: :class:`TrainConfig` and its checks (defined, torch-free, in
:mod:`glmc.training.options`), the data it loads and the HF model config it implies."""

from __future__ import annotations

from typing import Any

from transformers import GPT2Config, PretrainedConfig, ViTConfig

from glmc.data import Dataset, ImageDataset, TextDataset, check_images_fit, check_text_fits
from glmc.errors import GlmcError
from glmc.training.options import ARCHS, RUNTIME_FIELDS, TrainConfig

__all__ = ["ARCHS", "GPT2_EOS", "RUNTIME_FIELDS", "TrainConfig", "check_fits", "data_summary",
           "hf_config", "load_training_data"]

GPT2_EOS = 50256  # GPT-2's <|endoftext|>; only meaningful with the BPE vocabulary


def load_training_data(cfg: TrainConfig) -> Dataset:
    """Load ``cfg.data`` and check it suits ``cfg.arch`` (text for GPT-2, images for ViT).

    Raises:
        GlmcError: unreadable data, text for ViT or images for GPT-2, a context longer than a
            split, or a patch size that does not divide the image side.
    """
    from glmc.data import load_dataset

    text = cfg.arch == "gpt2"
    if not text and cfg.tokenizer != "char":
        raise GlmcError(f"--tokenizer {cfg.tokenizer} applies to text, but --arch vit trains on "
                        "images")
    ds = load_dataset(cfg.data, seed=cfg.data_seed, context=cfg.context if text else None,
                      tokenizer=cfg.tokenizer if text else "char")
    if text and not isinstance(ds, TextDataset):
        raise GlmcError(f"dataset '{ds.name}' holds images, but --arch gpt2 trains on text "
                        "(use --arch vit)")
    if not text:
        if not isinstance(ds, ImageDataset):
            raise GlmcError(f"dataset '{ds.name}' holds text, but --arch vit trains on images "
                            "(use --arch gpt2)")
        n_train = int(ds.split("train")[1].numel())
        if cfg.batch_size > n_train:
            raise GlmcError(f"batch size {cfg.batch_size} exceeds the {n_train} training images "
                            f"of '{ds.name}'")
        if ds.image_size % cfg.patch_size:
            raise GlmcError(
                f"patch size {cfg.patch_size} does not divide the {ds.image_size}x"
                f"{ds.image_size} images of '{ds.name}' (choose a divisor of {ds.image_size})"
            )
    return ds


def hf_config(cfg: TrainConfig, ds: Dataset) -> PretrainedConfig:
    """The transformers config of the model ``cfg`` trains on ``ds`` (sizes from the data).

    GPT-2: untied embeddings (as in the paper), ``n_positions = context``, ``gelu_new``.
    ViT: ``image_size``/``num_channels``/``num_labels`` from the data, GELU, q/k/v biases.
    """
    p = cfg.dropout
    if cfg.arch == "gpt2":
        assert isinstance(ds, TextDataset)
        vocab = ds.vocab_size
        eos = GPT2_EOS if vocab > GPT2_EOS else None  # small vocabularies have no special token
        return GPT2Config(
            vocab_size=vocab, n_positions=cfg.context, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
            n_head=cfg.n_head, n_inner=cfg.mlp_width, activation_function="gelu_new",
            resid_pdrop=p, embd_pdrop=p, attn_pdrop=p, tie_word_embeddings=False,
            bos_token_id=eos, eos_token_id=eos,
        )
    assert isinstance(ds, ImageDataset)
    return ViTConfig(
        image_size=ds.image_size, patch_size=cfg.patch_size, num_channels=ds.num_channels,
        num_labels=ds.num_classes, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, intermediate_size=cfg.mlp_width, hidden_act="gelu",
        qkv_bias=True, hidden_dropout_prob=p, attention_probs_dropout_prob=p,
    )


def check_fits(hf: PretrainedConfig, ds: Dataset, cfg: TrainConfig) -> None:
    """Raise GlmcError unless ``ds`` fits the model ``hf`` (e.g. a checkpoint's model)."""
    if isinstance(hf, GPT2Config):
        check_text_fits(ds, hf.vocab_size, cfg.context, hf.n_positions)
    else:
        check_images_fit(ds, hf.image_size, hf.num_channels, hf.num_labels)


def data_summary(ds: Dataset) -> dict[str, Any]:
    """What the model saw of the data: sizes, and the tokenizer for text (JSON-ready)."""
    if isinstance(ds, TextDataset):
        return {
            "kind": "text", "name": ds.name, "tokenizer": ds.tokenizer.to_json(),
            "vocab_size": ds.vocab_size,
            "tokens": {s: int(ds.split(s).numel()) for s in ("train", "val", "test")},
        }
    return {
        "kind": "images", "name": ds.name, "image_size": ds.image_size,
        "num_channels": ds.num_channels, "num_classes": ds.num_classes,
        "images": {s: int(ds.split(s)[1].numel()) for s in ("train", "val", "test")},
    }
