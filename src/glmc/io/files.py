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
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from glmc.io.atomic import atomic_path
from glmc.tensors import StateDict

GLMC_FORMAT = 1
#: The weights' file in a folder glmc writes.
WEIGHTS = "model.safetensors"
#: The dtypes weights are written in (others are written as float32).
STORED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "float64": torch.float64}
#: The stored dtype in which weight matching holds a pair handed over to it (its inputs
#: rounded to it: :mod:`glmc.matching.held`), and in which such a pair is loaded
#: (``load_model``'s ``half``): bfloat16, whose range is float32's. (Float16's is narrower
#: than the canonical rewrite may need, a norm's gain folded into a reader: a float16 pair
#: is held in float32.)
HELD_HALF = torch.bfloat16


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


class TensorFile:
    """A safetensors file written one tensor at a time, its header first: ``layout`` gives
    every tensor's name, shape and dtype as written, in the order :meth:`write` is given
    them (their data follow one another in that order). Beyond the tensor being written it
    holds nothing, so a model can be written while it is made, part by part.

    The file is what ``safetensors.torch.save_file`` writes (a header, then the tensors one
    after another, no holes) and reads back with ``load_file``/``safe_open``; written in
    the order of the header's offsets. A context manager: leaving it before every tensor is
    written is an error (the caller's temporary folder is then discarded).
    """

    def __init__(self, path: str | Path,
                 layout: list[tuple[str, tuple[int, ...], torch.dtype]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
        offset = 0
        for name, shape, dtype in layout:
            size = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": _SAFETENSORS_NAMES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            offset += size
        self._layout = layout
        self._next = 0
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # (the data start 8-byte aligned, as save_file's)
        self._file = open(path, "wb")  # noqa: SIM115 - (closed by __exit__)
        self._file.write(len(raw).to_bytes(8, "little"))
        self._file.write(raw)

    @staticmethod
    def writable(dtypes: Any) -> bool:
        """Whether tensors of ``dtypes`` can be written so (else: ``save_file``)."""
        return sys.byteorder == "little" and all(d in _SAFETENSORS_NAMES for d in dtypes)

    def write(self, name: str, t: torch.Tensor) -> None:
        """The next tensor of the layout (its name, shape and dtype as the layout says)."""
        want, shape, dtype = self._layout[self._next]
        if (name, tuple(t.shape), t.dtype) != (want, tuple(shape), dtype):
            raise AssertionError(f"{name} {list(t.shape)} {t.dtype} written where the header "
                                 f"says {want} {list(shape)} {dtype}")
        data = t.detach().contiguous().reshape(-1).view(torch.uint8)
        self._file.write(memoryview(data.numpy()))
        self._next += 1

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self._file.close()
        if kind is None and self._next != len(self._layout):
            raise AssertionError(f"{len(self._layout) - self._next} tensors of the header "
                                 "were not written")


def save_tensors(path: str | Path, state: Mapping[str, torch.Tensor],
                 dtype: torch.dtype | None = None, metadata: dict[str, str] | None = None,
                 release: bool = False) -> None:
    """Write ``state`` as one safetensors file, its floating tensors in ``dtype`` (None: as
    they are), converting and writing one tensor at a time (:class:`TensorFile`): beyond
    ``state`` it costs one tensor in ``dtype``, where ``save_file`` holds a converted copy of
    them all.

    ``release``: ``state`` (a dict) is emptied as it is written, each tensor dropped once on
    disk (the caller must hold no other reference for the memory to come back).
    """
    def out_dtype(t: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    names = sorted(state)
    if not TensorFile.writable(out_dtype(state[n]) for n in names):  # (rare: safetensors')
        save_file(as_stored(dict(state), dtype) if dtype is not None else
                  {k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
        return
    layout = [(n, tuple(state[n].shape), out_dtype(state[n])) for n in names]
    with TensorFile(path, layout, metadata) as f:
        for n in names:
            t = state[n]
            f.write(n, t.to(out_dtype(t)))
            del t
            if release and isinstance(state, dict):
                del state[n]


def write_glmc(folder: Path, model: Any, release: bool = False) -> None:
    """A glmc folder: ``config.json`` (format, family, canonical config) and
    ``model.safetensors`` in canonical names, in the model's stored dtype (``release``: the
    model's state emptied as it is written, see :func:`save_tensors`)."""
    write_glmc_config(folder, model)
    save_tensors(Path(folder) / WEIGHTS, model.state, stored_dtype(model),
                 metadata={"format": "pt"}, release=release)


def write_hf(folder: Path, hf_config: Any, state: StateDict,
             dtype: torch.dtype = torch.float32, release: bool = False) -> None:
    """A Hugging Face folder: ``config.json`` (saying ``dtype``) and ``model.safetensors``
    (stock names, in ``dtype``, written one tensor at a time; ``release``: ``state`` is
    emptied as it is written, see :func:`save_tensors`)."""
    write_hf_config(folder, hf_config, dtype)
    save_tensors(Path(folder) / WEIGHTS, state, dtype, metadata={"format": "pt"},
                 release=release)


def write_hf_config(folder: Path, hf_config: Any, dtype: torch.dtype) -> None:
    """A Hugging Face folder's ``config.json``, saying the weights' ``dtype``."""
    hf_config.dtype = dtype
    hf_config.save_pretrained(str(folder))


def write_glmc_config(folder: Path, model: Any) -> None:
    """A glmc folder's ``config.json`` (format, family, canonical config)."""
    cfg = {"glmc_format": GLMC_FORMAT, "family": model.family.name,
           "canonical": model.config.to_json()}
    (Path(folder) / "config.json").write_text(json.dumps(cfg, indent=2))


def write_json(path: Path, data: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
