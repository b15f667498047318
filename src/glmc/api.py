"""The Python API: align, merge and interpolate models in a notebook.

>>> import glmc
>>> a, b = glmc.load("runs/gpt-a"), glmc.load("runs/gpt-b")
>>> result = glmc.align(a, b)                      # weight matching, orthogonal residual
>>> merged, alignment = glmc.merge(a, b, alpha=0.5, align_method="weight")
>>> vanilla, _ = glmc.merge("runs/gpt-a", "runs/gpt-b", align_method="none")  # stock average
>>> result.save("runs/b-aligned")                  # what `glmc align ... -o` writes
>>> glmc.save(merged, "runs/merged")               # what `glmc merge ... -o` writes
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glmc.correction import check_correction, correct
from glmc.data import TOKENIZER_FILE, Dataset, Tokenizer
from glmc.defaults import ALIGN_METHODS, MERGE_METHODS
from glmc.errors import GlmcError
from glmc.evaluate import check_data_fits, fixed_batches, load_pair_data
from glmc.families.importers import Importer
from glmc.io.folders import REPORT, LoadedModel, load_model, save_folder, write_json
from glmc.io.outputs import check_output, model_bytes, output_errors
from glmc.matching.activation import activation_matching
from glmc.matching.learned import LearnedMatchingOptions, LearnedResult, learned_matching
from glmc.matching.weight import (
    MatchResult,
    WeightMatchingOptions,
    centred_pair,
    check_pair,
    weight_matching,
)
from glmc.model import CanonicalModel
from glmc.symmetry.transform import StateDict, Transform
from glmc.verify import canonical_logits, certify_folder, random_inputs

_WM = WeightMatchingOptions()  # defaults are defined once, in the options

ModelLike = CanonicalModel | LoadedModel | str | Path

METHODS = ALIGN_METHODS


def load(path: str | Path, *, allow_pickle: bool = False) -> LoadedModel:
    """Read a model folder (Hugging Face or glmc) into canonical form."""
    return load_model(path, allow_pickle=allow_pickle)


def canonical(model: ModelLike) -> CanonicalModel:
    if isinstance(model, (str, Path)):
        model = load_model(model)
    return model.canonical if isinstance(model, LoadedModel) else model


def name_of(model: Any, default: str) -> str:
    """A model's folder for messages and reports (``default`` for one made in memory)."""
    if isinstance(model, LoadedModel):
        return str(model.path)
    return str(model) if isinstance(model, (str, Path)) else default


def _same_json(x: str, y: str) -> bool:
    try:
        return json.loads(x) == json.loads(y)
    except ValueError:
        return x == y


def shared_tokenizer(a: CanonicalModel, b: CanonicalModel, where: str = "A vs B") -> str | None:
    """The tokenizer file both models were trained with (``glmc_tokenizer.json``; one of them
    may lack it), or None; a GlmcError when they hold different ones."""
    ta, tb = a.files.get(TOKENIZER_FILE), b.files.get(TOKENIZER_FILE)
    if ta is not None and tb is not None and not _same_json(ta, tb):
        raise GlmcError(f"{where}: the models hold different tokenizers ({TOKENIZER_FILE}); "
                        "they were not trained on the same token ids, so they are not "
                        "comparable")
    return ta if ta is not None else tb


def read_token_counts(path: str | Path, vocab_size: int) -> torch.Tensor:
    """Token counts (vocab_size,) from .json (list, or {id: count}), .npy or whitespace text."""
    p = Path(path)
    if not p.is_file():
        raise GlmcError(f"{p}: no such token-count file")
    try:
        if p.suffix == ".json":
            raw = json.loads(p.read_text())
            if isinstance(raw, dict):
                counts = np.zeros(vocab_size)
                for k, v in raw.items():
                    if not 0 <= int(k) < vocab_size:
                        raise ValueError(f"token id {k} outside the vocabulary")
                    counts[int(k)] = float(v)
            else:
                counts = np.asarray(raw, dtype=np.float64)
        elif p.suffix == ".npy":
            counts = np.load(p, allow_pickle=False).astype(np.float64)
        else:
            counts = np.asarray(p.read_text().split(), dtype=np.float64)
    except (ValueError, TypeError, IndexError, json.JSONDecodeError) as e:
        raise GlmcError(f"{p}: cannot read token counts ({e})") from None
    if counts.shape != (vocab_size,):
        raise GlmcError(f"{p}: {counts.size} token counts, the vocabulary has {vocab_size}")
    return torch.from_numpy(counts)


