"""Loss and accuracy barriers on the straight line between two models.

With λ weighting model A (λ = 1 is A, λ = 0 is B aligned to A by a method π)::

    θ(λ) = λ·θ_A + (1 − λ)·π(θ_B)
    B_λ  = L(θ(λ)) − (λ·L(θ_A) + (1 − λ)·L(θ_B))
    loss barrier = max over the grid of B_λ

The accuracy barrier is the same with the sign flipped (higher is better): the largest drop of
the accuracy below the straight line between the endpoint accuracies; None for language models.

:func:`barrier` is the pure arithmetic; :func:`run_barrier` aligns B to A with each requested
method (see :data:`METHODS`), evaluates θ(λ) on a grid with one reused module and returns a
:class:`BarrierReport`::

    report = run_barrier("runs/vit-a", "runs/vit-b", "mnist5k", methods=("none", "weight"))
    report.methods["weight"].loss_barrier
    glmc.plots.plot_barriers(report, "barrier.png")

A method returns B aligned (the path is then the straight line in canonical coordinates) or a
path of its own (:class:`~glmc.evaluate.InterpolationPath`): ``none``, the paper's vanilla
baseline, averages the stock weights as loaded, which is not a straight line in canonical
coordinates.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glmc.correction import check_correction, correct, statistics_note
from glmc.data import Dataset, TextDataset, Tokenizer
from glmc.defaults import MAX_POINTS, MIN_EVAL_TARGETS
from glmc.errors import GlmcError
from glmc.evaluate import (
    EvalResult,
    Evaluator,
    InterpolationPath,
    LinePath,
    check_data_fits,
    default_batch_size,
    fixed_batches,
    load_pair_data,
    resolve_device,
    split_warnings,
)
from glmc.io.folders import canonical, load_model
from glmc.methods import (  # (the registry lives in glmc.methods; re-exported here)
    METHODS,
    Alignment,
    AlignOptions,
    Method,
    get_method,
    register_method,
    statistics_batches,
)
from glmc.model import CanonicalModel, check_pair, fitted
from glmc.pair import StockPair, stock_pair
from glmc.tasks import TASKS

# -- the arithmetic -----------------------------------------------------------------------


def barrier_curve(
    lambdas: Sequence[float], values: Sequence[float], higher_is_better: bool = False
) -> np.ndarray:
    """B_λ at every grid point: how much worse ``values`` are than the endpoints' line.

    Args:
        lambdas: the grid, shape (n,), must contain 0 (B) and 1 (A); any order.
        values: the metric at each λ, shape (n,).
        higher_is_better: False for a loss (B_λ = v(λ) − line(λ)); True for an accuracy
            (B_λ = line(λ) − v(λ)).

    Returns:
        float64 array (n,), zero at both endpoints.
    """
    lam = np.asarray(lambdas, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if lam.ndim != 1 or lam.shape != v.shape:
        raise ValueError(f"lambdas {lam.shape} and values {v.shape} must be equal-length 1-D")
    at0, at1 = np.flatnonzero(lam == 0.0), np.flatnonzero(lam == 1.0)
    if at0.size == 0 or at1.size == 0:
        raise ValueError("the grid must contain both endpoints, λ = 0 and λ = 1")
    line = lam * v[at1[0]] + (1.0 - lam) * v[at0[0]]
    return line - v if higher_is_better else v - line


def barrier(
    lambdas: Sequence[float], values: Sequence[float], higher_is_better: bool = False
) -> float:
    """max over the grid of B_λ (see :func:`barrier_curve`); >= 0 since B_0 = B_1 = 0.

    >>> barrier([0, 0.5, 1], [1.0, 3.0, 2.0])          # 3 − (0.5·2 + 0.5·1)
    1.5
    >>> barrier([0, 0.5, 1], [0.9, 0.5, 0.8], higher_is_better=True)  # 0.85 − 0.5
    0.35
    """
    curve = barrier_curve(lambdas, values, higher_is_better)
    if np.isnan(curve).any():
        return math.nan
    return float(curve.max())


def batch_barriers(lambdas: Sequence[float], results: Sequence[EvalResult]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The loss barrier split over the fixed batches: each batch's own B_λ* at the grid
    point λ* where the whole barrier peaks, and its share of the targets.

    Args:
        lambdas: the grid, shape (n,), with 0 and 1.
        results: the evaluation at each λ, with per-batch losses (:class:`EvalResult`).

    Returns:
        (values, weights), float64 arrays (batches,): Σ weights·values is :func:`barrier`
        of the mean losses, weights summing to 1.
    """
    counts = np.asarray(results[0].batch_counts, dtype=np.float64)
    per = np.array([r.batch_losses for r in results], dtype=np.float64) / counts  # (n, batches)
    peak = int(np.argmax(barrier_curve(lambdas, [r.loss for r in results])))
    values = np.array([barrier_curve(lambdas, per[:, k])[peak] for k in range(per.shape[1])])
    return values, counts / counts.sum()


