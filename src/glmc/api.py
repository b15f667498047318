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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from glmc.correction import check_correction, correct, statistics_note
from glmc.data import TOKENIZER_FILE, Dataset, Tokenizer
from glmc.defaults import ALIGN_METHODS
from glmc.errors import GlmcError
from glmc.evaluate import check_data_fits, load_pair_data
from glmc.families import FAMILIES
from glmc.families.importers import Importer
from glmc.io.atomic import atomic_path
from glmc.io.folders import (
    REPORT,
    LoadedModel,
    load_model,
    read_state_file,
    save_folder,
    write_json,
)
from glmc.io.outputs import check_output, model_bytes, output_errors
from glmc.matching.weight import check_pair
from glmc.methods import Alignment, AlignOptions, get_method, statistics_batches
from glmc.model import CanonicalModel
from glmc.symmetry.transform import StateDict, Transform
from glmc.verify import canonical_logits, certify_folder, folder_logits, random_inputs

ModelLike = CanonicalModel | LoadedModel | str | Path

METHODS = ALIGN_METHODS  # (the registry: glmc.methods.METHODS)


def load(path: str | Path, *, allow_pickle: bool = False) -> LoadedModel:
    """Read a model folder (Hugging Face or glmc) into canonical form."""
    return load_model(path, allow_pickle=allow_pickle)


def read_state_dict(path: str | Path, *, arch: str | None = None, norm: str | None = None,
                    image_size: int | None = None, num_channels: int | None = None,
                    allow_pickle: bool = False) -> CanonicalModel:
    """A plain state dict file (``.safetensors``, or a PyTorch checkpoint with
    ``allow_pickle``) read by its tensor names into canonical form, as ``glmc import`` does.

    The family whose layouts name ``arch`` reads it (None: from the names); e.g. a
    torchvision-style CIFAR ResNet-20: ``read_state_dict("r20.pt", image_size=32,
    allow_pickle=True)``. Write it with :func:`save`.
    """
    readers = [f for f in FAMILIES.values()
               if f.state_dict_archs and (arch is None or arch in f.state_dict_archs)]
    if not readers:
        known = ", ".join(a for f in FAMILIES.values() for a in f.state_dict_archs)
        raise GlmcError(f"{path}: no family reads plain state dicts of arch {arch!r} "
                        f"(known: {known}); other models are read from model folders")
    if len(readers) > 1:
        raise GlmcError(f"{path}: say which arch the state dict holds")
    state = read_state_file(path, allow_pickle)
    return readers[0].read_state_dict(state, str(path), arch=arch, norm=norm,
                                      image_size=image_size, num_channels=num_channels)


def export_state_dict(model: ModelLike, path: str | Path, *, layout: str = "torchvision",
                      force: bool = False) -> dict:
    """Write ``model``'s tensors as one ``.safetensors`` state dict under ``layout``'s names
    (``"canonical"``: glmc's own; ``"torchvision"`` for convnets: what a torchvision-style
    module loads), as ``glmc export`` does; atomically, refusing an existing file unless
    ``force``. Returns what was written (layout, tensors, parameters)."""
    m = canonical(model).to(torch.float32)
    if Path(path).suffix != ".safetensors":
        raise GlmcError(f"{path}: the state dict is written as safetensors (name it "
                        "*.safetensors; torch.load users: safetensors.torch.load_file)")
    state = m.state if layout == "canonical" else m.family.export_state_dict(m, layout)
    check_output(path, model_bytes(m.n_params()), force=force, option="path",
                 force_flag="force=True")
    with output_errors(path), atomic_path(Path(path)) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp),
                  metadata={"format": "pt"})
    return {"path": str(path), "layout": layout, "tensors": len(state),
            "n_params": m.n_params()}


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


def align(model_a: ModelLike, model_b: ModelLike, *, method: str = "weight",
          options: AlignOptions | None = None, **overrides: Any) -> Alignment:
    """Align B to A modulo the symmetries of their spec with the registered ``method``.

    ``options`` (:class:`glmc.methods.AlignOptions`) and keyword ``overrides`` of its fields
    (``residual``, ``heads``, ``max_iter``, ``data``, ``learned``, ...) say how. Methods that
    read data (``activation``, ``learned``) take ``data`` (a dataset name or path, as
    ``--data`` takes, or a glmc.data dataset; text is encoded with the models' tokenizer or
    ``tokenizer``); an image dataset is split as the models were trained (their
    ``glmc_train.json``; ``data_seed`` only for models without one, see
    :func:`glmc.evaluate.split_seed`).

    Example::

        al = glmc.align("runs/a", "runs/b", residual="permutation", max_iter=50)
        al = glmc.align("runs/a", "runs/b", method="learned", data="shakespeare")
    """
    m = get_method(method)
    if not m.transform:
        raise GlmcError(f"method {method} does not align (it averages as loaded): use merge "
                        "or the barrier for it")
    opts = replace(options or AlignOptions(), **overrides)
    a, b = prepare_pair(model_a, model_b, opts.heads)
    settings = {"a": name_of(model_a, "A"), "b": name_of(model_b, "B"), "method": method,
                "residual": m.residual or opts.residual, "heads": opts.heads}
    if m.data:  # (the data are checked before any matching)
        data, seed = learning_data(a, opts.data, opts.tokenizer, settings["a"],
                                   models=(model_a, model_b), data_seed=opts.data_seed,
                                   method=method)
        opts = replace(opts, data=data)
        if seed is not None:
            settings["data_seed"] = seed
    return replace(m(a, b, opts), settings=settings)


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