def prepare_pair(model_a: ModelLike, model_b: ModelLike,
                 heads: str = "inner") -> tuple[CanonicalModel, CanonicalModel]:
    """Both models in canonical form (attention as circuits for ``heads="circuit"``), checked
    to have the same parameters and shapes, all finite."""
    if heads not in ("inner", "circuit"):
        raise GlmcError(f"unknown heads mode {heads!r} (inner or circuit)")
    a, b = canonical(model_a), canonical(model_b)
    tokenizer = shared_tokenizer(a, b, f"{name_of(model_a, 'A')} vs {name_of(model_b, 'B')}")
    if tokenizer is not None:  # (an output of either carries it)
        a, b = (m.with_files({TOKENIZER_FILE: tokenizer}) for m in (a, b))
    if heads == "circuit":
        a, b = (m.family.circuit_form(m) for m in (a, b))
    check_pair(a, b)
    return a, b


@dataclass(frozen=True)
class StockPair:
    """Two Hugging Face models as loaded, before the canonical rewrite: the path of the
    paper's vanilla average θ(α) = α·stock_A + (1 − α)·stock_B (LayerNorm γ and β averaged as
    they are; α = 1 is A). An :class:`~glmc.evaluate.InterpolationPath`.

    Not linear in canonical coordinates (γ and β are folded into the readers after them), so
    every point is averaged in stock form and brought to canonical form by the importer, an
    exact rewrite: canonical(θ(α)) computes θ(α)'s function.

    Attributes:
        importer, hf_config: A's; the averaged model's class and config.
        a, b: the stock state dicts (same names and shapes).
        files: what the averaged model carries (A's tokenizer and generation config).
    """

    importer: Importer
    hf_config: Any
    a: StateDict
    b: StateDict
    files: dict[str, str] = field(default_factory=dict)

    def state_at(self, alpha: float) -> StateDict:
        """The stock state dict α·stock_A + (1 − α)·stock_B."""
        return interpolate(self.a, self.b, alpha)

    def model_at(self, alpha: float) -> CanonicalModel:
        """:meth:`state_at` in canonical form (same function)."""
        return self.importer.to_canonical(self.hf_config, self.state_at(alpha)).with_files(
            self.files)


#: Why ``none`` cannot average a model: it holds no stock weights.
_NO_STOCK = ("align method none averages the stock weights as loaded, but {what}; use "
             "canonical instead (averaging in canonical coordinates, after the exact RMSNorm "
             "rewrite)")


def stock_pair(model_a: ModelLike, model_b: ModelLike) -> StockPair:
    """The stock weights of two Hugging Face model folders (or LoadedModels of them), for the
    vanilla average (method ``none``).

    A pair where one model ties its LM head to the embedding and the other does not is
    averaged untied (the tied head made an explicit copy: the same model).

    Raises:
        GlmcError: an input that holds no stock weights (a glmc folder, a model in memory),
            naming it and pointing to ``canonical``; models of different architectures, or
            whose stock tensors differ in names or shapes.
    """
    loaded = []
    for model, who in ((model_a, "A"), (model_b, "B")):
        if isinstance(model, (str, Path)):
            model = load_model(model)
        if not isinstance(model, LoadedModel):
            raise GlmcError(_NO_STOCK.format(what=f"model {who} is a model in memory, in "
                                             "canonical form only"))
        if model.importer is None:
            raise GlmcError(_NO_STOCK.format(what=f"{model.path} is a glmc folder (canonical "
                                             "weights only)"))
        if model.stock_state is None:
            raise GlmcError(_NO_STOCK.format(what=f"{model.path} was loaded without its stock "
                                             "weights"))
        loaded.append(model)
    la, lb = loaded
    where = f"{la.path} vs {lb.path}"
    if la.importer is not lb.importer:
        raise GlmcError(f"{where}: the models are of different architectures "
                        f"({la.importer.name}, {lb.importer.name})")
    (ca, sa), (cb, sb) = ((m.hf_config, m.stock_state) for m in loaded)
    tied = [getattr(c, "tie_word_embeddings", None) for c in (ca, cb)]
    if tied[0] != tied[1] or set(sa) != set(sb):  # (one ties its head, the other not)
        (ca, sa), (cb, sb) = la.importer.untied(ca, sa), lb.importer.untied(cb, sb)
    only = sorted(set(sa) ^ set(sb))
    if only:
        raise GlmcError(f"{where}: tensor {only[0]} is stored in "
                        f"{'A' if only[0] in sa else 'B'} only; the stock weights cannot be "
                        "averaged")
    for name in sa:
        if sa[name].shape != sb[name].shape:
            raise GlmcError(f"{where}: tensor {name}: shape {list(sa[name].shape)} in A, "
                            f"{list(sb[name].shape)} in B")
    return StockPair(la.importer, ca, sa, sb, dict(la.canonical.files))


