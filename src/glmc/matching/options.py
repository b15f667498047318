"""Options of weight and learned matching (torch-free: the command line takes its defaults and
choices from here). :mod:`glmc.matching.weight` and :mod:`glmc.matching.learned` run them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from glmc.errors import GlmcError

#: The residual stream's group: orthogonal, its permutations (the paper's ablation), or none
#: (the stream left as it is).
RESIDUALS = ("orthogonal", "permutation", "none")
WEIGHTINGS = ("tensor", "layer", "none")
UNIT_COSTS = ("angle", "distance")
INNER = ("invertible", "orthogonal", "permutation")
INITS = ("spectral", "embeddings", "identity", "activation")
#: When weight matching stops (see :class:`WeightMatchingOptions`).
STOPPING = ("objective", "fixed-point")
#: Which of weight matching's iterates the ``weight`` method returns when it has data: the one
#: of lowest validation loss, or the last (``AlignOptions.select``).
SELECTIONS = ("validation", "last")
#: Learned matching's learning-rate schedules (see :class:`LearnedMatchingOptions`).
SCHEDULES = ("plateau", "cosine")
#: Where learned matching starts (see :class:`LearnedMatchingOptions`).
STARTS = ("weight", "activation", "best")


def default_inner(residual: str) -> str:
    """The heads' inner maps that go with a residual group: permutations for the
    permutation-only ablation, else the full group (invertible)."""
    return "permutation" if residual == "permutation" else "invertible"


@dataclass
class WeightMatchingOptions:
    residual: str = "orthogonal"  # "orthogonal" | "permutation" | "none"
    max_iter: int = 15
    tol: float = 1e-2  # stop when a full sweep lowers the distance by less (relative)
    #: "objective": stop at the first full sweep (every unit solved) that lowers D by less
    #: than ``tol``; "fixed-point": at the first such sweep that changed no assignment
    #: either (the barrier is the criterion, not the last permutation: chosen on the
    #: held-out validation pairs, benchmarks/README.md)
    stop: str = "objective"
    #: The residual map's start: "spectral" (Gram eigenbases matched), "embeddings"
    #: (Procrustes on the tensors only the stream touches: embeddings, unembedding, residual
    #: biases), "identity", or "activation": ``stream_start``, the map activation matching
    #: found on data (what the methods pass when they have data; see glmc.methods)
    init: str = "embeddings"
    #: The residual map to start from under ``init="activation"`` (an Element of the stream's
    #: group, e.g. ``activation_matching(a, b, batches).elements[stream]``)
    stream_start: Any = None
    #: "tensor": w_t = 1/entries (every tensor counts by its mean squared difference);
    #: "layer": a bias counts as its layer's weight matrix does; "none": every entry counts the
    #: same (large tensors dominate)
    weighting: str = "tensor"
    #: Extra factor on each bias vector's weight: under "tensor" a bias of d entries would
    #: otherwise count as much as a whole d×d matrix (chosen on a screen: benchmarks/README.md)
    bias_weight: float = 0.3
    #: Extra factor on the weight of the tensors a space of each role acts on, by the spec's
    #: role names (e.g. {"qk": 0.25}: attention's queries and keys count a quarter).
    role_weights: dict[str, float] = field(default_factory=dict)
    #: How a permutation unit (an MLP's hidden units, a convnet's channels) is assigned:
    #: "distance", by the squared distance (the objective's own term), or "angle", by the
    #: angle between its units' normalised weight vectors (all of a unit's rows and columns,
    #: concatenated, every entry alike). Level on transformers; on LayerNorm ResNet-20s the
    #: angle can leave more than vanilla averaging (benchmarks/README.md)
    unit_cost: str = "distance"
    #: The heads' inner maps: "invertible" (GL per head: the full symmetry) or "permutation"
    #: (head dimensions permuted: the permutation-only ablation). None: "permutation" when the
    #: residual map is a permutation, else "invertible".
    inner: str | None = None
    #: Keep the residual map fixing the all-ones direction (exportable to LayerNorm models);
    #: None: when both models are centred (every residual writer mean-zero).
    fix_ones: bool | None = None
    #: Per parameter: (axis, boolean mask) of the rows that count (e.g. tokens seen).
    row_masks: dict[str, tuple[int, Any]] = field(default_factory=dict)
    #: The models are handed over (``glmc align``, which reads B again for its output): each
    #: tensor leaves its model's state dict as soon as the matching no longer reads it (A's
    #: replaced by the weighted copies the steps read, B's once moved to the start), so that
    #: the models are not held beside the matching's own copies. The result is the same, bit
    #: for bit, except for a pair stored in bfloat16, then matched in it (its copies held
    #: at half the memory: :mod:`glmc.matching.held`); both state dicts are to be emptied
    #: afterwards (see ``Problem``).
    hand_over: bool = False
    #: Where the products run (the weighted copies, the units' costs, the residual map's
    #: Procrustes): "cpu", "cuda", "cuda:N" or "auto" (see :mod:`glmc.devices`); the
    #: assignments run on the CPU whatever it is, and the result comes back to it.
    device: Any = "cpu"
    #: A folder where the residual map's cache of cross-correlations (d x d per tensor the
    #: map acts on once: 6.4 GB at Llama-2-7B's widths) is kept in files instead of memory,
    #: the same values read back one at a time (:mod:`glmc.matching.spilled`); None: in memory.
    #: ``glmc align`` spills beside its output when it streams A (``--stream``).
    spill: str | None = None

    def __post_init__(self) -> None:
        for value, choices, what in ((self.residual, RESIDUALS, "residual mode"),
                                     (self.weighting, WEIGHTINGS, "weighting"),
                                     (self.unit_cost, UNIT_COSTS, "unit cost"),
                                     (self.init, INITS, "init"),
                                     (self.stop, STOPPING, "stopping rule")):
            if value not in choices:
                raise GlmcError(f"unknown {what} {value!r} (one of {', '.join(choices)})")
        if self.inner is None:
            self.inner = default_inner(self.residual)
        if self.inner not in INNER:
            raise GlmcError(f"unknown inner maps {self.inner!r} (one of {', '.join(INNER)})")
        for what, value in (("bias", self.bias_weight), *self.role_weights.items()):
            if not value > 0:
                raise GlmcError(f"{what} weight must be positive, got {value}")
        if self.max_iter < 1:
            raise GlmcError(f"weight matching needs at least 1 iteration, got {self.max_iter}")
        if self.init == "activation" and self.stream_start is None:
            raise GlmcError("init='activation' starts the residual map from activation "
                            "matching's: pass it as stream_start (or give the method data)")


#: Learned matching's λ between two models of the same widths: the paper's, around the
#: midpoint, where such a pair's barrier lies.
PAIR_LAMBDA = "uniform:0.4,0.6"
#: ... and between A and a narrower B: the whole segment. Their barrier lies off the
#: midpoint, towards B (benchmarks/README.md, widths).
NARROWER_LAMBDA = "uniform:0,1"


@dataclass
class LearnedMatchingOptions:
    #: The most steps; the default schedule stops earlier, on a validation plateau
    steps: int = 5000
    batch_size: int = 32  # global batch (split across ranks under torchrun)
    context: int | None = None  # text: window length (default: the model's positions)
    lr: float = 1e-2
    #: Learning rate of the permutation latents, as a fraction of ``lr`` (AdamW moves every
    #: latent entry by about the learning rate per step; a permutation flips once its entries
    #: have moved by about one). Ignored when nothing else is learned (permutations only).
    perm_lr_scale: float = 0.1
    weight_decay: float = 0.0
    warmup: int = 10
    clip: float = 1.0
    #: λ distribution: "uniform:LO,HI" (the paper: 0.4,0.6), "gaussian:MEAN,STD", "uniform:0,1";
    #: None: :data:`PAIR_LAMBDA` for models of the same widths, :data:`NARROWER_LAMBDA` for a
    #: narrower B (see :meth:`lam_for`)
    lam: str | None = None
    #: N models: λ ~ Dirichlet(α, ..., α) on the simplex at each step (α chosen on
    #: three-model validation sets: benchmarks/README.md)
    dirichlet_alpha: float = 3.0
    #: N models: the share of steps drawn instead on a random pair's edge, λ ~ ``lam`` for one
    #: of the two and 1 − λ for the other (0: Dirichlet draws alone; chosen on the same sets)
    edge_fraction: float = 0.5
    #: N models: how strongly the edge draws favour the pairs with the highest barrier at the
    #: last validation (a min-max over the pairs): a pair is drawn with probability ∝
    #: exp(focus·(b_pair − max b)), b its midpoint's validation loss minus its endpoints' mean,
    #: in nats (0: every pair alike; 100: a pair 0.01 nat below the worst at e⁻¹ of its odds).
    #: Measured only at fixed budgets of 6,000 steps and more, where it helped with 0.9 of the
    #: steps on edges (benchmarks/README.md, three transformers); not yet under the plateau
    #: stop, so the default stays 0
    edge_focus: float = 0.0
    #: N models: the first model's map trains too (the frame is no model's coordinates while it
    #: trains; the result is expressed in the first's). Anchored on the first, a pair between
    #: two later models has both its maps training and a pair with the first only one. None:
    #: free when every model has the first's width (a narrower model's free entries take the
    #: first's values in its coordinates, so then anchored), True: free or refused, False:
    #: anchored (benchmarks/README.md, three transformers, measures both)
    free_frame: bool | None = None
    eval_every: int = 100
    eval_lambdas: tuple[float, ...] = (0.5,)
    eval_batches: int = 4
    #: The learning rate over the steps: "plateau" (warm-up, then constant until ``patience``
    #: validations bring no new best; then it is cut by ``cut``, at most ``cuts`` times, and
    #: the next plateau stops the run) or "cosine" (warm-up, then a half cosine to 0 at
    #: ``steps``; with ``patience``, a plateau stops it; chosen on the held-out validation
    #: pairs, benchmarks/README.md)
    schedule: str = "plateau"
    #: validations without a new best that make a plateau (0: none ever does: the learning
    #: rate stays as it is and the run goes on to ``steps``)
    patience: int = 3
    cut: float = 0.3  # the learning rate's factor at each plateau ("plateau" schedule)
    cuts: int = 2  # plateaus that cut the learning rate before one stops the run
    #: Where a pair's latents start: "weight" (weight matching's solution), "activation"
    #: (activation matching's, on the training data), or "best" (both validated at the eval
    #: points, the lower kept); N models start from their frame
    start: str = "best"
    #: Stop once the steps have taken this many seconds (None: no limit); the run ends
    #: at the best point validated so far, as at any other stop
    time_budget: float | None = None
    residual: str = "orthogonal"  # "orthogonal" | "permutation" | "none"
    seed: int = 0
    dtype: str = "float32"  # of the models on the path ("float64": for exact comparisons)
    #: Where the steps run (the path's models, the latents, the batches): "cpu", "cuda",
    #: "cuda:N" or "auto" (see :mod:`glmc.devices`); the permutations' assignments run on
    #: the CPU whatever it is, and the result comes back to it. A run resumes on any device.
    device: Any = "cpu"
    checkpoint: str | None = None  # file for the latents, written atomically
    checkpoint_every: int = 50  # (with a checkpoint file: every this many steps, and at the end)
    resume: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.steps >= 1, f"steps must be at least 1, got {self.steps}"),
            (self.batch_size >= 1, f"batch size must be at least 1, got {self.batch_size}"),
            (self.lr > 0, f"learning rate must be positive, got {self.lr}"),
            (0 < self.dirichlet_alpha < float("inf"),
             f"the Dirichlet α must be positive, got {self.dirichlet_alpha}"),
            (0 <= self.edge_fraction <= 1,
             f"the edge fraction must be in [0, 1], got {self.edge_fraction}"),
            (0 <= self.edge_focus < float("inf"),
             f"the edge focus must be >= 0 and finite, got {self.edge_focus}"),
            (self.free_frame in (None, True, False),
             f"free_frame is True, False or None (free when every model has the first's "
             f"width), got {self.free_frame!r}"),
            (self.perm_lr_scale >= 0,
             f"permutation learning-rate scale must be >= 0, got {self.perm_lr_scale}"),
            (self.warmup >= 0, f"warm-up must be at least 0, got {self.warmup}"),
            (self.eval_every >= 1, f"eval-every must be at least 1, got {self.eval_every}"),
            (self.eval_batches >= 1, f"eval batches must be at least 1, got {self.eval_batches}"),
            (self.patience >= 0, f"patience must be at least 0, got {self.patience}"),
            (self.schedule in SCHEDULES,
             f"unknown schedule {self.schedule!r} (one of {', '.join(SCHEDULES)})"),
            (0 < self.cut < 1, f"the cut must be in (0, 1), got {self.cut}"),
            (self.cuts >= 0, f"cuts must be at least 0, got {self.cuts}"),
            (self.start in STARTS,
             f"unknown start {self.start!r} (one of {', '.join(STARTS)})"),
            (self.time_budget is None or self.time_budget > 0,
             f"the time budget must be positive (seconds), got {self.time_budget}"),
            (self.checkpoint_every >= 0,
             f"checkpoint-every must be at least 0, got {self.checkpoint_every}"),
            (self.residual in RESIDUALS,
             f"unknown residual mode {self.residual!r}"),
            (len(self.eval_lambdas) >= 1
             and all(0.0 <= lam <= 1.0 for lam in self.eval_lambdas),
             "eval λs must be one or more values in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise GlmcError(f"learned matching: {message}")
        if self.lam is not None:
            parse_lambda(self.lam)  # a bad distribution fails here, before any work

    def lam_for(self, narrower: bool) -> str:
        """The λ distribution of a pair (``narrower``: B embedded into A's widths)."""
        if self.lam is not None:
            return self.lam
        return NARROWER_LAMBDA if narrower else PAIR_LAMBDA


def parse_lambda(spec: str) -> tuple[str, float, float]:
    """``(kind, a, b)`` of a λ distribution "uniform:LO,HI" or "gaussian:MEAN,STD".

    Raises:
        GlmcError: a malformed spec, or an impossible range.
    """
    bad = GlmcError(f"bad λ distribution {spec!r} (uniform:LO,HI or gaussian:MEAN,STD)")
    try:
        kind, args = spec.split(":")
        lo, hi = (float(v) for v in args.split(","))
    except ValueError:
        raise bad from None
    if (kind not in ("uniform", "gaussian") or (kind == "uniform" and not 0.0 <= lo <= hi <= 1.0)
            or (kind == "gaussian" and hi < 0)):
        raise bad
    return kind, lo, hi


#: How N models are brought into one frame (see glmc.matching.frames): MergeMany, each to the
#: first, or universe matching (every map at once, Frank-Wolfe).
FRAMES: tuple[str, ...] = ("mergemany", "star", "universe")
#: The methods N models are merged by: none (the vanilla average, no frame), weight matching,
#: then learned refinement for the last two (see glmc.api.merge_many).
MANY_METHODS: tuple[str, ...] = ("none", "weight", "weight-perm", "learned", "learned-perm")


def simplex_weights(weights: Sequence[float] | None, n: int, what: str = "weights") -> list[float]:
    """The weights of n models as floats: uniform when None; else n of them, each >= 0,
    summing to 1 (within 1e-6), or a GlmcError naming ``what``."""
    if weights is None:
        return [1.0 / n] * n
    w = [float(x) for x in weights]
    if len(w) != n or any(x < 0 for x in w) or abs(sum(w) - 1.0) > 1e-6:
        raise GlmcError(f"{what} {','.join(f'{x:g}' for x in w)}: give {n} weights >= 0 that "
                        "sum to 1, one per model")
    return w
