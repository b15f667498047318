"""The Python API: load, align, merge and save models in a notebook (what the commands call).

>>> import glmc
>>> a, b = glmc.load("runs/gpt-a"), glmc.load("runs/gpt-b")
>>> result = glmc.align(a, b)                      # weight matching, orthogonal residual
>>> merged, alignment = glmc.merge(a, b, alpha=0.5, method="weight")
>>> vanilla, _ = glmc.merge("runs/gpt-a", "runs/gpt-b", method="none")  # stock average
>>> result.save("runs/b-aligned")                  # what `glmc align ... -o` writes
>>> glmc.save(merged, "runs/merged")               # what `glmc merge ... -o` writes

This module is the facade: the work is done below it (:mod:`glmc.pair`, :mod:`glmc.methods`,
:mod:`glmc.writing`, :mod:`glmc.io`), whose public names it re-exports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from glmc.correction import check_correction, correct, correct_many, statistics_note
from glmc.data import Dataset, Tokenizer
from glmc.errors import GlmcError
from glmc.evaluate import check_data_fits, load_pair_data, split_warnings
from glmc.families import FAMILIES
from glmc.io.folders import (
    LoadedModel,
    ModelLike,
    canonical,
    load_model,
    name_of,
    read_state_file,
)
from glmc.io.token_counts import read_token_counts
from glmc.matching.frames import find_frame
from glmc.matching.learned import learned_many
from glmc.matching.many import Frame, cycle_error, weighted_mean
from glmc.matching.options import FRAMES, MANY_METHODS, simplex_weights
from glmc.matching.weight import centred_pair, weight_matching
from glmc.methods import Alignment, AlignOptions, get_method, statistics_batches
from glmc.model import CanonicalModel
from glmc.pair import (
    StockPair,
    StockSet,
    prepare_pair,
    shared_tokenizer,
    stock_average,
    stock_pair,
    stock_set,
)
from glmc.symmetry.transform import Transform
from glmc.tensors import StateDict, interpolate
from glmc.writing import (
    certify_saved,
    export_state_dict,
    save,
    save_alignment,
    save_canonical,
    save_certified,
    write_report,
)

__all__ = ["Alignment", "AlignOptions", "ManyMerge", "Merge", "ModelLike", "StockPair", "align",
           "canonical", "certify_saved", "correction_data", "export_state_dict", "interpolate",
           "learning_data", "load", "merge", "merge_many", "merge_pair", "name_of",
           "prepare_pair",
           "read_state_dict", "read_token_counts", "save", "save_alignment", "save_canonical",
           "save_certified", "shared_tokenizer", "StockSet", "stock_pair", "stock_set",
           "write_report"]


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


def align(model_a: ModelLike, model_b: ModelLike, *, method: str = "weight",
          options: AlignOptions | None = None, **overrides: Any) -> Alignment:
    """Align B to A modulo the symmetries of their spec with the registered ``method``.

    ``options`` (:class:`glmc.methods.AlignOptions`) and keyword ``overrides`` of its fields
    (``residual``, ``heads``, ``max_iter``, ``data``, ``learned``, ``device``, ...) say how.
    Methods that read data (``activation``, ``learned``) take ``data`` (a dataset name or
    path, as ``--data`` takes, or a glmc.data dataset; text is encoded with the models'
    tokenizer or ``tokenizer``); an image dataset is split as the models were trained (their
    ``glmc_train.json``; ``data_seed`` only for models without one, see
    :func:`glmc.evaluate.split_seed`).

    Example::

        al = glmc.align("runs/a", "runs/b", residual="permutation", max_iter=50)
        al = glmc.align("runs/a", "runs/b", method="learned", data="shakespeare")
        al = glmc.align("runs/a", "runs/b", device="cuda")  # the transform back on the CPU
    """
    m = get_method(method)
    if not m.transform:
        raise GlmcError(f"method {method} does not align (it averages as loaded): use merge "
                        "or the barrier for it")
    opts = (options or AlignOptions()).updated(**overrides)
    a, b = prepare_pair(model_a, model_b, opts.heads)
    settings = {"a": name_of(model_a, "A"), "b": name_of(model_b, "B"), "method": method,
                "residual": m.residual or opts.residual, "heads": opts.heads}
    if m.data or (m.uses_data and opts.data is not None and not isinstance(opts.data, Dataset)):
        # (the data are checked before any matching)
        data, seed = learning_data(a, opts.data, opts.tokenizer, settings["a"],
                                   models=(model_a, model_b), data_seed=opts.data_seed,
                                   method=method)
        opts = replace(opts, data=data)
        if seed is not None:
            settings["data_seed"] = seed
        settings |= _warnings(split_warnings((model_a, model_b)))
    return replace(m(a, b, opts), settings=settings)


def _warnings(warnings: list[str]) -> dict[str, list[str]]:
    """``{"warnings": warnings}`` for a report, or nothing when there are none."""
    return {"warnings": warnings} if warnings else {}


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
        return save(self.model, path, force=force, stock=stock, transform=transform,
                    report=self.report() | (report or {}), stock_state=self.stock_state,
                    started=started)

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
               method: str = "weight", options: AlignOptions | None = None,
               **overrides: Any) -> Merge:
    """The model alpha·A + (1 − alpha)·π(B) (see :func:`merge`), with everything a report
    needs; what ``glmc merge`` writes."""
    opts = (options or AlignOptions()).updated(**overrides)
    m = get_method(method)
    if not 0.0 <= alpha <= 1.0:
        raise GlmcError(f"alpha must lie in [0, 1], got {alpha}")
    if m.stock and opts.heads != "inner":
        raise GlmcError(f"heads='circuit' does not apply to align method {m.name} (the stock "
                        "weights are averaged as loaded); use canonical")
    settings = {"a": name_of(model_a, "A"), "b": name_of(model_b, "B"), "alpha": alpha,
                "align": method, "correction": opts.correction}
    model_a, model_b = (load_model(x) if isinstance(x, (str, Path)) else x
                        for x in (model_a, model_b))
    if opts.correction != "none":  # (the data are checked before any matching)
        opts = replace(opts, data=correction_data(model_a, model_b, opts.correction, opts.data,
                                                  opts.tokenizer, opts.data_seed))
    if m.data or opts.correction != "none":
        settings |= _warnings(split_warnings((model_a, model_b)))
    al = stock_state = None
    if m.transform:
        al = align(model_a, model_b, method=method, options=opts)
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
          method: str = "weight", correction: str = "none",
          **overrides: Any) -> tuple[CanonicalModel, Alignment | None]:
    """The model alpha·A + (1 − alpha)·π(B), and the alignment (None without one).

    ``method`` (a registered method, see :mod:`glmc.methods`): ``"none"``, the paper's
    vanilla average of the stock weights as loaded (Hugging Face folders or LoadedModels
    only; the model returned is its exact canonical form); ``"canonical"``, averaging in
    canonical coordinates, no alignment; or a method that aligns (``"weight"``,
    ``"activation"``, ``"learned"``, ...; the last two with ``data=``), see :func:`align`.

    ``correction`` (``data=`` too; see :mod:`glmc.correction`): ``"reset"`` recomputes every
    BatchNorm's statistics on the merged model, ``"repair"`` rescales every unit to the
    interpolated endpoints' statistics (REPAIR); ``"none"`` keeps the interpolated ones.
    """
    out = merge_pair(model_a, model_b, alpha=alpha, method=method, correction=correction,
                     **overrides)
    return out.model, out.alignment


@dataclass
class ManyMerge:
    """What :func:`merge_many` made: the merged model Σ w_i·T_i(θ_i), in the first model's
    coordinates, the frame (one transform per model) and, for the report, the cycle-
    consistency error of pairwise weight matching against the frame."""

    model: CanonicalModel
    frame: Frame
    settings: dict[str, Any] = field(default_factory=dict)
    #: ``none`` on Hugging Face folders: the stock config and the averaged stock state dict
    #: (written as is: the vanilla average in its own class).
    stock_state: tuple[Any, StateDict] | None = None

    def save(self, path: str | Path, *, force: bool = False, stock: bool = True,
             report: dict | None = None, started: float | None = None) -> dict:
        """Write the merged model as ``glmc merge M1 ... Mn`` does, with the report."""
        return save(self.model, path, force=force, stock=stock,
                    report={"command": "merge", **self.settings,
                            "frame": self.frame.to_json()} | (report or {}),
                    stock_state=self.stock_state, started=started)


def merge_many(models: Sequence[ModelLike], *, weights: Sequence[float] | None = None,
               frame: str = "mergemany", method: str = "weight", max_rounds: int = 10,
               options: AlignOptions | None = None, **overrides: Any) -> ManyMerge:
    """N models brought into one frame (the first model's coordinates) by weight matching and
    averaged with ``weights`` (uniform by default; they must be >= 0 and sum to 1).

    ``frame``: ``"mergemany"`` (each model in turn aligned to the mean of the others, from
    the star alignment), ``"star"`` (each aligned to the first) or ``"universe"`` (every
    model's map found at once by Frank-Wolfe, from the star; see
    :mod:`glmc.matching.universe`). ``method``: ``"none"``, no frame: the paper's vanilla
    average of the stock weights as loaded (Hugging Face folders or LoadedModels; with two
    models :func:`merge_pair`'s, bit for bit), ``"weight"`` or ``"weight-perm"`` (the residual
    stream permuted), or ``"learned"`` /
    ``"learned-perm"`` (with ``data=``): the frame refined by learned matching over the
    simplex, λ ~ Dirichlet(α) at each step (``dirichlet_alpha=``, default 3). With two
    models, ``star`` and a weight method are :func:`merge` with that method.
    ``correction="reset"`` or ``"repair"`` (with ``data=``) corrects the merged model's
    statistics: its own BatchNorm statistics, or REPAIR toward the weighted models' (see
    :mod:`glmc.correction`).

    Example::

        out = glmc.merge_many(["runs/a", "runs/b", "runs/c"])
        out.save("runs/merged")
    """
    if frame not in FRAMES:
        raise GlmcError(f"unknown frame {frame!r} ({', '.join(FRAMES)})")
    m = get_method(method)
    if method not in MANY_METHODS:
        raise GlmcError(f"merging {len(models)} models averages them as loaded (none) or "
                        "aligns them by weight matching, then optionally learned matching "
                        f"({', '.join(MANY_METHODS)}), not {method}")
    n = len(models)
    if n < 2:
        raise GlmcError(f"merging needs at least 2 models, got {n}")
    w = simplex_weights(weights, n)
    opts = (options or AlignOptions()).updated(**overrides)
    if m.residual is not None:
        opts = replace(opts, residual=m.residual)
    names = [name_of(x, f"model {i + 1}") for i, x in enumerate(models)]
    models = [load_model(x) if isinstance(x, (str, Path)) else x for x in models]
    batches = learn = None
    if opts.correction != "none":  # (the data are checked before any matching)
        data = correction_data(models[0], models[1], opts.correction, opts.data,
                               opts.tokenizer, opts.data_seed)
        batches = statistics_batches(canonical(models[0]), data)
    first = canonical(models[0])
    if m.data:
        learn, _ = learning_data(first, opts.data, opts.tokenizer, names[0], models=models,
                                 data_seed=opts.data_seed, method=method)
    if m.stock and opts.heads != "inner":
        raise GlmcError("heads='circuit' does not apply to align method none (the stock "
                        "weights are averaged as loaded); use canonical")
    canon = [prepare_pair(first, x, opts.heads)[1] for x in (first, *models[1:])]
    if m.stock:
        return _vanilla_many(models, canon, w, batches, opts.correction,
                             {"models": names, "weights": w, "align": method,
                              "correction": opts.correction})
    wm = opts.weight_matching()
    found = find_frame(frame, canon, wm, max_rounds=max_rounds, seed=opts.seed or 0)
    learned = None
    if learn is not None:
        learned = learned_many(canon, learn, found.transforms, opts.learned_matching(),
                               fix_ones=[centred_pair(canon[0], x) for x in canon[1:]],
                               progress=opts.learned_progress, inner=wm.inner)
        found = Frame(f"{found.method}+learned", learned.transforms, found.rounds,
                      found.converged)
    moved = found.moved(canon)
    merged = canon[0].with_state(weighted_mean([x.state for x in moved], w))
    if batches is not None:
        merged = correct_many(merged, moved, w, batches, opts.correction)
    # Pairwise weight matching of the models after the first, against the frame's maps.
    pairs = {(i, i + 1): weight_matching(canon[i], canon[i + 1], wm).transform
             for i in range(1, n - 1)}
    settings = {"models": names, "weights": w, "frame_method": frame, "align": method,
                "residual": opts.residual, "heads": opts.heads, "correction": opts.correction,
                "cycle_error_pairwise": cycle_error(canon, pairs, found) if pairs else None}
    if learned is not None:
        settings["learned"] = learned.to_json()
    return ManyMerge(merged, found, settings)


def _vanilla_many(models: Sequence[ModelLike], canon: list[CanonicalModel], w: list[float],
                  batches: Any, correction: str, settings: dict[str, Any]) -> ManyMerge:
    """The paper's vanilla average Σ w_k·θ_k of the weights as loaded, in no frame: the stock
    weights of Hugging Face folders (written as is), a family's own where they are its
    canonical ones (as :func:`merge_pair` averages two); then the correction, if any."""
    stock_state = None
    if canon[0].family.canonical_is_stock:
        merged = canon[0].with_state(stock_average([x.state for x in canon], w))
    else:
        stock = stock_set(models)
        stock_state = (stock.hf_config, stock.state_at(w))
        merged = stock.model_at(w).with_files(canon[0].files)
    if batches is not None:
        merged, stock_state = correct_many(merged, canon, w, batches, correction), None
    frame = Frame("none", [Transform.identity(canon[0].spec) for _ in canon])
    return ManyMerge(merged, frame, settings | {"cycle_error_pairwise": None}, stock_state)


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