@dataclass
class Alignment:
    """B aligned to A: ``aligned`` = transform applied to ``b`` (same function as ``b``).

    ``settings``: what produced it (inputs, method, residual, heads), for the report.
    """

    a: CanonicalModel
    b: CanonicalModel
    aligned: CanonicalModel
    transform: Transform
    match: MatchResult | None
    learned: LearnedResult | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        """The report ``glmc align`` writes (without the certificate and timing)."""
        return {"command": "align", **self.settings,
                "matching": self.match.to_json() if self.match else None,
                "learned": self.learned.to_json() if self.learned else None}

    def save(self, path: str | Path, *, force: bool = False, stock: bool = True) -> dict:
        """Write B aligned as ``glmc align`` does: the model folder (stock class when
        representable) with B's tokenizer and generation config, ``transform.safetensors``,
        and ``glmc_report.json`` with the certificate that the folder computes B's function.
        An existing non-empty ``path`` needs ``force``. Returns the report."""
        report = save(self.aligned, path, force=force, stock=stock, report=self.report(),
                      transform=self.transform)
        x = random_inputs(self.b.config)
        report["certificate"] = certify_folder(path, x, canonical_logits(self.b)(x))
        write_report(path, report)
        return report


def align(
    model_a: ModelLike,
    model_b: ModelLike,
    *,
    method: str = "weight",
    residual: str = "orthogonal",
    heads: str = "inner",
    max_iter: int = _WM.max_iter,
    tol: float = _WM.tol,
    weighting: str = _WM.weighting,
    bias_weight: float = _WM.bias_weight,
    unit_cost: str = _WM.unit_cost,
    inner: str | None = None,
    init: str = _WM.init,
    token_counts: torch.Tensor | None = None,
    data: str | Path | Dataset | None = None,
    tokenizer: str | Tokenizer | None = None,
    data_seed: int | None = None,
    learned: LearnedMatchingOptions | None = None,
    progress=None,
    learned_progress=None,
) -> Alignment:
    """Align B to A modulo the symmetries of their spec.

    heads: "inner" keeps head_dim (heads assigned by what is left after aligning each pair's
    inner bases); "circuit" rewrites both models with attention in circuit form first (exact;
    the result is no longer the stock architecture).
    max_iter, tol, weighting, bias_weight, unit_cost, inner, init: weight matching's options (see
    :class:`glmc.matching.options.WeightMatchingOptions`).
    token_counts: (vocab,) counts; vocabulary rows of unseen tokens do not count.
    method "learned": weight matching, then learned matching on ``data`` (a dataset name or
    path, as ``--data`` takes, or a glmc.data dataset; text is encoded with the models'
    tokenizer or ``tokenizer``) with options ``learned``; its residual group follows
    ``residual`` (permutation: the paper's permutation-only ablation). An image dataset is
    split as the models were trained (their ``glmc_train.json``; ``data_seed`` only for
    models without one, see :func:`glmc.evaluate.split_seed`); ``learned.seed`` draws the
    data order and λ only.
    """
    if method not in METHODS:
        raise GlmcError(f"unknown alignment method {method!r} (available: {', '.join(METHODS)})")
    a, b = prepare_pair(model_a, model_b, heads)
    settings = {"a": name_of(model_a, "A"), "b": name_of(model_b, "B"), "method": method,
                "residual": residual, "heads": heads}
    options = replace(learned or LearnedMatchingOptions(), residual=residual)
    if method in ("learned", "activation"):  # the data are checked before any matching
        data, seed = learning_data(a, data, tokenizer, settings["a"],
                                   models=(model_a, model_b), data_seed=data_seed,
                                   method=method)
        if seed is not None:
            settings["data_seed"] = seed
    if method == "activation":
        transform = activation_matching(a, b, statistics_batches(a, data))
        return Alignment(a, b, b.transformed(transform), transform, None, settings=settings)
    row_masks = {}
    if token_counts is not None:
        rows = a.family.token_rows(a.config)
        if not rows:
            raise GlmcError("token counts apply to language models only")
        if token_counts.numel() != a.config.vocab_size:
            raise GlmcError(f"{token_counts.numel()} token counts for a vocabulary of "
                            f"{a.config.vocab_size}")
        mask = token_counts > 0
        row_masks = {name: (axis, mask) for name, axis in rows.items()}
    opts = WeightMatchingOptions(residual=residual, max_iter=max_iter, tol=tol,
                                 weighting=weighting, bias_weight=bias_weight,
                                 unit_cost=unit_cost, inner=inner, init=init, row_masks=row_masks)
    match = weight_matching(a, b, opts, progress=progress)
    if method == "weight":
        return Alignment(a, b, b.transformed(match.transform), match.transform, match,
                         settings=settings)
    result = learned_matching(a, b, data, match.transform, options,
                              fix_ones=centred_pair(a, b), progress=learned_progress,
                              inner=opts.inner)
    return Alignment(a, b, b.transformed(result.transform), result.transform, match, result,
                     settings)


