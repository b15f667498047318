"""Token counts: how often each vocabulary entry occurs in training, read from a file (only the
rows of seen tokens count in weight matching)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from glmc.errors import GlmcError


def read_token_counts(path: str | Path, vocab_size: int) -> torch.Tensor:
    """Token counts (vocab_size,) from .json (list, or {id: count}), .npy or whitespace text."""
    p = Path(path)
    if not p.is_file():
        raise GlmcError(f"{p}: no such token-count file")
    try:
        if p.suffix == ".json":
            raw = json.loads(p.read_text())
            if isinstance(raw, dict):
                counts = np.zeros(vocab_size)
                for k, v in raw.items():
                    if not 0 <= int(k) < vocab_size:
                        raise ValueError(f"token id {k} outside the vocabulary")
                    counts[int(k)] = float(v)
            else:
                counts = np.asarray(raw, dtype=np.float64)
        elif p.suffix == ".npy":
            counts = np.load(p, allow_pickle=False).astype(np.float64)
        else:
            counts = np.asarray(p.read_text().split(), dtype=np.float64)
    except (ValueError, TypeError, IndexError, json.JSONDecodeError) as e:
        raise GlmcError(f"{p}: cannot read token counts ({e})") from None
    if counts.shape != (vocab_size,):
        raise GlmcError(f"{p}: {counts.size} token counts, the vocabulary has {vocab_size}")
    return torch.from_numpy(counts)