def standard_error(values: np.ndarray, weights: np.ndarray) -> float:
    """Standard error of the weighted mean Σ weights·values (weights summing to 1), the
    batches taken as independent draws (a ratio estimator's: the batches' spread about the
    mean, weighted by their shares); NaN for fewer than two batches.

    >>> round(standard_error(np.array([1.0, 3.0]), np.array([0.5, 0.5])), 6)
    1.0
    """
    k = len(values)
    if k < 2:
        return math.nan
    mean = float(np.dot(weights, values))
    return math.sqrt(k / (k - 1) * float(np.sum(weights**2 * (values - mean) ** 2)))


def reported_se(values: np.ndarray, weights: np.ndarray) -> float | None:
    """:func:`standard_error` as a report gives it: None for one batch (no spread to measure)."""
    se = standard_error(values, weights)
    return None if math.isnan(se) else se


def barrier_se(lambdas: Sequence[float], results: Sequence[EvalResult]) -> float | None:
    """Standard error of the loss barrier of ``results`` (see :func:`batch_barriers`); None
    with one batch."""
    return reported_se(*batch_barriers(lambdas, results))


def lambda_grid(points: int) -> list[float]:
    """``points`` evenly spaced values of λ in [0, 1], both ends included (2 to
    :data:`~glmc.defaults.MAX_POINTS`: each point is one evaluation of the split)."""
    if points < 2:
        raise GlmcError(f"the grid needs at least 2 points (λ = 0 and λ = 1), got {points}")
    if points > MAX_POINTS:
        raise GlmcError(f"the grid takes at most {MAX_POINTS} points (each evaluates the "
                        f"split once), got {points}")
    return [i / (points - 1) for i in range(points)]


# -- corrected paths ---------------------------------------------------------------------


@dataclass
class CorrectedPath:
    """``path`` with a correction of its statistics (:func:`glmc.correction.correct`) at
    every inner point, measured on ``batches``; the endpoints are the models as trained."""

    path: InterpolationPath
    how: str
    batches: list

    def model_at(self, lam: float) -> CanonicalModel:
        m = self.path.model_at(lam)
        if lam in (0.0, 1.0):
            return m
        return correct(m, self.path.model_at(1.0), self.path.model_at(0.0), lam,
                       self.batches, self.how)


