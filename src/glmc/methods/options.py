"""The options every alignment method reads, defined once with the matchers' own defaults."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from glmc.data import Dataset, Tokenizer
from glmc.defaults import CORRECTIONS
from glmc.devices import resolve_device
from glmc.errors import GlmcError
from glmc.matching.options import (
    INITS,
    RESIDUALS,
    SELECTIONS,
    LearnedMatchingOptions,
    WeightMatchingOptions,
)
from glmc.methods import HEADS

_WM = WeightMatchingOptions()  # (the matchers' defaults, defined once there)
#: Learned matching's option names (what :meth:`AlignOptions.updated` routes to it).
_LEARNED_FIELDS = frozenset(f.name for f in fields(LearnedMatchingOptions))


@dataclass
class AlignOptions:
    """Every option an alignment method reads (each method uses what applies to it).

    Attributes:
        residual: group of the residual-stream map: ``"orthogonal"``, ``"permutation"`` (the
            paper's ablation) or ``"none"``; the ``-perm`` methods fix it to permutation.
        heads: ``"inner"`` (keep head_dim; heads assigned after aligning their inner bases)
            or ``"circuit"`` (both models rewritten with attention as QK/OV circuits first).
        max_iter, tol, stop, weighting, bias_weight, role_weights, unit_cost, inner, init: weight
            matching's options (see :class:`glmc.matching.options.WeightMatchingOptions`);
            ``init="auto"``: the residual map starts from activation matching's when the method
            has data and the map is orthogonal (``weight``, and learned matching's weight start;
            not under torchrun, whose ranks hold shares of the models), else from the
            embeddings.
        select: which of weight matching's iterates ``weight`` returns when it has data
            (and does not hand the pair over): ``"validation"``, the one with the lowest
            validation loss at learned matching's evaluation λs (on its validation
            batches); ``"last"``, the last. Without data, the last.
        token_counts: (vocab,) counts; vocabulary rows of unseen tokens do not count.
        data: the training data of data-driven methods (a loaded dataset, or a name or path
            that :func:`glmc.api.align` loads with the models' tokenizer and split seed).
        tokenizer, data_seed: how ``data`` is read (see :func:`glmc.api.learning_data`).
        learned: learned matching's options (its residual group follows ``residual``).
        seed: when set, learned matching's seed (data order and λ draws), over ``learned``'s.
        progress: callback(iteration, relative distance) of weight matching.
        learned_progress: callback(step, loss, midpoint barrier or None) of learned matching.
        stock: both models' stock weights as loaded (:class:`glmc.api.StockPair`), for
            ``none``; :func:`glmc.barrier.run_barrier` fills it in for Hugging Face folders.
        dtype: precision the models are aligned in by the barrier (evaluation is float32).
        correction: applied after interpolating (merge, barrier; see
            :mod:`glmc.correction`): ``"none"``, ``"reset"`` or ``"repair"``.
        hand_over: the pair is handed over to weight matching (``weight``, ``weight-perm``;
            what ``glmc align`` does, which reads B again for its output): it frees the
            models' tensors as it goes, the same transform bit for bit (a bfloat16 pair is
            matched in bfloat16: :mod:`glmc.matching.held`), and both models are left
            empty, with no ``aligned`` model (apply ``transform`` to B read again; see
            :class:`glmc.io.moved.Moved`). Other methods ignore it.
        device: where weight and learned matching compute: ``"cpu"``, ``"cuda"``,
            ``"cuda:N"`` or ``"auto"`` (see :mod:`glmc.devices`: the products, the residual
            map's Procrustes and learned matching's steps run there, the assignments on the
            CPU; the transform and B aligned come back to the CPU, equal to the CPU's within
            rounding); over ``learned``'s own. None: the CPU, or for
            :func:`glmc.barrier.run_barrier` its evaluation device. Activation matching and
            the universe frame's own steps run on the CPU.
        spill: a folder where weight matching keeps its residual cache in files instead of
            memory (see :class:`glmc.matching.options.WeightMatchingOptions`); None: in
            memory.
    """

    residual: str = "orthogonal"
    heads: str = "inner"
    max_iter: int = _WM.max_iter
    tol: float = _WM.tol
    stop: str = _WM.stop
    weighting: str = _WM.weighting
    bias_weight: float = _WM.bias_weight
    role_weights: dict[str, float] = field(default_factory=dict)
    unit_cost: str = _WM.unit_cost
    inner: str | None = None
    init: str = "auto"
    select: str = SELECTIONS[0]
    token_counts: torch.Tensor | None = None
    data: str | Path | Dataset | None = None
    tokenizer: str | Tokenizer | None = None
    data_seed: int | None = None
    learned: LearnedMatchingOptions | None = None
    seed: int | None = None
    progress: Callable[[int, float], None] | None = None
    learned_progress: Callable[[int, float, float | None], None] | None = None
    stock: Any = None
    dtype: torch.dtype = torch.float32
    correction: str = "none"
    hand_over: bool = False
    device: str | torch.device | None = None
    spill: str | None = None

    def __post_init__(self) -> None:
        for name, value, allowed in (("heads mode", self.heads, HEADS),
                                     ("residual group", self.residual, RESIDUALS),
                                     ("correction", self.correction, CORRECTIONS),
                                     ("init", self.init, ("auto", *INITS)),
                                     ("iterate selection", self.select, SELECTIONS)):
            if value not in allowed:
                raise GlmcError(f"unknown {name} {value!r} ({' or '.join(allowed)})")
        if self.device is not None:  # (a device this machine lacks: refused before any work)
            resolve_device(self.device)

    def weight_matching(self, row_masks: dict | None = None, hand_over: bool = False,
                        stream_start: Any = None) -> WeightMatchingOptions:
        """Weight matching's options; ``stream_start``: activation matching's residual map,
        which ``init="auto"`` (or ``"activation"``) starts from when it is given."""
        init = self.init
        if init == "auto":
            init = "activation" if stream_start is not None else _WM.init
        return WeightMatchingOptions(
            residual=self.residual, max_iter=self.max_iter, tol=self.tol, stop=self.stop,
            weighting=self.weighting, bias_weight=self.bias_weight,
            role_weights=dict(self.role_weights),
            unit_cost=self.unit_cost, inner=self.inner, init=init,
            stream_start=stream_start if init == "activation" else None,
            row_masks=row_masks or {}, hand_over=hand_over, device=self.device or "cpu",
            spill=self.spill)

    def starts_from_data(self) -> bool:
        """Whether weight matching's residual map starts from activation matching's (see
        ``init``): data given and loaded (a dataset, as the API and the barrier hand the
        methods), an orthogonal map, one process."""
        from glmc.distributed import spread

        return (self.init in ("auto", "activation") and isinstance(self.data, Dataset)
                and self.residual == "orthogonal" and not spread())

    def learned_matching(self) -> LearnedMatchingOptions:
        opts = replace(self.learned or LearnedMatchingOptions(), residual=self.residual)
        if self.device is not None:
            opts = replace(opts, device=self.device)
        return opts if self.seed is None else replace(opts, seed=self.seed)

    def updated(self, **overrides: Any) -> AlignOptions:
        """A copy with ``overrides``: fields of these options, or of learned matching's
        (``steps=``, ``lr=``, ...: they update ``learned``). An unknown name is a GlmcError
        that lists the valid ones (the command line's names in Python)."""
        mine = {f.name for f in fields(self)}
        theirs = _LEARNED_FIELDS
        unknown = sorted(set(overrides) - mine - theirs)
        if unknown:
            hint = PYTHON_NAMES.get(unknown[0])
            raise GlmcError(
                f"unknown alignment option {unknown[0]!r}"
                + (f" (in Python: {hint})" if hint else "")
                + f"; options: {', '.join(sorted(mine))}; learned matching's: "
                f"{', '.join(sorted(theirs - {'residual'}))}")
        learned = {k: v for k, v in overrides.items() if k in theirs and k not in mine}
        out = replace(self, **{k: v for k, v in overrides.items() if k in mine})
        if learned:
            out = replace(out, learned=replace(out.learned or LearnedMatchingOptions(),
                                               **learned))
        return out


#: The command line's option names that Python spells otherwise.
PYTHON_NAMES = {"iters": "max_iter=", "align": "method=", "train_batch_size": "batch_size=",
                "token_counts_file": "token_counts= (glmc.io.token_counts.read_token_counts)"}
