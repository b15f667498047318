"""Tasks: what a model's inputs and outputs are, whatever its family.

A family's config names its task (``config.task``); the task knows which data fit the model,
how to batch and score them, and which inputs certify that a rewrite kept the function.
Evaluation, the barrier, certificates and training ask the task, never the architecture.

- ``causal_lm``: token ids (B, T) -> logits (B, T, V); loss per predicted token.
- ``image_classifier``: images (B, C, H, W) -> logits (B, classes); loss and top-1 accuracy
  per image.
- ``masked_lm``: token ids (B, T) with 15% of them masked -> logits (B, T, V); loss per
  masked token (targets elsewhere are ``IGNORE``), the masks drawn with a fixed seed.
- ``sequence_classifier``: token ids (B, T) -> logits (B, classes); loss and accuracy per
  example of a labelled ``.tsv`` (batches of one length: nothing padded).
- ``features``: token ids (B, T) -> the last hidden state (B, T, d) of a bare encoder; no
  loss (aligned, merged and certified only).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from glmc.data import (
    MASK_RATE,
    Dataset,
    LabelledText,
    MaskedText,
    TextDataset,
    check_images_fit,
    check_text_fits,
)
from glmc.defaults import DEFAULT_IMAGE_BATCH, TEXT_LOGITS_BUDGET
from glmc.errors import GlmcError


class Task:
    """The interface a model presents to data. ``config`` is any family's config."""

    name: ClassVar[str]
    #: Reports an accuracy beside the loss.
    classifier: ClassVar[bool] = False
    #: Reads text (its splits are contiguous, no data seed); else images split by a seed.
    text: ClassVar[bool] = False
    #: Config fields two models must share to take the same inputs and give the same logits.
    interface: ClassVar[tuple[str, ...]] = ()
    #: What one evaluated target is, for reports ("tokens", "images").
    targets: ClassVar[str] = "tokens"
    #: How the loss is scored, where it needs saying (reports and their JSON).
    scoring: ClassVar[str] = ""

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        """Raise GlmcError unless ``dataset``'s ``split`` fits; the context to use (text)."""
        raise NotImplementedError

    def default_batch_size(self, config: Any, context: int | None) -> int:
        raise NotImplementedError

    def random_inputs(self, config: Any, n: int, seq: int, seed: int,
                      dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def context(self, config: Any) -> int | None:
        """The model's own window length (text), None for images."""
        return None

    def view(self, config: Any, dataset: Dataset) -> Dataset:
        """``dataset`` as a model of ``config`` reads it (masked, for a masked LM)."""
        return dataset

    def text_vocab(self, config: Any) -> int:
        """The token ids a text model's tokenizer gives: its vocabulary, less the ids it adds
        itself (a mask token glmc's training appended)."""
        return config.vocab_size

    def same_interface(self, a: Any, b: Any, where: str) -> None:
        """Raise unless models of configs ``a`` and ``b`` take the same inputs and outputs."""
        if a.task != b.task:
            raise GlmcError(f"{where}: models differ in task ({a.task} vs {b.task})")
        for k in self.interface:
            if getattr(a, k) != getattr(b, k):
                raise GlmcError(f"{where}: models differ in {a.field_name(k, b)} "
                                f"({getattr(a, k)} vs "
                                f"{getattr(b, k)})")


def max_context(config: Any) -> int:
    """The longest input of a text model, canonical or stock config alike."""
    for key in ("max_context", "n_positions", "max_position_embeddings"):
        if getattr(config, key, None) is not None:
            return int(getattr(config, key))
    raise GlmcError(f"{type(config).__name__} names no maximum context")


class TokenTask(Task):
    """A task whose inputs are token ids (B, T): random ids certify it, its context is the
    model's longest input."""

    text = True

    def default_batch_size(self, config: Any, context: int | None) -> int:
        return 32

    def random_inputs(self, config: Any, n: int, seq: int, seed: int,
                      dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, config.vocab_size, (n, min(seq, max_context(config))),
                             generator=g)

    def context(self, config: Any) -> int | None:
        return max_context(config)


class CausalLM(TokenTask):
    name = "causal_lm"
    interface = ("vocab_size", "n_positions")

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        if not isinstance(dataset, TextDataset):
            raise GlmcError(f"{where} is a language model, but dataset '{dataset.name}' "
                            "holds images")
        longest = max_context(config)
        context = longest if context is None else context
        if context < 1:
            raise GlmcError(f"context must be at least 1, got {context}")
        check_text_fits(dataset, config.vocab_size, context, longest)
        n = dataset.split(split).numel()
        if n < context + 1:
            raise GlmcError(f"dataset '{dataset.name}': the {split} split has {n} tokens, too "
                            f"few for context {context} (give a smaller --context)")
        return context

    def default_batch_size(self, config: Any, context: int | None) -> int:
        """As many windows as keep the logits under 2**25 floats (1 to 64)."""
        return max(1, min(64, TEXT_LOGITS_BUDGET // (max(context or 1, 1) * config.vocab_size)))


#: Mask tokens of the usual tokenizers (BERT's, RoBERTa's), looked up when a config names none.
MASK_TOKENS = ("[MASK]", "<mask>")


class NoMaskToken(GlmcError):
    """A masked LM evaluated on text whose mask token neither its config nor the tokenizer
    names (:func:`glmc.evaluate.load_eval_data` says what to add to which config)."""


class MaskedLM(CausalLM):
    """A masked-language model: text windows with 15% of the tokens masked (80/10/10), the
    masks drawn from a generator seeded by ``MASK_SEED``; the loss is over masked tokens."""

    name = "masked_lm"
    MASK_SEED = 0
    targets = "masked tokens"
    scoring = (f"masked-LM loss over the masked tokens: {MASK_RATE:.0%} of the tokens chosen, "
               "80% of those replaced by the mask token, 10% by a random token, 10% kept; "
               f"masks drawn with seed {MASK_SEED}, the same for every model and λ")

    def mask_id(self, config: Any, dataset: TextDataset) -> int:
        """The config's ``mask_token_id``, else the tokenizer's ``[MASK]`` or ``<mask>``."""
        known = getattr(config, "mask_token_id", None)
        if known is not None:
            return int(known)
        lookup = getattr(dataset.tokenizer, "token_id", None)  # (a checkpoint's tokenizer)
        for token in MASK_TOKENS if lookup is not None else ():
            found = lookup(token)
            if found is not None:
                return int(found)
        raise NoMaskToken(f"dataset '{dataset.name}': no mask token is known for this "
                          "masked-language model (its config has no mask_token_id and the "
                          f"tokenizer no {' or '.join(MASK_TOKENS)})")

    def text_vocab(self, config: Any) -> int:
        appended = getattr(config, "mask_token_id", None) == config.vocab_size - 1
        return config.vocab_size - 1 if appended else config.vocab_size

    def view(self, config: Any, dataset: Dataset) -> Dataset:
        if not isinstance(dataset, TextDataset):
            return dataset  # (check_fits says why it does not fit)
        mask = self.mask_id(config, dataset)
        if not 0 <= mask < config.vocab_size:
            raise GlmcError(f"mask token {mask} is outside the model's {config.vocab_size} "
                            "tokens")
        return MaskedText.of(dataset, mask, self.MASK_SEED)


class SequenceClassifier(TokenTask):
    """Token ids -> one class per sequence (a classifier on the first token)."""

    name = "sequence_classifier"
    classifier = True
    targets = "sequences"
    scoring = "loss and accuracy per example of the labelled file, each read at its own length"
    interface = ("vocab_size", "n_positions", "num_labels")

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        if not isinstance(dataset, LabelledText):
            raise GlmcError(f"{where} is a sequence classifier: give labelled text, a .tsv "
                            f"of LABEL<TAB>TEXT lines (dataset '{dataset.name}' is not)")
        longest = max_context(config)
        context = longest if context is None else min(context, longest)
        if dataset.vocab_size > config.vocab_size:
            raise GlmcError(f"{dataset.name}: its tokenizer has {dataset.vocab_size} tokens, "
                            f"the model's vocabulary {config.vocab_size}")
        if dataset.num_classes > config.num_labels:
            raise GlmcError(f"{dataset.name} has labels up to {dataset.num_classes - 1}, but "
                            f"the model has {config.num_labels} classes")
        if not dataset.split(split):
            raise GlmcError(f"{dataset.name}: the {split} split is empty")
        return context



class ImageClassifier(Task):
    name = "image_classifier"
    classifier = True
    targets = "images"
    interface = ("image_size", "num_channels", "num_labels")

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        if isinstance(dataset, TextDataset):
            raise GlmcError(f"{where} is an image classifier, but dataset '{dataset.name}' "
                            "holds text")
        check_images_fit(dataset, config.image_size, config.num_channels, config.num_labels)
        if len(dataset.split(split)[1]) == 0:
            raise GlmcError(f"dataset '{dataset.name}': the {split} split is empty")
        return None

    def default_batch_size(self, config: Any, context: int | None) -> int:
        return DEFAULT_IMAGE_BATCH

    def random_inputs(self, config: Any, n: int, seq: int, seed: int,
                      dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        shape = (n, config.num_channels, config.image_size, config.image_size)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


class Features(TokenTask):
    """A bare encoder: token ids -> its last hidden state (B, T, d). It has no loss: it is
    aligned, merged and certified, not evaluated on data."""

    name = "features"
    interface = ("vocab_size", "n_positions", "d_model")
    targets = "tokens"

    def check_fits(self, config: Any, dataset: Dataset, split: str, context: int | None,
                   where: str) -> int | None:
        raise GlmcError(f"{where} is an encoder without a head (its output is its hidden "
                        "state): it has no loss to evaluate; align or merge it, or give a "
                        "model with a masked-LM or classification head")



TASKS: dict[str, Task] = {t.name: t for t in (CausalLM(), ImageClassifier(), MaskedLM(),
                                              SequenceClassifier(), Features())}


def task_of(config: Any) -> Task:
    """The task of a model config (any family's)."""
    try:
        return TASKS[config.task]
    except KeyError:
        raise GlmcError(f"unknown task {config.task!r} (one of {', '.join(TASKS)})") from None
