"""Certificates of function preservation: max |Δ logits| on random inputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glmc.errors import GlmcError
from glmc.io.folders import LoadedModel
from glmc.model import CanonicalModel
from glmc.tasks import task_of

Logits = Callable[[torch.Tensor], torch.Tensor]


def random_inputs(cfg: Any, n: int = 4, seq: int = 32, seed: int = 0,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Inputs of the model's task drawn with ``seed``: token ids (n, min(seq, context)) or
    images (n, C, H, W)."""
    return task_of(cfg).random_inputs(cfg, n, seq, seed, dtype)


def canonical_logits(model: CanonicalModel, dtype: torch.dtype = torch.float64) -> Logits:
    """Logits of a canonical model. The module is built at each call and released after it,
    so that comparing two large models never holds both in float64 at once."""

    def run(x: torch.Tensor) -> torch.Tensor:
        module = model.module(dtype)
        with torch.no_grad():
            return module(x if not x.is_floating_point() else x.to(dtype))

    return run


def folder_logits(m: LoadedModel, dtype: torch.dtype = torch.float64) -> Logits:
    """Logits of a loaded folder computed by its own class (the stock one for HF folders);
    like ``canonical_logits``, the module lives only during a call."""
    if m.importer is None:
        return canonical_logits(m.canonical, dtype)
    importer = m.importer

    def run(x: torch.Tensor) -> torch.Tensor:
        module = m.stock_module(dtype)
        with torch.no_grad():
            return importer.stock_logits(module, x if not x.is_floating_point() else x.to(dtype))

    return run


@dataclass
class Certificate:
    max_abs_diff: float
    scale: float  # max |logits| of the reference
    tol: float

    @property
    def equal(self) -> bool:
        return self.max_abs_diff <= self.tol

    def to_json(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "equal": self.equal, "tol": self.tol,
                "logit_scale": self.scale}


def certify(reference: Logits, other: Logits, x: torch.Tensor, tol: float | None = None,
            rel_tol: float = 1e-4) -> Certificate:
    """Compare two logit functions on ``x``; tol defaults to rel_tol · max(1, max|logits|)."""
    return compare(reference(x), other(x), tol, rel_tol)


def compare(a: torch.Tensor, b: torch.Tensor, tol: float | None = None,
            rel_tol: float = 1e-4) -> Certificate:
    """Certificate for logits ``b`` against the reference logits ``a``."""
    scale = float(a.abs().max())
    diff = float((a - b).abs().max())
    if tol is None:
        tol = rel_tol * max(1.0, scale)
    return Certificate(diff, scale, tol)


#: The certificates' tolerance relative to the logits' scale, by the dtype a folder's weights
#: are stored in: rounding the weights to bfloat16 (8 significant bits) or float16 moves the
#: logits by about their precision times the depth.
REL_TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 4e-2}


def certify_folder(folder: str | Path, x: torch.Tensor, want: torch.Tensor) -> dict:
    """max |Δ logits| between the model folder as written (in the dtype it stores, read by
    its own class, evaluated in float64) and the reference logits ``want`` on inputs ``x``,
    as a report entry; the tolerance follows the stored dtype (:data:`REL_TOL`)."""
    from glmc.io.folders import load_model

    loaded = load_model(folder)
    source = getattr(loaded.canonical.config, "source", {}) or {}
    stored = source.get("dtype", "float32") if isinstance(source, dict) else "float32"
    cert = compare(want, folder_logits(loaded)(x), rel_tol=REL_TOL.get(stored, 1e-4))
    return {**cert.to_json(), "stored_dtype": stored}


def same_interface(a: Any, b: Any, where: str) -> None:
    """Raise unless models a and b take the same inputs and give logits of the same shape."""
    if type(a) is not type(b):
        raise GlmcError(f"{where}: models of different families ({type(a).family} vs "
                        f"{type(b).family})")
    task_of(a).same_interface(a, b, where)
