"""Evaluate canonical models, and a path between two of them, on a dataset split.

The loss is the mean cross-entropy over the evaluated split: token-weighted for language
models (every predicted token counts once), per image for classifiers, which also get the
top-1 accuracy. :class:`Evaluator` builds **one** float32 module and swaps weights into it in
place for every evaluation, so a sweep over λ never rebuilds the model::

    ev = Evaluator(a.config, fixed_batches(ds, "test", context=256))
    results = ev.evaluate_path(a.state, aligned_b.state, [0.0, 0.5, 1.0])
    results = ev.evaluate_along(LinePath(a, aligned_b), [0.0, 0.5, 1.0])  # the same

A path that is not a straight line in canonical coordinates (any :class:`InterpolationPath`,
e.g. the stock weights averaged as loaded, :class:`glmc.api.StockPair`) is evaluated point by
point with :meth:`Evaluator.evaluate_along`.

Before any long work, :func:`load_eval_data` reads the data the way the model was trained
(with the tokenizer saved beside the model; :func:`load_pair_data` for a pair, with the split
the models were trained on) and :func:`check_data_fits` rejects data that the
model cannot take (wrong task, vocabulary, image size, channel count or context), each with one
clear :class:`~glmc.errors.GlmcError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F

from glmc.data import (
    DATASETS,
    HF_TOKENIZER_FILE,
    IGNORE,
    TOKENIZER_FILE,
    Dataset,
    LabelledText,
    TextDataset,
    Tokenizer,
    fits_vocabulary,
    load_dataset,
    load_tokenizer,
    tokenizer_file,
    tokenizer_from_json,
)
from glmc.data.batches import fixed_batches
from glmc.data.gpt2_bpe import END_OF_TEXT_ID
from glmc.data.splits import check_split
from glmc.defaults import DEFAULT_TEXT_TOKENS
from glmc.devices import resolve_device
from glmc.errors import GlmcError, Note, reason
from glmc.families.registry import family_of
from glmc.io.folders import canonical
from glmc.tasks import MaskedLM, NoMaskToken, task_of
from glmc.tensors import StateDict, interpolate

if TYPE_CHECKING:
    from glmc.model import CanonicalModel

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class EvalResult:
    """Mean loss (and accuracy) of one model on the evaluated data.

    Attributes:
        loss: mean cross-entropy (nats) per target (token or image).
        accuracy: top-1 accuracy in [0, 1] for classifiers, None for language models.
        count: number of targets evaluated (tokens or images).
        batch_losses: each fixed batch's summed loss (nats), shape (batches,): the units of
            a standard error (see :func:`glmc.barrier.batch_barriers`).
        batch_counts: each batch's number of targets, shape (batches,).
    """

    loss: float
    accuracy: float | None
    count: int
    batch_losses: tuple[float, ...] = ()
    batch_counts: tuple[int, ...] = ()


# -- data ---------------------------------------------------------------------------------


def _saved_tokenizer(model: Any) -> tuple[Tokenizer | None, str | None]:
    """The tokenizer a model carries (a folder's ``glmc_tokenizer.json``) and where from."""
    from glmc.io.folders import LoadedModel
    from glmc.model import CanonicalModel

    if isinstance(model, (str, Path)):
        return load_tokenizer(model), str(tokenizer_file(model))
    folder = model.path if isinstance(model, LoadedModel) else None
    if isinstance(model, LoadedModel):
        model = model.canonical
    if not isinstance(model, CanonicalModel):
        return None, None
    for name in (TOKENIZER_FILE, HF_TOKENIZER_FILE):  # (glmc's own first)
        text = model.files.get(name)
        if text is not None:
            where = str(folder / name) if folder is not None else f"the model's {name}"
            return tokenizer_from_json(text, where), where
    return None, None


def _folder_tokenizer(models: Iterable[Any]) -> tuple[Tokenizer | None, str | None]:
    """The tokenizer saved with the models (they must agree), and where it was found.

    ``models``: folders, LoadedModels or CanonicalModels (which carry their folder's files).
    """
    found: tuple[Tokenizer, str] | None = None
    for model in models:
        tok, where = _saved_tokenizer(model)
        if tok is None:
            continue
        if found is not None and found[0].to_json() != tok.to_json():
            raise GlmcError(f"{found[1]} and {where} hold different tokenizers; the models "
                            "were not trained on the same token ids")
        found = found or (tok, str(where))
    return found if found is not None else (None, None)


_UNKNOWN_CHAR = re.compile(r"^(character .*) is not in the (\d+)-character vocabulary$")


def load_eval_data(
    data: str | Path | Dataset,
    config: Any,
    *,
    folders: Sequence[Any] = (),
    tokenizer: str | Tokenizer | None = None,
    seed: int = 0,
) -> Dataset:
    """Load ``data`` (a dataset name or path, or a loaded dataset) for a model of ``config``.

    Text is encoded with ``tokenizer`` when given, else with the ``glmc_tokenizer.json``
    saved with ``folders`` (model folders, LoadedModels or CanonicalModels), else, for a
    named dataset, with the dataset's own tokenizer. Whichever it is, its vocabulary must be
    the model's: a text file with no tokenizer known, or a tokenizer of another size, is
    refused rather than evaluated into a meaningless number. A character the tokenizer
    lacks is one clear error naming the file.

    Raises:
        GlmcError: unreadable, empty or malformed data, text the tokenizer cannot encode, or
            no tokenizer that matches the model's vocabulary.
    """
    task = task_of(config)
    if not isinstance(data, (str, Path)):
        return task.view(config, data)
    if not task.text:
        return load_dataset(str(data), seed=seed)  # images: no tokenizer
    source = None if tokenizer is None else "--tokenizer"
    if tokenizer is None:
        tokenizer, source = _folder_tokenizer(folders)
    if tokenizer is not None and not isinstance(tokenizer, str):
        _check_vocab(tokenizer, config, f"{source}: the tokenizer", folders=folders)
    ds = _load_text(data, tokenizer, source, seed)
    if isinstance(ds, LabelledText):
        if tokenizer is None:
            raise GlmcError(f"{data}: no tokenizer is known for the model (no "
                            f"{TOKENIZER_FILE} or tokenizer.json beside it), so the text's "
                            "token ids would be a guess; pass --tokenizer")
        _check_vocab(ds.tokenizer, config, f"{data}: the tokenizer", folders=folders)
    if isinstance(ds, TextDataset):
        if tokenizer is None and str(data).lower() not in DATASETS:
            raise GlmcError(f"{data}: no tokenizer is known for the model (no "
                            f"{TOKENIZER_FILE} beside it), so the text's token ids would be "
                            f"a guess; {TOKENIZER_FIX.format(vocab=config.vocab_size)}")
        # (a kind named, or a named dataset's own: the advice is never the kind just tried)
        tried = ds.tokenizer.kind if tokenizer is None or isinstance(tokenizer, str) else None
        _check_vocab(ds.tokenizer, config,
                     f"{data}: the {ds.tokenizer.kind} tokenizer of the data", tried, folders)
    try:
        return task.view(config, ds)
    except NoMaskToken as e:
        raise GlmcError(f"{e}; {_mask_fix(folders, 'ID (the id the model reads as its mask)')}"
                        ", or evaluate it with its own tokenizer.json beside it") from None


#: How to give text a tokenizer (the command-line option, or ``tokenizer=`` in Python).
TOKENIZER_FIX = ("pass --tokenizer char (the text's sorted characters) or --tokenizer gpt2, "
                 "whichever has the model's {vocab} tokens")
#: The size of GPT-2's BPE vocabulary (``--tokenizer gpt2``).
GPT2_VOCAB = END_OF_TEXT_ID + 1


def tokenizer_fix(vocab: int, tried: str | None = None) -> str:
    """How to read text with a tokenizer of the model's ``vocab`` tokens, after the kind
    ``tried`` (``"char"``, ``"gpt2"``; None: none was) gave another size: another kind where
    one can fit, else that the text does not fit the model's tokenizer."""
    if tried is None:
        return TOKENIZER_FIX.format(vocab=vocab)
    if tried == "char" and vocab == GPT2_VOCAB:
        return f"the model has GPT-2's {GPT2_VOCAB} tokens: pass --tokenizer gpt2"
    if tried == "gpt2":
        return ("the text does not fit this model's tokenizer as GPT-2's BPE; --tokenizer char "
                f"fits only a model trained on the text's own characters ({vocab} of them)")
    return (f"the text does not fit this model's tokenizer: its characters are not the model's "
            f"{vocab} tokens, nor is GPT-2's BPE ({GPT2_VOCAB}); evaluate text the model was "
            f"trained on, or put the model's {TOKENIZER_FILE} beside it")


def _check_vocab(tokenizer: Tokenizer, config: Any, what: str, tried: str | None = None,
                 folders: Sequence[Any] = ()) -> None:
    """A GlmcError unless ``tokenizer``'s ids are the model's (``folders``: the models, named
    when a masked LM's config lacks the mask token that the one id more would be)."""
    task = task_of(config)
    vocab = task.text_vocab(config)
    if not fits_vocabulary(tokenizer, vocab):
        size = tokenizer.vocab_size
        if (isinstance(task, MaskedLM) and getattr(config, "mask_token_id", None) is None
                and size == vocab - 1):  # (the mask appended after the text's tokens)
            raise GlmcError(f"{what} has {size} tokens, the model's vocabulary {vocab}: one "
                            "more, as a mask token appended after them would make, but the "
                            f"model's config names no mask token; if that is its mask, "
                            f"{_mask_fix(folders, str(vocab - 1))}")
        raise GlmcError(f"{what} has {size} tokens, the model's vocabulary {vocab}; "
                        "the token ids would not be the model's "
                        f"({tokenizer_fix(vocab, tried)})")


def _mask_fix(folders: Sequence[Any], mask: str) -> str:
    """What a masked LM's config needs added to name its ``mask`` token id, and where."""
    from glmc.io.folders import name_of

    names = [n for n in dict.fromkeys(name_of(f, "") for f in folders) if n]
    where = " and ".join(f"{n}/config.json" for n in names) or "the model's config.json"
    return f'add "mask_token_id": {mask} to {where}'



def _load_text(data: str | Path, tokenizer: str | Tokenizer | None, source: str | None,
               seed: int) -> Dataset:
    """``load_dataset`` with a clearer message for a character the tokenizer lacks."""
    try:
        return load_dataset(str(data), seed=seed, tokenizer=tokenizer or "char")
    except GlmcError as e:
        m = _UNKNOWN_CHAR.match(str(e))
        if m and tokenizer is not None and not isinstance(tokenizer, str):
            where = f" ({source})" if source is not None else ""
            raise GlmcError(f"{data}: the model's vocabulary{where} lacks {m.group(1)} "
                            f"(it has {m.group(2)} characters)") from None
        raise


def training_record(model: Any) -> tuple[dict, Path] | None:
    """A model folder's training record (``glmc_train.json``, written by ``glmc train``) and
    its path, checked to hold an integer ``data_seed``.

    ``model``: a folder or a LoadedModel; None for a folder without a record, or a model made
    in memory.
    """
    from glmc.io.folders import TRAIN_FILE, LoadedModel

    if isinstance(model, LoadedModel):
        model = model.path
    if not isinstance(model, (str, Path)) or not (Path(model) / TRAIN_FILE).is_file():
        return None
    path = Path(model) / TRAIN_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GlmcError(f"{path}: not a glmc training record ({reason(e)})") from None
    seed = record.get("data_seed") if isinstance(record, dict) else None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise GlmcError(f"{path}: not a glmc training record (no integer data_seed)")
    return record, path


def recorded_split_seed(model: Any) -> tuple[int, Path] | None:
    """The image split seed in a model folder's training record and the record's path (see
    :func:`training_record`); None without a record."""
    found = training_record(model)
    return None if found is None else (found[0]["data_seed"], found[1])


def _data_name(record: dict) -> str | None:
    """The data a record's run trained on, as compared between records: a dataset's name
    (any case), a path's file name (one file reached by two paths is the same data)."""
    data = record.get("data")
    if not isinstance(data, str):
        return None
    return data.lower() if data.lower() in DATASETS else Path(data).name


def check_training_data(models: Sequence[Any], images: bool) -> None:
    """The models' training records (those that hold one) must name the same data, and for
    ``images`` the same split seed: else their test splits differ, and one may hold what the
    other trained on (text splits are contiguous, the same for every seed).

    Raises:
        GlmcError: records that disagree; the message names both folders and both values.
    """
    records = [r for r in map(training_record, models) if r is not None]
    for record, path in records[1:]:
        first, where = records[0]
        ours, theirs = _data_name(first), _data_name(record)
        if ours is not None and theirs is not None and ours != theirs:
            raise GlmcError(f"{where.parent} was trained on {first['data']!r}, {path.parent} on "
                            f"{record['data']!r} ({path.name}); they do not share a test split")
        if images and record["data_seed"] != first["data_seed"]:
            raise GlmcError(f"{where.parent} was trained on split seed {first['data_seed']}, "
                            f"{path.parent} on {record['data_seed']}; they do not share a test "
                            "split")


def split_warnings(models: Sequence[Any]) -> list[str]:
    """The note for a pair (folders, LoadedModels or CanonicalModels) evaluated or trained
    on data when either holds no training record: whether the test split holds nothing it
    trained on cannot be checked (a record says which data and split the run used)."""
    from glmc.io.folders import TRAIN_FILE, name_of

    missing = [name_of(m, "B" if i else "A") for i, m in enumerate(models)
               if training_record(m) is None]
    missing = list(dict.fromkeys(missing))
    if not missing:
        return []
    verb = "holds" if len(missing) == 1 else "hold"
    names = " and ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
    return [Note(f"{names} {verb} no training record ({TRAIN_FILE}, written "
                 "by glmc train): the test split's independence from the models' training "
                 "data cannot be checked")]


def split_seed(models: Sequence[Any], data_seed: int | None = None) -> int:
    """The seed of the image split that ``models`` were trained on, so that their test split
    holds nothing they trained on.

    It comes from the models' training records (see :func:`recorded_split_seed`), which must
    agree (see :func:`check_training_data`); ``data_seed`` (``--data-seed``) applies only
    where no model holds a record, and must equal a record it meets; 0 when there is neither.

    Raises:
        GlmcError: records that disagree, or a ``data_seed`` that contradicts one; the message
            names the folders and both seeds.
    """
    check_training_data(models, images=True)
    records = [r for r in map(recorded_split_seed, models) if r is not None]
    if not records:
        return 0 if data_seed is None else data_seed
    seed, path = records[0]
    if data_seed is not None and data_seed != seed:
        raise GlmcError(f"--data-seed {data_seed} contradicts {path.parent}, trained on split "
                        f"seed {seed} ({path.name}): drop --data-seed (data_seed= in Python)")
    return seed


def load_pair_data(
    data: str | Path | Dataset,
    config: Any,
    models: Sequence[Any],
    *,
    tokenizer: str | Tokenizer | None = None,
    data_seed: int | None = None,
) -> tuple[Dataset, int | None]:
    """The data a pair of models is evaluated on, and learned matching trains on.

    ``data`` is read as :func:`load_eval_data` reads it (text with the tokenizer saved with
    ``models``: folders, LoadedModels or CanonicalModels); an image dataset is split with the
    seed the models were trained on (:func:`split_seed`, ``data_seed`` where they hold no
    record). Text splits are contiguous: text ignores data seeds. Models whose training
    records name other data (or, for images, another split seed) are refused
    (:func:`check_training_data`); see :func:`split_warnings` for models without one.

    Returns:
        (dataset, the split seed used; None for text or an already loaded dataset).
    """
    images = not task_of(config).text
    check_training_data(models, images)
    seed = None
    if isinstance(data, (str, Path)) and images:
        seed = split_seed(models, data_seed)
    ds = load_eval_data(data, config, folders=models, tokenizer=tokenizer, seed=seed or 0)
    return ds, seed


def check_data_fits(
    config: Any,
    dataset: Dataset,
    *,
    split: str = "test",
    context: int | None = None,
    where: str = "the model",
) -> int | None:
    """Raise GlmcError unless a model of ``config`` can be evaluated on ``split`` of ``dataset``.

    Checks the task (text vs images), the vocabulary / image size / channels / classes, and
    that the split holds at least one window of ``context`` tokens (+1 target).

    Returns:
        the context to evaluate text with (``context`` or the model's ``n_positions``); None
        for images.
    """
    check_split(split)
    return task_of(config).check_fits(config, dataset, split, context, where)


def default_batch_size(config: Any, context: int | None) -> int:
    """Images: 250. Text: as many windows as keep the logits under 2**25 floats (1 to 64)."""
    return task_of(config).default_batch_size(config, context)


# -- evaluation ---------------------------------------------------------------------------


class InterpolationPath(Protocol):
    """A path between two models: ``model_at(λ)`` is θ(λ) in canonical form (λ = 1 is A,
    λ = 0 is B), for any λ in [0, 1]."""

    def model_at(self, lam: float) -> CanonicalModel: ...


@dataclass(frozen=True)
class LinePath:
    """θ(λ) = λ·a + (1 − λ)·b in canonical coordinates (a and b of the same shapes)."""

    a: CanonicalModel
    b: CanonicalModel

    def model_at(self, lam: float) -> CanonicalModel:
        return self.a.with_state(interpolate(self.a.state, self.b.state, lam))


class Evaluator:
    """One module of ``config`` and fixed batches; evaluates state dicts by swapping weights.

    The module is built once (``dtype``, default float32, on ``device``); :meth:`evaluate`
    and :meth:`evaluate_path` copy weights into its parameters in place.
    """

    def __init__(
        self,
        config: Any,
        batches: Sequence[Batch],
        *,
        device: str | torch.device | None = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.config, self.dtype = config, dtype
        self.device = resolve_device(device)
        with torch.device("meta"):
            shell = family_of(config).build(config)
        self.module = shell.to_empty(device=self.device).to(dtype).eval()
        self.module.requires_grad_(False)
        # Parameters and buffers alike (a BatchNorm's running statistics are interpolated
        # with the weights): every entry of the state dict, as the module's own tensors.
        self.params: dict[str, torch.Tensor] = dict(self.module.state_dict(keep_vars=True))
        self.batches = [(x.to(self.device, dtype) if x.is_floating_point() else
                         x.to(self.device), y.to(self.device)) for x, y in batches]
        # (targets IGNORE are not scored: a masked LM's unmasked tokens)
        self.batch_counts = tuple(int((y != IGNORE).sum()) for _, y in self.batches)
        self.count = sum(self.batch_counts)
        self._others: list[Evaluator] = []  # modules of other configs (see evaluate_along)

    def prepare(self, state: Mapping[str, torch.Tensor]) -> StateDict:
        """``state`` on the evaluator's device and dtype, checked against the module."""
        missing = sorted(set(self.params) - set(state))
        extra = sorted(set(state) - set(self.params))
        if missing or extra:
            raise GlmcError(f"state does not fit the model: missing {missing[:3]}, "
                            f"unexpected {extra[:3]}")
        out = {}
        for k, p in self.params.items():
            if tuple(state[k].shape) != tuple(p.shape):
                raise GlmcError(f"tensor {k}: shape {list(state[k].shape)}, the model has "
                                f"{list(p.shape)}")
            out[k] = state[k].to(self.device, self.dtype)
        return out

    @torch.no_grad()
    def load(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state`` into the module's parameters (no new module)."""
        for k, p in self.params.items():
            p.copy_(state[k])

    @torch.no_grad()
    def load_interpolated(self, a: StateDict, b: StateDict, lam: float) -> None:
        """Parameters := λ·a + (1 − λ)·b in place (exactly a at λ = 1 and b at λ = 0).

        ``a`` and ``b`` must come from :meth:`prepare`.
        """
        for k, p in self.params.items():
            if lam == 1.0:
                p.copy_(a[k])
            elif lam == 0.0:
                p.copy_(b[k])
            else:
                torch.lerp(b[k], a[k], lam, out=p)

    @torch.inference_mode()
    def run(self) -> EvalResult:
        """Evaluate the weights currently in the module on the fixed batches."""
        sums = []
        correct = torch.zeros((), dtype=torch.float64, device=self.device)
        classifier = task_of(self.config).classifier
        for x, y in self.batches:
            logits = self.module(x).float()
            logits = logits.reshape(-1, logits.shape[-1])
            target = y.reshape(-1)
            sums.append(F.cross_entropy(logits, target, reduction="sum").double())
            if classifier:
                correct += (logits.argmax(-1) == target).sum().double()
        per_batch = torch.stack(sums).tolist() if sums else []  # (one device sync)
        loss = sum(per_batch) / self.count  # (in order: the float64 sum as before)
        return EvalResult(loss, float(correct) / self.count if classifier else None, self.count,
                          tuple(per_batch), self.batch_counts)

    def evaluate(self, state: Mapping[str, torch.Tensor]) -> EvalResult:
        """Loss (and accuracy) of the model with weights ``state``."""
        self.load(self.prepare(state))
        return self.run()

    def evaluate_path(
        self,
        state_a: Mapping[str, torch.Tensor],
        state_b: Mapping[str, torch.Tensor],
        lambdas: Sequence[float],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[EvalResult]:
        """Evaluate θ(λ) = λ·θ_A + (1 − λ)·θ_B at every λ (λ = 1 is A, λ = 0 is B).

        progress(done, total) is called after each point.
        """
        a, b = self.prepare(state_a), self.prepare(state_b)
        results = []
        for i, lam in enumerate(lambdas):
            self.load_interpolated(a, b, float(lam))
            results.append(self.run())
            if progress is not None:
                progress(i + 1, len(lambdas))
        return results

    def evaluate_along(
        self,
        path: InterpolationPath,
        lambdas: Sequence[float],
        progress: Callable[[int, int], None] | None = None,
    ) -> list[EvalResult]:
        """Evaluate ``path`` at every λ; progress(done, total) after each point.

        A :class:`LinePath` is interpolated in place in the module (:meth:`evaluate_path`);
        any other path gives θ(λ) point by point. A θ(λ) whose config is not the module's
        (e.g. a GPT-2 whose averaged final LayerNorm γ is ill conditioned at that λ takes
        the head-bias form) is evaluated in a module of its config, built once, on the same
        batches.
        """
        if isinstance(path, LinePath):
            return self.evaluate_path(path.a.state, path.b.state, lambdas, progress)
        results = []
        for i, lam in enumerate(lambdas):
            model = path.model_at(float(lam))
            results.append(self._evaluator_for(model.config).evaluate(model.state))
            if progress is not None:
                progress(i + 1, len(lambdas))
        return results

    def _evaluator_for(self, config: Any) -> Evaluator:
        """This evaluator when ``config`` builds its module, else one of ``config`` on its
        batches (``source``, where a model came from, builds nothing)."""
        for ev in (self, *self._others):
            if config.replace(source={}) == ev.config.replace(source={}):
                return ev
        other = Evaluator(config, self.batches, device=self.device, dtype=self.dtype)
        self._others.append(other)
        return other


def evaluate(
    model,
    data: str | Path | Dataset,
    split: str = "test",
    *,
    context: int | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    device: str | torch.device | None = "cpu",
    seed: int = 0,
    tokenizer: str | Tokenizer | None = None,
) -> EvalResult:
    """Loss (and accuracy) of one model (CanonicalModel, LoadedModel or folder) on ``data``.

    See :func:`fixed_batches` for ``max_batches``; text is read with the model's tokenizer
    (or ``tokenizer``, see :func:`load_eval_data`).
    """
    m = canonical(model)
    ds = load_eval_data(data, m.config, folders=[m], tokenizer=tokenizer, seed=seed)
    context = check_data_fits(m.config, ds, split=split, context=context)
    bs = batch_size or default_batch_size(m.config, context)
    batches = fixed_batches(ds, split, batch_size=bs, context=context, max_batches=max_batches)
    return Evaluator(m.config, batches, device=device).evaluate(m.state)


__all__ = [
    "DEFAULT_TEXT_TOKENS",
    "EvalResult",
    "Evaluator",
    "InterpolationPath",
    "LinePath",
    "check_data_fits",
    "default_batch_size",
    "evaluate",
    "fixed_batches",
    "load_eval_data",
    "load_pair_data",
    "resolve_device",
    "split_seed",
    "split_warnings",
    "tokenizer_fix",
    "training_record",
]
