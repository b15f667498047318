"""What the transformer importers share: the canonical config of a stock model, and the test
that a canonical model can be written back as its stock class."""

from __future__ import annotations

from typing import Any

from glmc.families.importers import NotRepresentable
from glmc.families.transformer.model import CanonicalConfig
from glmc.model import CanonicalModel


def require_stock_form(model: CanonicalModel, source: str, tol: float = 1e-5) -> None:
    """Raise NotRepresentable unless ``model`` is a LayerNorm model in disguise.

    That holds when the attention is in head form and every residual writer is mean-zero
    (the residual map fixed the all-ones direction), so LayerNorm(γ=1, β=0) = RMSNorm.
    """
    cfg = model.config
    if cfg.source.get("arch") != source:
        raise NotRepresentable(f"model came from {cfg.source.get('arch')!r}, not {source!r}")
    if cfg.attention != "heads":
        raise NotRepresentable("attention is in circuit form (head dim = d_model)")
    bad = model.uncentred_writer(tol)
    if bad is not None:
        raise NotRepresentable(
            f"residual writer {bad[0]} is not mean-zero (relative mean {bad[1]:.2e}): the "
            "residual map does not fix the all-ones direction"
        )


def base_config(hf_config: Any, task: str, **fields: Any) -> CanonicalConfig:
    """A canonical config recording the stock config for export."""
    return CanonicalConfig(task=task, source={"arch": hf_config.model_type,
                                              "config": hf_config.to_dict()}, **fields)
