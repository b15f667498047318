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
import sys
from collections.abc import Mapping
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


#: torch dtypes by their safetensors names (the header's).
_SAFETENSORS_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                      torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                      torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}


def save_tensors(path: str | Path, state: Mapping[str, torch.Tensor],
                 dtype: torch.dtype | None = None, metadata: dict[str, str] | None = None,
                 release: bool = False) -> None:
    """Write ``state`` as one safetensors file, its floating tensors in ``dtype`` (None: as
    they are), converting and writing one tensor at a time: beyond ``state`` it costs one
    tensor in ``dtype``, where ``save_file`` holds a converted copy of them all.

    ``release``: ``state`` (a dict) is emptied as it is written, each tensor dropped once on
    disk (the caller must hold no other reference for the memory to come back).

    The file is what ``safetensors.torch.save_file`` writes (its header, then the tensors
    in the order of the header's offsets) and reads back with ``load_file``/``safe_open``.
    """
    def out_dtype(t: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    names = sorted(state)
    if sys.byteorder != "little" or any(out_dtype(state[n]) not in _SAFETENSORS_NAMES
                                        for n in names):  # (rare: safetensors' own writer)
        save_file(as_stored(dict(state), dtype) if dtype is not None else
                  {k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
        return
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for n in names:
        t = state[n]
        size = t.numel() * out_dtype(t).itemsize
        header[n] = {"dtype": _SAFETENSORS_NAMES[out_dtype(t)], "shape": list(t.shape),
                     "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # (the data start 8-byte aligned, as save_file's)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for n in names:
            t = state[n]
            data = t.detach().to(out_dtype(t)).contiguous().reshape(-1).view(torch.uint8)
            f.write(memoryview(data.numpy()))
            del t, data
            if release and isinstance(state, dict):
                del state[n]


def write_glmc(folder: Path, model: Any, release: bool = False) -> None:
    """A glmc folder: ``config.json`` (format, family, canonical config) and
    ``model.safetensors`` in canonical names, in the model's stored dtype (``release``: the
    model's state emptied as it is written, see :func:`save_tensors`)."""
    cfg = {"glmc_format": GLMC_FORMAT, "family": model.family.name,
           "canonical": model.config.to_json()}
    (Path(folder) / "config.json").write_text(json.dumps(cfg, indent=2))
    save_tensors(Path(folder) / "model.safetensors", model.state, stored_dtype(model),
                 metadata={"format": "pt"}, release=release)


def write_hf(folder: Path, hf_config: Any, state: StateDict,
             dtype: torch.dtype = torch.float32, release: bool = False) -> None:
    """A Hugging Face folder: ``config.json`` (saying ``dtype``) and ``model.safetensors``
    (stock names, in ``dtype``, written one tensor at a time; ``release``: ``state`` is
    emptied as it is written, see :func:`save_tensors`)."""
    hf_config.dtype = dtype
    hf_config.save_pretrained(str(folder))
    save_tensors(Path(folder) / "model.safetensors", state, dtype, metadata={"format": "pt"},
                 release=release)


def write_json(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