def learning_data(a: CanonicalModel, data: str | Path | Dataset | None,
                  tokenizer: str | Tokenizer | None, where: str, *,
                  models: Sequence[Any] = (), data_seed: int | None = None,
                  method: str = "learned") -> tuple[Dataset, int | None]:
    """The data of a data-driven method (learned or activation matching, a correction: a
    name, a path or a dataset), checked to fit ``a`` in its train and val splits, and the
    image split seed used (None for text).

    ``models``: the pair as given (folders and LoadedModels hold their training records, whose
    split seed wins; ``data_seed`` applies when none does; see :func:`load_pair_data`)."""
    if data is None:
        raise GlmcError(f"{method} reads training data: give --data (data= in Python)")
    ds, seed = load_pair_data(data, a.config, [a, *models], tokenizer=tokenizer,
                              data_seed=data_seed)
    for split in ("train", "val"):
        check_data_fits(a.config, ds, split=split, where=where)
    return ds, seed


#: Training examples the data-driven steps read (activation matching, BatchNorm reset,
#: REPAIR): enough for stable per-unit statistics, in fixed batches of the train split.
STATISTICS_EXAMPLES = 2000


def statistics_batches(a: CanonicalModel, data: Dataset) -> list:
    """Fixed training batches (the first ``STATISTICS_EXAMPLES`` examples, or windows of
    text) for per-unit statistics of models like ``a``."""
    context = a.task.context(a.config)
    size = a.task.default_batch_size(a.config, context)
    per_batch = size * (context or 1)
    n = max(1, -(-STATISTICS_EXAMPLES // per_batch) if context is None else 4)
    return fixed_batches(data, "train", batch_size=size, context=context, max_batches=n)


def interpolate(a: StateDict, b: StateDict, alpha: float) -> StateDict:
    """alpha·a + (1 − alpha)·b (alpha = 1 is a)."""
    return {k: torch.lerp(b[k], a[k], alpha) for k in a}


def merge(
    model_a: ModelLike,
    model_b: ModelLike,
    *,
    alpha: float = 0.5,
    align_method: str = "weight",
    correction: str = "none",
    **align_options,
) -> tuple[CanonicalModel, Alignment | None]:
    """The model alpha·A + (1 − alpha)·π(B), and the alignment (None without one).

    ``align_method`` (see :data:`MERGE_METHODS`): ``"none"``, the paper's vanilla average of
    the stock weights as loaded (Hugging Face folders or LoadedModels only; the model returned
    is its exact canonical form, :meth:`StockPair.state_at` gives the stock state dict);
    ``"canonical"``, averaging in canonical coordinates (after the exact RMSNorm rewrite), no
    alignment; ``"weight"``, ``"activation"`` or ``"learned"`` (the last two with
    ``data=``), see :func:`align`.

    ``correction`` (``data=`` too; see :mod:`glmc.correction`): ``"reset"`` recomputes every
    BatchNorm's statistics on the merged model, ``"repair"`` rescales every unit to the
    interpolated endpoints' statistics (REPAIR); ``"none"`` keeps the interpolated ones.
    """
    data = None
    if correction != "none":  # (the data are checked before any matching)
        model_a, model_b = (load_model(m) if isinstance(m, (str, Path)) else m
                            for m in (model_a, model_b))
        data = correction_data(model_a, model_b, correction, align_options.get("data"),
                               align_options.get("tokenizer"), align_options.get("data_seed"))
        align_options = {**align_options, "data": data}
    merged, al = _merge(model_a, model_b, alpha, align_method, **align_options)
    if data is None:
        return merged, al
    a, b = (al.a, al.aligned) if al is not None else prepare_pair(
        model_a, model_b, align_options.get("heads", "inner"))
    return correct(merged, a, b, alpha, statistics_batches(a, data), correction), al


def correction_data(model_a: ModelLike, model_b: ModelLike, how: str,
                    data: str | Path | Dataset | None, tokenizer: str | Tokenizer | None = None,
                    data_seed: int | None = None) -> Dataset:
    """The training data a correction ``how`` of the pair's merge reads, after checking that
    the correction applies to the pair (see :func:`glmc.correction.check_correction`)."""
    a = canonical(model_a)
    check_correction(a, how, name_of(model_a, "A"))
    ds, _ = learning_data(a, data, tokenizer, name_of(model_a, "A"), models=(model_a, model_b),
                          data_seed=data_seed, method=how)
    return ds


def _merge(model_a: ModelLike, model_b: ModelLike, alpha: float, align_method: str,
           **align_options) -> tuple[CanonicalModel, Alignment | None]:
    if not 0.0 <= alpha <= 1.0:
        raise GlmcError(f"alpha must lie in [0, 1], got {alpha}")
    if align_method not in MERGE_METHODS:
        raise GlmcError(f"unknown alignment method {align_method!r} (available: "
                        f"{', '.join(MERGE_METHODS)})")
    if align_method == "none" and align_options.get("heads", "inner") != "inner":
        raise GlmcError("heads='circuit' does not apply to align_method='none' (the stock "
                        "weights are averaged as loaded); use align_method='canonical'")
    if align_method == "none":
        model_a, model_b = (load_model(m) if isinstance(m, (str, Path)) else m
                            for m in (model_a, model_b))
        a, _ = prepare_pair(model_a, model_b)  # (the checks, and the shared tokenizer)
        if not a.family.canonical_is_stock:
            return stock_pair(model_a, model_b).model_at(alpha).with_files(a.files), None
    if align_method in ("none", "canonical"):
        a, b = prepare_pair(model_a, model_b, align_options.get("heads", "inner"))
        return a.with_state(interpolate(a.state, b.state, alpha)), None
    al = align(model_a, model_b, method=align_method, **align_options)
    return al.a.with_state(interpolate(al.a.state, al.aligned.state, alpha)), al


def save(model: ModelLike, path: str | Path, *, force: bool = False, stock: bool = True,
         report: dict | None = None, transform: Transform | None = None) -> dict:
    """Write a model folder as the command line does, and return its report.

    ``model``: a merged or aligned model (CanonicalModel) or a loaded one. The folder holds
    the stock class when the model is representable (else a glmc folder, which every glmc
    command reads), the tokenizer and generation config the model carries, ``transform``
    when given, and ``glmc_report.json`` (``report`` plus the format written). An existing
    non-empty ``path`` is replaced only with ``force``; the location is checked (writable,
    free space) before anything is written, and the write is atomic.
    """
    m = canonical(model).to(torch.float32)
    check_output(path, model_bytes(m.n_params()), force=force, option="path",
                 force_flag="force=True")
    report = dict(report or {})
    report["format"] = save_folder(path, m, stock=stock, report=report, transform=transform)
    return report


def write_report(folder: str | Path, report: dict) -> None:
    """Replace ``folder``'s ``glmc_report.json`` (atomically)."""
    with output_errors(folder):
        write_json(Path(folder) / REPORT, report)