# -- the report ---------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass
class MethodResult:
    """The curve of one alignment method.

    Attributes:
        lambdas: the grid, (n,); λ = 1 is A, λ = 0 is B aligned.
        losses: test loss at each λ, (n,).
        accuracies: accuracy at each λ (n,), None for language models.
        loss_barrier, acc_barrier: see :func:`barrier` (acc_barrier None for language models).
        loss_barrier_lambda, acc_barrier_lambda: where the maximum sits.
        align_seconds, eval_seconds: wall time of the alignment and of the evaluations.
        alignment: the :class:`glmc.methods.Alignment` (transform, weight matching's trace,
            learned matching's log) when the method aligned B; None otherwise.
        loss_barrier_se: the loss barrier's standard error over the evaluation batches
            (:func:`barrier_se`); None with one batch.
    """

    name: str
    lambdas: list[float]
    losses: list[float]
    accuracies: list[float] | None
    loss_barrier: float
    acc_barrier: float | None
    loss_barrier_lambda: float
    acc_barrier_lambda: float | None
    align_seconds: float
    eval_seconds: float
    alignment: Alignment | None = None
    loss_barrier_se: float | None = None

    @classmethod
    def of(cls, name: str, lambdas: list[float], losses: list[float],
           accs: list[float] | None, align_seconds: float, eval_seconds: float,
           alignment: Alignment | None = None) -> MethodResult:
        """The result of the curves ``losses`` (and ``accs``) on the grid ``lambdas``."""
        loss_curve = barrier_curve(lambdas, losses)
        acc_curve = barrier_curve(lambdas, accs, higher_is_better=True) if accs else None
        return cls(
            name, lambdas, losses, accs,
            barrier(lambdas, losses), None if accs is None else barrier(lambdas, accs, True),
            lambdas[int(np.nanargmax(loss_curve))] if not np.isnan(loss_curve).all() else 0.0,
            None if acc_curve is None else lambdas[int(np.argmax(acc_curve))],
            align_seconds, eval_seconds, alignment)

    def _at(self, values: list[float] | None, lam: float) -> float | None:
        return None if values is None else values[self.lambdas.index(lam)]

    @property
    def loss_a(self) -> float:
        """Loss at λ = 1 (model A)."""
        return self._at(self.losses, 1.0)  # type: ignore[return-value]

    @property
    def loss_b(self) -> float:
        """Loss at λ = 0 (model B aligned: the same function as B)."""
        return self._at(self.losses, 0.0)  # type: ignore[return-value]

    @property
    def acc_a(self) -> float | None:
        return self._at(self.accuracies, 1.0)

    @property
    def acc_b(self) -> float | None:
        return self._at(self.accuracies, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "loss_barrier": _finite(self.loss_barrier),
            "loss_barrier_se": self.loss_barrier_se,
            "acc_barrier": _finite(self.acc_barrier),
            "lambdas": self.lambdas,
            "losses": [_finite(x) for x in self.losses],
            "accuracies": None if self.accuracies is None else
            [_finite(x) for x in self.accuracies],
            "loss_a": _finite(self.loss_a), "loss_b": _finite(self.loss_b),
            "acc_a": _finite(self.acc_a), "acc_b": _finite(self.acc_b),
            "loss_barrier_lambda": self.loss_barrier_lambda,
            "acc_barrier_lambda": self.acc_barrier_lambda,
            "align_seconds": round(self.align_seconds, 4),
            "eval_seconds": round(self.eval_seconds, 4),
            "matching": None if self.alignment is None or self.alignment.match is None
            else _summary(self.alignment.match.to_json()),
            "learned": None if self.alignment is None or self.alignment.learned is None
            else _summary(self.alignment.learned.to_json()),
        }


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    """A matching report without its per-step log (the barrier report stays small)."""
    return {k: v for k, v in report.items() if k not in ("trace", "log")}


