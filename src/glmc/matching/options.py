"""Options of learned matching (torch-free: the command line takes its defaults from here).

:mod:`glmc.matching.learned` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glmc.errors import GlmcError


@dataclass
class LearnedMatchingOptions:
    steps: int = 300
    batch_size: int = 32  # global batch (split across ranks under torchrun)
    context: int | None = None  # text: window length (default: the model's positions)
    lr: float = 1e-2
    weight_decay: float = 0.0
    warmup: int = 10
    clip: float = 1.0
    #: λ distribution: "uniform:LO,HI" (the paper: 0.4,0.6), "gaussian:MEAN,STD", "uniform:0,1"
    lam: str = "uniform:0.4,0.6"
    eval_every: int = 25
    eval_lambdas: tuple[float, ...] = (0.5,)
    eval_batches: int = 4
    patience: int = 4  # evaluations without improvement before stopping (0: never stop)
    residual: str = "orthogonal"  # "orthogonal" | "permutation" | "none"
    seed: int = 0
    dtype: str = "float32"  # of the models on the path ("float64": for exact comparisons)
    checkpoint: str | None = None  # file for the latents, written atomically
    checkpoint_every: int = 0
    resume: bool = False

    def __post_init__(self) -> None:
        checks = [
            (self.steps >= 1, f"steps must be at least 1, got {self.steps}"),
            (self.batch_size >= 1, f"batch size must be at least 1, got {self.batch_size}"),
            (self.lr > 0, f"learning rate must be positive, got {self.lr}"),
            (self.warmup >= 0, f"warm-up must be at least 0, got {self.warmup}"),
            (self.eval_every >= 1, f"eval-every must be at least 1, got {self.eval_every}"),
            (self.eval_batches >= 1, f"eval batches must be at least 1, got {self.eval_batches}"),
            (self.patience >= 0, f"patience must be at least 0, got {self.patience}"),
            (self.checkpoint_every >= 0,
             f"checkpoint-every must be at least 0, got {self.checkpoint_every}"),
            (self.residual in ("orthogonal", "permutation", "none"),
             f"unknown residual mode {self.residual!r}"),
            (all(0.0 <= lam <= 1.0 for lam in self.eval_lambdas), "eval λs must lie in [0, 1]"),
        ]
        for ok, message in checks:
            if not ok:
                raise GlmcError(f"learned matching: {message}")
        parse_lambda(self.lam)  # a bad distribution fails here, before any work


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