def interpolate(a: StateDict, b: StateDict, alpha: float) -> StateDict:
    """alpha·a + (1 − alpha)·b (alpha = 1 is a)."""
    return {k: torch.lerp(b[k], a[k], alpha) for k in a}


@dataclass
class Merge:
    """What :func:`merge_pair` made: the merged model, the alignment (None without one),
    and, for ``none`` on Hugging Face folders, the stock config and averaged stock state
    dict (written as is: the vanilla average in its own class)."""

    model: CanonicalModel
    alignment: Alignment | None
    stock_state: tuple[Any, StateDict] | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path, *, force: bool = False, stock: bool = True,
             report: dict | None = None, started: float | None = None) -> dict:
        """Write the merged model as ``glmc merge`` does (the stock average as is for
        ``none`` on Hugging Face folders), with π when aligned and the report (this merge's,
        updated by ``report``; ``seconds`` since ``started``, a ``time.perf_counter()``, when
        given); returns it."""
        transform = self.alignment.transform if self.alignment is not None else None
        report = self.report() | (report or {})
        if started is not None:
            report["seconds"] = round(time.perf_counter() - started, 3)
        return save(self.model, path, force=force, stock=stock, transform=transform,
                    report=report, stock_state=self.stock_state)

    def report(self) -> dict[str, Any]:
        al = self.alignment
        out = {"command": "merge", **self.settings}
        if al is not None:
            out |= {"residual": al.settings.get("residual"), "heads": al.settings.get("heads"),
                    "matching": al.match.to_json() if al.match else None,
                    "learned": al.learned.to_json() if al.learned else None}
        note = statistics_note(self.model, self.settings.get("correction", "none"))
        if note is not None:
            out["statistics"] = note
        return out


def merge_pair(model_a: ModelLike, model_b: ModelLike, *, alpha: float = 0.5,
               align_method: str = "weight", options: AlignOptions | None = None,
               **overrides: Any) -> Merge:
    """The model alpha·A + (1 − alpha)·π(B) (see :func:`merge`), with everything a report
    needs; what ``glmc merge`` writes."""
    opts = replace(options or AlignOptions(), **overrides)
    m = get_method(align_method)
    if not 0.0 <= alpha <= 1.0:
        raise GlmcError(f"alpha must lie in [0, 1], got {alpha}")
    if m.stock and opts.heads != "inner":
        raise GlmcError(f"heads='circuit' does not apply to align method {m.name} (the stock "
                        "weights are averaged as loaded); use canonical")
    settings = {"a": name_of(model_a, "A"), "b": name_of(model_b, "B"), "alpha": alpha,
                "align": align_method, "correction": opts.correction}
    model_a, model_b = (load_model(x) if isinstance(x, (str, Path)) else x
                        for x in (model_a, model_b))
    if opts.correction != "none":  # (the data are checked before any matching)
        opts = replace(opts, data=correction_data(model_a, model_b, opts.correction, opts.data,
                                                  opts.tokenizer, opts.data_seed))
    al = stock_state = None
    if m.transform:
        al = align(model_a, model_b, method=align_method, options=opts)
        a, b = al.a, al.aligned
    else:
        a, b = prepare_pair(model_a, model_b, opts.heads)
    if m.stock and not a.family.canonical_is_stock:
        pair = stock_pair(model_a, model_b)
        stock_state = (pair.hf_config, pair.state_at(alpha))
        merged = pair.model_at(alpha).with_files(a.files)
    else:
        merged = a.with_state(interpolate(a.state, b.state, alpha))
    if opts.correction != "none":
        batches = statistics_batches(a, opts.data)
        merged, stock_state = correct(merged, a, b, alpha, batches, opts.correction), None
    return Merge(merged, al, stock_state, settings)