@dataclass
class BarrierReport:
    """Barriers of every method between A and B on one dataset split.

    ``data_seed``: the seed of the image split evaluated (the models' training split seed,
    see :func:`glmc.evaluate.split_seed`); None for text or a dataset passed loaded.
    ``to_json()`` gives ``{"methods": {name: {"loss_barrier", "acc_barrier", "lambdas",
    "losses", "accuracies", ...}}, "a", "b", "data", ...}``.
    """

    a: str
    b: str
    data: str
    split: str
    task: str
    context: int | None
    count: int  # targets per evaluation: tokens, images, masked tokens, sequences
    lambdas: list[float]
    methods: dict[str, MethodResult]
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    label: str | None = None
    data_seed: int | None = None

    @property
    def is_classifier(self) -> bool:
        return TASKS[self.task].classifier

    @property
    def targets(self) -> str:
        """What :attr:`count` counts ("tokens", "images", "masked tokens", "sequences")."""
        return TASKS[self.task].targets

    @property
    def scoring(self) -> str:
        """How the loss was scored, where it needs saying ("" otherwise)."""
        return TASKS[self.task].scoring

    def to_json(self) -> dict[str, Any]:
        return {
            "methods": {k: m.to_json() for k, m in self.methods.items()},
            "a": self.a, "b": self.b, "data": self.data, "split": self.split,
            "data_seed": self.data_seed, "task": self.task, "context": self.context,
            "eval_count": self.count, "eval_targets": self.targets,
            **({"scoring": self.scoring} if self.scoring else {}),
            "points": len(self.lambdas), "seconds": round(self.seconds, 3),
            "warnings": self.warnings,
        }


# -- the run ------------------------------------------------------------------------------

#: progress(method, stage, done, total): stage "align" (done/total 0/1, then 1/1) or "eval"
#: (points evaluated so far / grid size).
ProgressFn = Callable[[str, str, int, int], None]


def _describe(x: Any) -> str:
    from glmc.io.folders import LoadedModel

    if isinstance(x, LoadedModel):
        return str(x.path)
    if isinstance(x, (str, Path)):
        return str(x)
    return getattr(x, "name", None) or type(x).__name__


@dataclass
class _Prepared:
    """What :func:`run_barrier` needs once the inputs are checked."""

    a: CanonicalModel
    b: CanonicalModel
    dataset: Dataset
    context: int | None
    data_seed: int | None
    stock: StockPair | None


def _prepare(a: Any, b: Any, data: str | Path | Dataset, methods: Sequence[str], split: str,
             context: int | None, tokenizer: str | Tokenizer | None,
             data_seed: int | None) -> _Prepared:
    from glmc.verify import same_interface

    if not methods:
        raise GlmcError("give at least one alignment method")
    needs_stock = any([get_method(name).stock for name in methods])  # (each name checked)
    a, b = (load_model(m) if isinstance(m, (str, Path)) else m for m in (a, b))
    ma, mb = canonical(a), canonical(b)
    needs_stock = needs_stock and not ma.family.canonical_is_stock
    where = f"{_describe(a)} vs {_describe(b)}"
    same_interface(ma.config, mb.config, where)
    mb = fitted(ma, mb, where)  # (a narrower B in A's shapes)
    check_pair(ma, mb)
    stock = stock_pair(a, b) if needs_stock else None
    ds, seed = load_pair_data(data, ma.config, (a, b), tokenizer=tokenizer, data_seed=data_seed)
    ctx = check_data_fits(ma.config, ds, split=split, context=context, where=_describe(a))
    return _Prepared(ma, mb, ds, ctx, seed, stock)


def prepare_barrier(
    a: Any,
    b: Any,
    data: str | Path | Dataset,
    *,
    methods: Sequence[str] = ("none", "weight"),
    split: str = "test",
    context: int | None = None,
    tokenizer: str | Tokenizer | None = None,
    data_seed: int | None = None,
) -> tuple[CanonicalModel, CanonicalModel, Dataset, int | None]:
    """All the checks of :func:`run_barrier` that need no long work.

    Loads the models (folders or LoadedModels), checks they share an architecture (and, for
    ``none``, that both hold stock weights), loads the data with the models' tokenizer and
    split seed (see :func:`glmc.evaluate.load_pair_data`) and checks it fits. Returns
    (A, B, dataset, context).
    """
    p = _prepare(a, b, data, methods, split, context, tokenizer, data_seed)
    return p.a, p.b, p.dataset, p.context


