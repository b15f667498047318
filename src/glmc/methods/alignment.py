"""An alignment: B moved into A's coordinates by a transform, with how it was found."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmc.errors import GlmcError
from glmc.matching.learned import LearnedResult
from glmc.matching.weight import MatchResult
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform


@dataclass
class Alignment:
    """B aligned to A: ``aligned`` = transform applied to ``b`` (same function as ``b``);
    None when the pair was handed over (``AlignOptions.hand_over``: ``a`` and ``b`` are then
    empty).

    ``settings``: what produced it (inputs, method, residual, heads), for the report.
    """

    a: CanonicalModel
    b: CanonicalModel
    aligned: CanonicalModel | None
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
        """Write B aligned as ``glmc align`` does (see :func:`glmc.writing.save_alignment`)."""
        from glmc.writing import save_alignment  # (writing reads Alignment: imported late)

        if self.aligned is None:
            raise GlmcError("this alignment was handed over (AlignOptions.hand_over): B "
                            "aligned was not built; apply its transform to B read again")
        return save_alignment(self, path, force=force, stock=stock)