def merge(model_a: ModelLike, model_b: ModelLike, *, alpha: float = 0.5,
          align_method: str = "weight", correction: str = "none",
          **overrides: Any) -> tuple[CanonicalModel, Alignment | None]:
    """The model alpha·A + (1 − alpha)·π(B), and the alignment (None without one).

    ``align_method`` (a registered method, see :mod:`glmc.methods`): ``"none"``, the paper's
    vanilla average of the stock weights as loaded (Hugging Face folders or LoadedModels
    only; the model returned is its exact canonical form); ``"canonical"``, averaging in
    canonical coordinates, no alignment; or a method that aligns (``"weight"``,
    ``"activation"``, ``"learned"``, ...; the last two with ``data=``), see :func:`align`.

    ``correction`` (``data=`` too; see :mod:`glmc.correction`): ``"reset"`` recomputes every
    BatchNorm's statistics on the merged model, ``"repair"`` rescales every unit to the
    interpolated endpoints' statistics (REPAIR); ``"none"`` keeps the interpolated ones.
    """
    out = merge_pair(model_a, model_b, alpha=alpha, align_method=align_method,
                     correction=correction, **overrides)
    return out.model, out.alignment


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


def save_alignment(al: Alignment, path: str | Path, *, force: bool = False,
                   stock: bool = True) -> dict:
    """Write B aligned as ``glmc align`` does: the model folder (stock class when
    representable) with B's tokenizer and generation config, ``transform.safetensors``, and
    ``glmc_report.json`` with the certificate that the folder computes B's function. An
    existing non-empty ``path`` needs ``force``. Returns the report."""
    x = random_inputs(al.b.config)
    return save_certified(al.aligned, path, al.report(), (x, canonical_logits(al.b)(x)),
                          transform=al.transform, force=force, stock=stock)


def save_certified(model: CanonicalModel, path: str | Path, report: dict,
                   reference: tuple[torch.Tensor, torch.Tensor], *,
                   transform: Transform | None = None, force: bool = False,
                   stock: bool = True) -> dict:
    """Write ``model`` (see :func:`save`) with ``report`` plus the certificate that the folder
    as written computes ``reference`` = (inputs, the logits it must give), taken before the
    folder takes its name; returns the report. An aligned B must give B's logits, a canonical
    form its input's."""
    return save(model, path, force=force, stock=stock, report=report, transform=transform,
                certify=lambda folder: certify_folder(folder, *reference))


def certify_saved(path: str | Path, report: dict, reference: tuple[torch.Tensor, torch.Tensor],
                  started: float | None = None) -> dict:
    """Certify a folder :func:`save` wrote (see :func:`save_certified`) and rewrite its report
    with the certificate (and the ``seconds`` since ``started``, a ``time.perf_counter()``):
    for a caller that releases the model between the two, as ``glmc align`` does, so that the
    model and its read-back copy are never in memory together."""
    report = report | {"certificate": certify_folder(path, *reference)}
    if started is not None:
        report["seconds"] = round(time.perf_counter() - started, 3)
    write_report(path, report)
    return report


def save_canonical(model: LoadedModel | str | Path, path: str | Path, *,
                   attention: str = "heads", stock: bool = False, force: bool = False) -> dict:
    """Write a model folder's canonical form as ``glmc canonicalize`` does (``attention``:
    ``"heads"``, or ``"circuit"`` for heads as QK/OV circuits; ``stock``: the stock class
    when representable), with the certificate that the written folder computes the input
    folder's function in its own class; returns the report."""
    if attention not in ("heads", "circuit"):
        raise GlmcError(f"attention must be 'heads' or 'circuit', got {attention!r}")
    m = model if isinstance(model, LoadedModel) else load_model(model)
    canon = m.canonical if attention == "heads" else m.canonical.family.circuit_form(m.canonical)
    x = random_inputs(canon.config)
    report = {"command": "canonicalize", "model": str(m.path), "out": str(path),
              "n_params": canon.n_params()}
    return save_certified(canon, path, report, (x, folder_logits(m)(x)), force=force,
                          stock=stock)


def save(model: ModelLike, path: str | Path, *, force: bool = False, stock: bool = True,
         report: dict | None = None, transform: Transform | None = None,
         stock_state: tuple[Any, StateDict] | None = None,
         certify: Callable[[Path], dict] | None = None) -> dict:
    """Write a model folder as the command line does, and return its report.

    ``model``: a merged or aligned model (CanonicalModel) or a loaded one. The folder holds
    the stock class when the model is representable (else a glmc folder, which every glmc
    command reads), the tokenizer and generation config the model carries, ``transform``
    when given, and ``glmc_report.json`` (``report`` plus the format written, and with
    ``certify``, its certificate of the folder as written: see :func:`save_certified`). An existing
    non-empty ``path`` is replaced only with ``force``; the location is checked (writable,
    free space) before anything is written, and the write is atomic.
    """
    m = canonical(model).to(torch.float32)
    check_output(path, model_bytes(m.n_params()), force=force, option="path",
                 force_flag="force=True")
    report = dict(report or {})
    return save_folder(path, m, stock=stock, report=report, transform=transform,
                       stock_state=stock_state, certify=certify)


def write_report(folder: str | Path, report: dict) -> None:
    """Replace ``folder``'s ``glmc_report.json`` (atomically)."""
    with output_errors(folder):
        write_json(Path(folder) / REPORT, report)
