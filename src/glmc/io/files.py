"""The files of a model folder, as glmc writes them: a glmc folder's config and weights, a
Hugging Face folder's, and JSON, each in the dtype the model was stored in.

Below the families (it reads no family code: a model is written from its family's name, its
config's JSON and its state dict), so that a family's trainer can write its own folders.

A model read from a folder remembers the dtype its weights were stored in
(``config.source["dtype"]``: "bfloat16", "float16" or "float32"); it is matched in float32 and
written back in that dtype, so that a bfloat16 checkpoint stays one (same size) and a
certificate computed on the folder as written describes what ``from_pretrained`` loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from glmc.io.atomic import atomic_path
from glmc.tensors import StateDict

GLMC_FORMAT = 1
#: The dtypes weights are written in (others are written as float32).
STORED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "float64": torch.float64}


def stored_dtype_of(state: StateDict) -> str:
    """The name of the floating dtype most of ``state``'s entries are stored in."""
    counts: dict[str, int] = {}
    for t in state.values():
        if t.is_floating_point():
            name = str(t.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + t.numel()
    best = max(counts, key=counts.get) if counts else "float32"  # type: ignore[arg-type]
    return best if best in STORED_DTYPES else "float32"


def stored_dtype(model: Any) -> torch.dtype:
    """The dtype ``model`` (a CanonicalModel) is written in: the one it was read from, else
    the one its tensors have (a model made in memory)."""
    source = getattr(model.config, "source", None)
    name = source.get("dtype") if isinstance(source, dict) else None
    return STORED_DTYPES.get(name or stored_dtype_of(model.state), torch.float32)


def as_stored(state: StateDict, dtype: torch.dtype) -> StateDict:
    """The floating tensors in ``dtype``, contiguous (what safetensors writes)."""
    return {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
            for k, v in state.items()}


def write_glmc(folder: Path, model: Any) -> None:
    """A glmc folder: ``config.json`` (format, family, canonical config) and
    ``model.safetensors`` in canonical names, in the model's stored dtype."""
    cfg = {"glmc_format": GLMC_FORMAT, "family": model.family.name,
           "canonical": model.config.to_json()}
    (Path(folder) / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(as_stored(model.state, stored_dtype(model)),
              str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})


def write_hf(folder: Path, hf_config: Any, state: StateDict,
             dtype: torch.dtype = torch.float32) -> None:
    """A Hugging Face folder: ``config.json`` (saying ``dtype``) and ``model.safetensors``
    (stock names, in ``dtype``)."""
    hf_config.dtype = dtype
    hf_config.save_pretrained(str(folder))
    save_file(as_stored(state, dtype), str(Path(folder) / "model.safetensors"),
              metadata={"format": "pt"})


def write_json(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