def barrier_batches(a: Any, b: Any, data: str | Path | Dataset, *, split: str = "test",
                    max_batches: int | None = None, methods: Sequence[str] = ("weight",)
                    ) -> tuple[CanonicalModel, CanonicalModel, list]:
    """The checked canonical pair and the fixed batches :func:`run_barrier` evaluates by
    default (for studies that evaluate the same pair their own way)."""
    ma, mb, ds, ctx = prepare_barrier(a, b, data, methods=methods, split=split)
    return ma, mb, fixed_batches(ds, split, batch_size=default_batch_size(ma.config, ctx),
                                 context=ctx, max_batches=max_batches)


def run_barrier(
    a: Any,
    b: Any,
    data: str | Path | Dataset,
    *,
    methods: Sequence[str] = ("none", "weight"),
    points: int = 11,
    split: str = "test",
    context: int | None = None,
    batch_size: int | None = None,
    max_batches: int | None = None,
    device: str | torch.device | None = "cpu",
    tokenizer: str | Tokenizer | None = None,
    seed: int = 0,
    data_seed: int | None = None,
    options: AlignOptions | None = None,
    progress: ProgressFn | None = None,
    label: str | None = None,
) -> BarrierReport:
    """Align B to A with each method, evaluate θ(λ) on a grid, and compute the barriers.

    Args:
        a, b: model folders, LoadedModels or CanonicalModels of the same architecture
            (method ``none``, which averages the stock weights, takes Hugging Face folders or
            their LoadedModels only).
        data: a dataset name or path (see :func:`glmc.data.load_dataset`) or a loaded
            dataset. Text is encoded with the tokenizer saved beside the models.
        methods: names from :data:`METHODS`, in order.
        points: grid size, λ evenly spaced in [0, 1].
        split: the evaluated split (held-out ``test`` by default).
        context: text window length (default: the model's n_positions).
        batch_size, max_batches: bound the work (see :func:`glmc.evaluate.fixed_batches`:
            by default images use the whole split, text its first 65,536 tokens).
        device: where to evaluate (``"auto"``: CUDA when available), and to align unless
            ``options.device`` names a device of its own (weight and learned matching: see
            :class:`glmc.methods.AlignOptions`).
        tokenizer: overrides the models' tokenizer for text.
        seed: seed of learned matching (data order and λ draws; unless ``options``).
        data_seed: split seed of an image dataset, for models without a training record
            (``glmc_train.json``, whose seed is used; a different ``data_seed`` is refused).
        options: alignment options shared by the methods.
        progress: progress(method, stage, done, total), see :data:`ProgressFn`.
        label: a name for this pair in plots.

    Returns:
        a :class:`BarrierReport`. Every check on the inputs runs before any alignment or
        evaluation, so bad input fails fast with one GlmcError.
    """
    t0 = time.perf_counter()
    dev = resolve_device(device)  # (before any work)
    methods = list(dict.fromkeys(methods))
    lambdas = lambda_grid(points)
    options = options or AlignOptions(seed=seed)
    prep = _prepare(a, b, data, methods, split, context, tokenizer, data_seed)
    check_correction(prep.a, options.correction, _describe(a))
    options = replace(options, stock=options.stock or prep.stock,
                      data=options.data if isinstance(options.data, Dataset) else prep.dataset,
                      device=dev if options.device is None else options.device)
    if options.heads == "circuit":
        prep.a, prep.b = (m.family.circuit_form(m) for m in (prep.a, prep.b))
    bs = batch_size or default_batch_size(prep.a.config, prep.context)
    batches = fixed_batches(prep.dataset, split, batch_size=bs, context=prep.context,
                            max_batches=max_batches)
    evaluator = Evaluator(prep.a.config, batches, device=dev)
    results = {name: _measure(get_method(name), prep, evaluator, options, lambdas, progress)
               for name in methods}
    warnings = _endpoint_warnings(results) + _evaluation_warnings(lambdas, evaluator.count,
                                                                  prep.a)
    note = statistics_note(prep.a, options.correction)
    warnings += [note] if note is not None else []
    warnings += split_warnings((a, b))
    ds = prep.dataset
    data_name = str(data) if isinstance(data, (str, Path)) else str(ds.name)
    return BarrierReport(
        _describe(a), _describe(b), data_name, split, prep.a.config.task,
        prep.context if isinstance(ds, TextDataset) else None, evaluator.count, lambdas,
        results, time.perf_counter() - t0, warnings, label, prep.data_seed)


