"""Resumable checkpoints: one file, replaced atomically, beside (not inside) the output folder.

The checkpoint of output folder ``runs/gpt-a`` is ``runs/.gpt-a.ckpt/checkpoint.pt``; it holds
everything the next step depends on (weights, AdamW moments, schedule position, the data
stream's position, the torch RNG) so a resumed run is bit-identical to an uninterrupted one. It is
removed once the output folder is complete. Loading uses ``torch.load(weights_only=True)``: the
file holds tensors, numbers, strings and plain containers only (configs and the log as JSON
strings).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from glmc.errors import GlmcError, reason
from glmc.io.atomic import atomic_path

CHECKPOINT_FORMAT = 2  # 2: the model config under "model_config", any family
CHECKPOINT_FILE = "checkpoint.pt"


def checkpoint_dir(out: str | Path) -> Path:
    """The hidden sibling folder that holds ``out``'s checkpoint while it trains."""
    out = Path(out)
    return out.parent / f".{out.name}.ckpt"


def checkpoint_path(out: str | Path) -> Path:
    """The checkpoint file of output folder ``out``."""
    return checkpoint_dir(out) / CHECKPOINT_FILE


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` with torch.save to a temp file, then rename it over ``path``.

    A kill at any moment leaves either the previous checkpoint or the new one, never a torn file.
    """
    with atomic_path(path) as tmp:
        torch.save({"format": CHECKPOINT_FORMAT, **payload}, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only).

    Raises:
        GlmcError: the file is unreadable, not a glmc checkpoint, or of another format version.
    """
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        raise GlmcError(f"{path}: cannot read checkpoint ({reason(e)})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise GlmcError(f"{path}: not a glmc training checkpoint (format {CHECKPOINT_FORMAT})")
    for key in ("config", "data", "model_config", "log"):
        try:
            payload[key] = json.loads(payload[key])
        except (KeyError, TypeError, ValueError) as e:
            raise GlmcError(f"{path}: damaged checkpoint ({key}: {e})") from None
    return payload


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint holds, read cheaply (memory-mapped); None if it is unreadable."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(payload["step"])
    except Exception:  # noqa: BLE001 - any failure: the step is unknown
        return None


def remove_checkpoint(out: str | Path) -> None:
    """Delete ``out``'s checkpoint folder if there is one."""
    shutil.rmtree(checkpoint_dir(out), ignore_errors=True)
