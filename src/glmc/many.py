"""N models on one dataset: the merged model beside the models it came from, and what a joint
frame costs each pair (``glmc barrier M1 ... Mn``).

:func:`many_barrier` brings the models into one frame (:func:`glmc.api.merge_many`), then
evaluates on the same fixed batches: every model alone and the mean of their losses; the
merged model with uniform weights and, when given, with ``weights``; and every pair's barrier
on the line between the two in the joint frame, beside the barrier after aligning that pair
on its own (the pair aligned by the same method: weight matching, or weight then learned
matching): the ratio says what consistency across the set costs the pair.

``vanilla`` (method ``none``) adds the paper's vanilla rows beside them: the models' weights
averaged as loaded (the stock weights of Hugging Face folders), uniform and with
``weights``, and every pair's barrier on the line between the two as loaded; method
``none`` alone measures those rows only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from glmc.api import merge_many
from glmc.barrier import barrier, barrier_se, batch_barriers, lambda_grid, reported_se
from glmc.data import Dataset, Tokenizer, fixed_batches
from glmc.errors import GlmcError
from glmc.evaluate import (
    EvalResult,
    Evaluator,
    InterpolationPath,
    LinePath,
    check_data_fits,
    default_batch_size,
    load_pair_data,
    split_warnings,
)
from glmc.io.folders import canonical, load_model, name_of
from glmc.matching.many import weighted_mean
from glmc.matching.options import simplex_weights
from glmc.methods import AlignOptions, get_method
from glmc.model import CanonicalModel
from glmc.pair import stock_average, stock_set
from glmc.verify import same_interface


def _result(r: EvalResult) -> dict[str, Any]:
    return {"loss": r.loss, "accuracy": r.accuracy}


@dataclass
class ManyReport:
    """What :func:`many_barrier` measured (see the module's docstring); JSON via
    :meth:`to_json`. ``merged``, ``merged_weighted`` and ``frame`` are the aligned merge's
    (None for method ``none`` alone), ``vanilla`` the vanilla merge's rows (None without);
    each pair carries the keys of what was measured (``barrier_joint``..., and
    ``barrier_vanilla``...)."""

    models: list[str]
    data: str
    split: str
    count: int
    targets: str
    endpoints: list[dict[str, Any]]
    merged: dict[str, Any] | None
    merged_weighted: dict[str, Any] | None
    weights: list[float] | None
    pairs: list[dict[str, Any]]
    frame: dict[str, Any] | None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    vanilla: dict[str, Any] | None = None

    @property
    def mean_loss(self) -> float:
        return sum(e["loss"] for e in self.endpoints) / len(self.endpoints)

    def to_json(self) -> dict[str, Any]:
        return {"models": self.models, "data": self.data, "split": self.split,
                "eval_count": self.count, "eval_targets": self.targets,
                "endpoints": self.endpoints, "endpoints_mean_loss": self.mean_loss,
                "merged": self.merged, "merged_weighted": self.merged_weighted,
                "vanilla": self.vanilla, "weights": self.weights, "pairs": self.pairs,
                "frame": self.frame, "seconds": round(self.seconds, 3),
                "warnings": self.warnings}


def _costs(lambdas: list[float], joint: list[EvalResult], alone: list[EvalResult]
           ) -> dict[str, Any]:
    """A pair's barrier in the joint frame and aligned alone, the excess and the ratio, each
    with its standard error over the evaluation batches (paired: both lines are evaluated on
    the same batches, so the batches' own difficulty cancels in the excess and the ratio)."""
    vj, w = batch_barriers(lambdas, joint)
    vp, _ = batch_barriers(lambdas, alone)
    b_joint = barrier(lambdas, [r.loss for r in joint])
    b_pair = barrier(lambdas, [r.loss for r in alone])
    ratio = b_joint / b_pair if b_pair > 0 else None
    return {"barrier_joint": b_joint, "barrier_pairwise": b_pair, "ratio": ratio,
            "barrier_joint_se": reported_se(vj, w), "barrier_pairwise_se": reported_se(vp, w),
            "excess": b_joint - b_pair, "excess_se": reported_se(vj - vp, w),
            # (delta method: the ratio linearised about its value, batch by batch)
            "ratio_se": None if ratio is None else reported_se((vj - ratio * vp) / b_pair, w)}


class _Vanilla:
    """The models' weights as loaded (:class:`~glmc.pair.StockSet` for Hugging Face
    folders, else the canonical weights, which are a family's own): the vanilla average
    and the line between two models."""

    def __init__(self, loaded: list[Any], canon: list[CanonicalModel]) -> None:
        self.canon = canon
        self.stock = None if canon[0].family.canonical_is_stock else stock_set(loaded)

    def average(self, weights: Sequence[float]) -> CanonicalModel:
        if self.stock is not None:
            return self.stock.model_at(weights)
        return self.canon[0].with_state(stock_average([m.state for m in self.canon], weights))

    def line(self, i: int, j: int) -> InterpolationPath:
        """Model i (λ = 1) to model j as loaded."""
        return self.stock.pair(i, j) if self.stock is not None else LinePath(self.canon[i],
                                                                             self.canon[j])


def many_barrier(models: Sequence[Any], data: str | Path | Dataset, *,
                 weights: Sequence[float] | None = None, frame: str = "mergemany",
                 method: str = "weight", vanilla: bool = False, points: int = 11,
                 split: str = "test", max_batches: int | None = None,
                 batch_size: int | None = None, max_rounds: int = 10,
                 tokenizer: str | Tokenizer | None = None,
                 options: AlignOptions | None = None,
                 alone: AlignOptions | None = None) -> ManyReport:
    """Merge ``models`` (folders, LoadedModels or CanonicalModels; 2 or more) in one frame and
    evaluate the merge and every pair on ``split`` of ``data`` (see the module's docstring).
    ``batch_size``: windows or images per evaluation batch (default: the task's, see
    :func:`glmc.evaluate.default_batch_size`).
    ``alone``: how each pair is aligned alone for comparison (default: as ``options`` align
    the frame; e.g. the library's defaults for the pairs beside a longer joint refinement).
    ``vanilla``, or ``method="none"`` (no frame: those rows alone): the vanilla rows, which
    average Hugging Face folders' stock weights (folders or LoadedModels holding them).

    Raises:
        GlmcError: fewer than two models, models of different interfaces, data that do not
            fit, models without stock weights for the vanilla rows, before any matching."""
    t0 = time.perf_counter()
    if len(models) < 2:
        raise GlmcError(f"give at least two models, got {len(models)}")
    w = simplex_weights(weights, len(models))  # (checked before any matching)
    aligned, vanilla = method != "none", vanilla or method == "none"
    loaded = [load_model(m) if isinstance(m, (str, Path)) else m for m in models]
    names = [name_of(m, f"model {i + 1}") for i, m in enumerate(models)]
    canon = [canonical(m) for m in loaded]
    for name, m in zip(names[1:], canon[1:], strict=True):
        same_interface(canon[0].config, m.config, f"{names[0]} vs {name}")
    as_loaded = _Vanilla(loaded, canon) if vanilla else None
    ds, _ = load_pair_data(data, canon[0].config, loaded, tokenizer=tokenizer)
    ctx = check_data_fits(canon[0].config, ds, split=split, where=names[0])
    batches = fixed_batches(ds, split, context=ctx, max_batches=max_batches,
                            batch_size=batch_size or default_batch_size(canon[0].config, ctx))
    ev = Evaluator(canon[0].config, batches)
    lambdas = lambda_grid(points)
    endpoints = [_result(ev.evaluate(m.state)) for m in canon]
    pairs = [{"pair": [i + 1, j + 1]} for i in range(len(canon))
             for j in range(i + 1, len(canon))]
    rows: dict[str, Any] = {"merged": None, "merged_weighted": None, "frame": None}
    if as_loaded is not None:
        rows["vanilla"] = {"merged": _result(ev.evaluate(as_loaded.average(
            [1.0 / len(canon)] * len(canon)).state)), "merged_weighted": None if weights is
            None else _result(ev.evaluate(as_loaded.average(w).state))}
        for p in pairs:
            i, j = (k - 1 for k in p["pair"])
            line = ev.evaluate_along(as_loaded.line(i, j), lambdas)
            p["barrier_vanilla"] = barrier(lambdas, [r.loss for r in line])
            p["barrier_vanilla_se"] = barrier_se(lambdas, line)
    if aligned:
        rows |= _aligned(canon, ev, lambdas, pairs, w, weights is not None, frame=frame,
                         method=method, max_rounds=max_rounds, options=options, alone=alone,
                         data=ds)
    return ManyReport(names, str(data) if isinstance(data, (str, Path)) else ds.name, split,
                      ev.count, canon[0].task.targets, endpoints, rows["merged"],
                      rows["merged_weighted"], list(weights) if weights is not None else None,
                      pairs, rows["frame"], time.perf_counter() - t0, split_warnings(models),
                      rows.get("vanilla"))


def _aligned(canon: list[CanonicalModel], ev: Evaluator, lambdas: list[float],
             pairs: list[dict[str, Any]], w: list[float], weighted: bool, *, frame: str,
             method: str, max_rounds: int, options: AlignOptions | None,
             alone: AlignOptions | None, data: Dataset) -> dict[str, Any]:
    """The aligned rows: the merge in the joint frame (uniform, and ``w`` when
    ``weighted``), and each of ``pairs`` in the frame beside the pair aligned alone (its
    entries updated); the frame's report."""
    options = options or AlignOptions()
    pair_method = get_method(method)
    if pair_method.data and not isinstance(options.data, Dataset):
        options = replace(options, data=data)  # (learned: the train split of the data read)
    # Each pair alone as the joint frame matches it: no token masks, nothing handed over, no
    # checkpoint of the joint run read or written.
    alone = options if alone is None else replace(alone, data=options.data)
    alone_options = replace(alone, token_counts=None, hand_over=False,
                            learned=replace(alone.learned_matching(), checkpoint=None,
                                            resume=False))
    joint = merge_many(canon, frame=frame, method=method, max_rounds=max_rounds,
                       options=options)
    moved = joint.frame.moved(canon)
    out: dict[str, Any] = {"merged": _result(ev.evaluate(joint.model.state)),
                           "merged_weighted": None}
    if weighted:
        out["merged_weighted"] = _result(ev.evaluate(weighted_mean([m.state for m in moved],
                                                                   w)))
    for p in pairs:
        i, j = (k - 1 for k in p["pair"])
        in_frame = ev.evaluate_along(LinePath(moved[i], moved[j]), lambdas)
        own = pair_method(canon[i], canon[j], alone_options).aligned
        by_itself = ev.evaluate_along(LinePath(canon[i], own), lambdas)
        p |= _costs(lambdas, in_frame, by_itself)
    out["frame"] = joint.frame.to_json() | {
        "cycle_error_pairwise": joint.settings["cycle_error_pairwise"],
        "learned": joint.settings.get("learned")}
    return out