def _measure(method: Method, prep: _Prepared, evaluator: Evaluator, options: AlignOptions,
             lambdas: list[float], progress: ProgressFn | None) -> MethodResult:
    """Align with ``method``, evaluate its path on the grid, and compute its barriers."""
    name = method.name

    def report(stage: str, done: int, total: int) -> None:
        if progress is not None:
            progress(name, stage, done, total)

    report("align", 0, 1)
    t1 = time.perf_counter()
    path, alignment = _path(method, prep, options)
    t_align = time.perf_counter() - t1
    report("align", 1, 1)
    t2 = time.perf_counter()
    evals = evaluator.evaluate_along(path, lambdas,
                                     progress=lambda done, total: report("eval", done, total))
    t_eval = time.perf_counter() - t2
    losses = [r.loss for r in evals]
    accs = [float(r.accuracy) for r in evals] if prep.a.task.classifier else None  # type: ignore[arg-type]
    out = MethodResult.of(name, lambdas, losses, accs, t_align, t_eval, alignment)
    out.loss_barrier_se = barrier_se(lambdas, evals)
    return out


def _path(method: Method, prep: _Prepared,
          options: AlignOptions) -> tuple[InterpolationPath, Alignment | None]:
    """The path ``method`` gives between A and B (and its alignment, if it aligned)."""
    wa, wb = prep.a.to(options.dtype), prep.b.to(options.dtype)  # what the methods align
    out = method(wa, wb, options)
    alignment = out if isinstance(out, Alignment) else None
    aligned = out.aligned if alignment is not None else out
    path = LinePath(prep.a, aligned) if isinstance(aligned, CanonicalModel) else aligned
    if options.correction != "none":
        path = CorrectedPath(path, options.correction, statistics_batches(prep.a, prep.dataset))
    return path, alignment


def _evaluation_warnings(lambdas: list[float], count: int, a: CanonicalModel) -> list[str]:
    """A grid of the endpoints alone (its barrier is 0 by construction), and too few evaluated
    targets (:data:`MIN_EVAL_TARGETS`: the barrier is then noise)."""
    out = []
    if len(lambdas) == 2:
        out.append("the λ grid holds only the endpoints (2 points): the barrier is 0 by "
                   "construction; use 3 points or more (11 by default)")
    if count < MIN_EVAL_TARGETS:
        out.append(f"only {count} {a.task.targets} were evaluated (fewer than "
                   f"{MIN_EVAL_TARGETS}): the barrier is noise; evaluate a larger split")
    return out


def _endpoint_warnings(results: dict[str, MethodResult], rtol: float = 1e-3) -> list[str]:
    """An aligned B computes B's function: its λ = 0 loss must match the others'."""
    out = []
    ref = next(iter(results.values()), None)
    if ref is None:
        return out
    for r in results.values():
        if abs(r.loss_b - ref.loss_b) > rtol * max(1.0, abs(ref.loss_b)):
            out.append(f"method {r.name}: loss of B aligned {r.loss_b:.6g} differs from "
                       f"{ref.name}'s {ref.loss_b:.6g}; the alignment changed B's function")
    return out


__all__ = ["METHODS", "AlignOptions", "BarrierReport", "CorrectedPath", "Method",
           "MethodResult", "barrier", "barrier_batches", "barrier_curve", "get_method",
           "lambda_grid", "prepare_barrier", "register_method", "run_barrier"]
