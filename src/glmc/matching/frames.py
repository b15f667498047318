"""How N models are brought into one frame, by name: a registry of frame methods.

Each method takes the models, weight matching's options and a progress callback, and returns a
:class:`~glmc.matching.many.Frame` in the first model's coordinates. The names are
``glmc.matching.options.FRAMES`` (torch-free, for the command line's choices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from glmc.errors import GlmcError
from glmc.matching.many import Frame, merge_many, star
from glmc.matching.options import FRAMES, WeightMatchingOptions
from glmc.matching.universe import universe
from glmc.model import CanonicalModel

Progress = Callable[[int, int], None] | None
FrameMethod = Callable[..., Frame]

#: Frame method by name (see FRAMES).
FRAME_METHODS: dict[str, FrameMethod] = {
    "mergemany": lambda models, opts, max_rounds, seed, progress: merge_many(
        models, opts, max_rounds, seed=seed, progress=progress),
    "star": lambda models, opts, max_rounds, seed, progress: star(models, opts),
    "universe": lambda models, opts, max_rounds, seed, progress: universe(
        models, opts, progress=progress),
}


def find_frame(method: str, models: Sequence[CanonicalModel],
               opts: WeightMatchingOptions | None = None, max_rounds: int = 10,
               seed: int = 0, progress: Progress = None) -> Frame:
    """The frame of ``models`` by ``method`` (one of FRAMES; ``max_rounds`` and ``seed`` are
    MergeMany's)."""
    if method not in FRAME_METHODS:
        raise GlmcError(f"unknown frame {method!r} ({', '.join(FRAMES)})")
    return FRAME_METHODS[method](models, opts, max_rounds, seed, progress)
