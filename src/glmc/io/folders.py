"""Model folders: Hugging Face folders (config.json + safetensors) and glmc folders.

A glmc folder holds ``config.json`` with ``{"glmc_format": 1, "family": ..., "canonical":
{...}}`` and ``model.safetensors`` in canonical parameter names: the format of families
without a stock class, and of models with no exact stock equivalent (circuit-form attention,
a residual map that moves the all-ones direction). A folder without ``family`` is a
transformer's (written before families existed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import SafetensorError, safe_open

from glmc.errors import GlmcError, reason
from glmc.families.base import check_shapes, module_shapes
from glmc.families.importers import Importer, NotRepresentable
from glmc.families.registry import family_named, importer_for
from glmc.io.atomic import atomic_dir
from glmc.io.files import (
    HELD_HALF,
    STORED_DTYPES,
    stored_dtype,
    stored_dtype_of,
    write_glmc,
    write_hf,
    write_json,
)
from glmc.io.outputs import output_errors
from glmc.io.partial import read_part
from glmc.io.streamed import StreamedState
from glmc.model import CanonicalModel
from glmc.tensors import StateDict

#: The float32 bytes of canonical tensors made at once where a model is made part by part
#: (``load_model``'s ``half``, B aligned written by :mod:`glmc.io.moved`; at least one
#: tensor, however large): a layer or two of a billion-parameter model.
PART_BYTES = 256 << 20
#: The report and the transform written beside an output model's weights.
REPORT = "glmc_report.json"
TRANSFORM = "transform.safetensors"
#: Files a model needs beyond its weights, carried from the input folders to the outputs.
SIDE_FILES = ("glmc_tokenizer.json", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json")
#: The training record ``glmc train`` writes beside a model (its config, data seed and log).
TRAIN_FILE = "glmc_train.json"


@dataclass
class LoadedModel:
    """A model read from a folder, in canonical form (and in stock form for HF folders).

    ``stock_state`` (HF folders): the stock tensors, read from the folder's safetensors files
    when a tensor is asked for (see :class:`StoredState`: it holds no tensor, so keeping it
    costs nothing; a folder changed on disk since is an error when read), or a plain dict
    (a pickle checkpoint, read whole).
    """

    path: Path
    canonical: CanonicalModel
    importer: Importer | None = None  # None for a glmc folder
    hf_config: Any = None
    stock_state: Mapping[str, torch.Tensor] | None = None

    @property
    def kind(self) -> str:
        return "glmc" if self.importer is None else "hf"

    def stock_module(self, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
        """The stock module with every weight in ``dtype`` (a whole copy of the model: the
        certificates use :func:`glmc.verify.folder_logits`, which holds one layer at a
        time)."""
        assert self.importer is not None and self.stock_state is not None
        m = self.importer.stock_model(self.hf_config).to(dtype)
        m.load_state_dict(dict(self.stock_state), strict=False)  # (copy_ casts)
        return m


@dataclass
class StoredModel:
    """A model folder as stored, its tensors not read (:func:`open_model`): what a
    certificate of the folder computes from, one layer at a time.

    ``config``: the canonical config (glmc folder) or the stock one (``importer`` not None);
    ``state``: the tensors under the names the module reads (canonical, or the stock
    class's), float32 when read; ``dtype``: the name of the dtype they are stored in.
    """

    path: Path
    config: Any
    state: Mapping[str, torch.Tensor]
    dtype: str
    importer: Importer | None = None


# -- reading ------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``; one GlmcError naming it when it is not UTF-8 text, not
    JSON, or JSON of another kind (a list, a number)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise GlmcError(f"{path} is not UTF-8 text (a JSON file is)") from None
    except json.JSONDecodeError as e:
        raise GlmcError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise GlmcError(f"{path}: cannot read ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise GlmcError(f"{path} is not a JSON object (it holds a {_json_kind(data)})")
    return data


def _json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    kinds = ((bool, "boolean"), (int, "number"), (float, "number"), (str, "string"),
             (list, "list"), (type(None), "null"))
    return next(name for kind, name in kinds if isinstance(value, kind))


#: safetensors' dtype names (the header's) as torch dtypes.
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def _file_stamp(path: Path) -> tuple[int, int, int]:
    """What tells that a file was replaced or rewritten: its inode, size and mtime."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


class StoredState(Mapping[str, torch.Tensor]):
    """Tensors of safetensors files read when asked for: each file is memory-mapped
    (``safe_open``) only while one of its tensors is read, the tensor is checked (finite)
    and copied out in ``dtype`` (None: the stored one), and nothing is kept. A model read
    through it (:func:`load_model`) costs what its reader keeps, in float32, plus one tensor.

    ``meta``: every tensor's shape and stored dtype (tensors on the meta device, from the
    headers: no data). ``where`` names the folder in messages. A file that changed on disk
    since it was opened is an error when read (the state would mix two models).
    """

    def __init__(self, where: Path, entries: dict[str, tuple[Path, str]],
                 meta: dict[str, torch.Tensor], dtype: torch.dtype | None = torch.float32,
                 stamps: dict[Path, tuple[int, int, int]] | None = None) -> None:
        self.where, self.dtype = where, dtype
        self._entries, self.meta = entries, meta
        self._stamps = stamps if stamps is not None else {
            f: _file_stamp(f) for f in {path for path, _ in entries.values()}}

    @classmethod
    def open(cls, where: Path, files: list[Path],
             dtype: torch.dtype | None = torch.float32) -> StoredState:
        """The tensors of ``files`` (a later file's tensor of a name wins), from their
        headers alone; a GlmcError naming a file that is not safetensors."""
        entries: dict[str, tuple[Path, str]] = {}
        meta: dict[str, torch.Tensor] = {}
        stamps = {}
        for path in files:
            try:
                stamps[path] = _file_stamp(path)
                with safe_open(str(path), framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 - (safe_open is no dict)
                        part = f.get_slice(name)
                        kind = part.get_dtype()
                        if kind not in SAFETENSORS_DTYPES:
                            raise GlmcError(f"{where}: tensor {name} has dtype {kind.lower()} "
                                            f"(shape {list(part.get_shape())}); model weights "
                                            "must be floating point")
                        meta[name] = torch.empty(part.get_shape(), device="meta",
                                                 dtype=SAFETENSORS_DTYPES[kind])
                        entries[name] = (path, name)
            except (SafetensorError, OSError, ValueError) as e:
                raise GlmcError(f"{path}: cannot read safetensors file ({e})") from None
        return cls(where, entries, meta, dtype, stamps)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.read(key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def read(self, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Tensor ``key`` read from its file, in ``dtype`` (default: the state's), a copy
        that owns its memory (never a view of the mapped file)."""
        path, stored = self._entries[key]
        if _file_stamp_or_none(path) != self._stamps[path]:
            raise GlmcError(f"{path}: changed on disk since {self.where} was loaded; load it "
                            "again")
        dtype = dtype or self.dtype
        try:
            with safe_open(str(path), framework="pt") as f:
                t = f.get_tensor(stored)
                floating = t.is_floating_point()
                t = t.to(dtype if dtype is not None and floating else t.dtype, copy=True)
        except (SafetensorError, OSError) as e:
            raise GlmcError(f"{path}: cannot read safetensors file ({e})") from None
        if floating and not all_finite(t):  # (a float64 or float16 overflow included)
            raise GlmcError(f"{self.where}: tensor {key} contains NaN or Inf")
        return t

    def renamed(self, names: dict[str, str]) -> StoredState:
        """The same files with tensor ``old`` read as ``new``, for each ``new: old`` (the
        others left out)."""
        return StoredState(self.where, {new: self._entries[old] for new, old in names.items()},
                           {new: self.meta[old] for new, old in names.items()}, self.dtype,
                           self._stamps)

    def materialize(self) -> StateDict:
        """Every tensor, read (in the state's dtype)."""
        return {k: self.read(k) for k in self._entries}


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in ``t`` (a floating tensor), without a temporary of its size: its min
    and max are finite (both are NaN when one entry is)."""
    return t.numel() == 0 or all(bool(torch.isfinite(v)) for v in torch.aminmax(t))


def _file_stamp_or_none(path: Path) -> tuple[int, int, int] | None:
    try:
        return _file_stamp(path)
    except OSError:
        return None


def _read_safetensors(path: Path) -> StateDict:
    """Every tensor of one safetensors file, in its stored dtype."""
    return StoredState.open(path, [path], dtype=None).materialize()


def weight_files(folder: Path) -> list[Path] | None:
    """The safetensors files of ``folder``: ``model.safetensors``, or the shards its
    ``model.safetensors.index.json`` names (each checked to exist); None when it has
    neither."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if not index.is_file():
        return None
    weight_map = _read_json(index).get("weight_map", {})
    if not isinstance(weight_map, dict):
        raise GlmcError(f"{index}: 'weight_map' is not a JSON object")
    files = []
    for f in sorted(set(weight_map.values())):
        if not isinstance(f, str) or not (folder / f).is_file():
            raise GlmcError(f"{folder / str(f)}: shard named in {index.name} is missing")
        files.append(folder / f)
    return files


def folder_stamp(folder: str | Path) -> tuple:
    """What tells that a model folder's config or weights were replaced or rewritten (each
    file's inode, size and mtime), to check that a folder read again is the one read before;
    () when it cannot be read (reading it reports why)."""
    folder = Path(folder)
    try:
        files = [folder / "config.json", *(weight_files(folder) or
                                           [folder / "pytorch_model.bin"])]
        return tuple((f.name, *_file_stamp(f)) for f in files)
    except (GlmcError, OSError):
        return ()


def stored_state(folder: Path, allow_pickle: bool = False,
                 dtype: torch.dtype | None = torch.float32) -> StoredState | StateDict:
    """The tensors stored in ``folder``: a :class:`StoredState` over its safetensors file or
    shards (nothing read yet; each tensor read in ``dtype``, None: as stored), or, for a
    pickle checkpoint (on request), the dict it holds, as stored."""
    files = weight_files(folder)
    if files is not None:
        return StoredState.open(folder, files, dtype)
    pickled = folder / "pytorch_model.bin"
    if pickled.is_file():
        state = _read_pickle(pickled, allow_pickle)
        if not isinstance(state, dict):
            raise GlmcError(f"{pickled}: not a state dict (a dict of tensor names to tensors)")
        return state
    raise GlmcError(f"{folder}: no model.safetensors (or sharded index) in the folder")


def read_weights(folder: Path, allow_pickle: bool = False) -> StateDict:
    """The state dict stored in ``folder`` (single or sharded safetensors; pickle on request),
    read whole, in the stored dtypes."""
    state = stored_state(folder, allow_pickle, dtype=None)
    return state.materialize() if isinstance(state, StoredState) else state


def _read_pickle(path: Path, allow_pickle: bool) -> Any:
    """``torch.load(weights_only=True)`` (tensors and plain containers only), on request."""
    if not allow_pickle:
        raise GlmcError(
            f"{path}: pickle checkpoints are not loaded by default; convert it to "
            "safetensors or pass --allow-pickle (loaded with torch.load(weights_only=True))"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is the user's file
        raise GlmcError(f"{path}: cannot load ({reason(e)})") from None


#: Keys under which training scripts commonly nest the state dict in a checkpoint.
NESTED_STATE = ("state_dict", "model_state_dict", "model", "net")


def read_state_file(path: str | Path, allow_pickle: bool = False) -> StateDict:
    """The state dict in one file: safetensors, or a PyTorch checkpoint (on request; a dict
    of tensors, or one nested under ``state_dict``, ``model_state_dict``, ``model`` or
    ``net``)."""
    path = Path(path)
    if not path.is_file():
        raise GlmcError(f"{path}: no such file" + (" (a folder: read it as a model folder)"
                                                   if path.is_dir() else ""))
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    data = _read_pickle(path, allow_pickle)
    if isinstance(data, dict):  # (a state dict holds tensors: a dict under these is nested)
        nested = next((data[k] for k in NESTED_STATE if isinstance(data.get(k), dict)), None)
        data = nested if nested is not None else data
    if not isinstance(data, dict) or not data:
        raise GlmcError(f"{path}: not a state dict (a dict of tensor names to tensors)")
    return data


def _check_values(where: Path, state: Mapping[str, torch.Tensor]) -> None:
    """Every tensor floating point (an int tensor would be cast silently) and finite (the
    latter only for tensors in memory: a :class:`StoredState` checks each when it reads it,
    and its ``meta`` is checked here for the dtypes)."""
    lazy = isinstance(state, StoredState)
    for name, t in (state.meta if lazy else state).items():
        if not t.is_floating_point():
            dtype = str(t.dtype).removeprefix("torch.")
            raise GlmcError(f"{where}: tensor {name} has dtype {dtype} (shape {list(t.shape)}); "
                            "model weights must be floating point")
        if not lazy and not all_finite(t):
            raise GlmcError(f"{where}: tensor {name} contains NaN or Inf")


def _shapes(state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """What a shape check reads: the headers' meta tensors of a :class:`StoredState`."""
    return state.meta if isinstance(state, StoredState) else state


def _normalized(importer: Importer, state: StoredState | StateDict) -> StoredState | StateDict:
    """``state`` under the stock model's names (``importer.normalize_keys``), still unread
    for a :class:`StoredState` (the renaming is worked out on its meta tensors; an importer
    that makes new tensors there has the state read whole first)."""
    if not isinstance(state, StoredState):
        return importer.normalize_keys(state)
    renamed = importer.normalize_keys(dict(state.meta))
    old = {id(t): name for name, t in state.meta.items()}
    if all(id(t) in old for t in renamed.values()):
        return state.renamed({new: old[id(t)] for new, t in renamed.items()})
    return importer.normalize_keys(state.materialize())  # pragma: no cover - no such importer


def open_model(path: str | Path, *, allow_pickle: bool = False,
               dtype: torch.dtype = torch.float32) -> StoredModel:
    """A HF or glmc model folder checked (config, tensor names, shapes and dtypes, from the
    headers) without reading its tensors: see :class:`StoredModel`."""
    folder = Path(path)
    if not folder.exists():
        raise GlmcError(f"{folder}: no such file or folder")
    if not folder.is_dir():
        raise GlmcError(f"{folder}: not a model folder (expected a folder with config.json)")
    cfg_path = folder / "config.json"
    if cfg_path.is_dir():
        raise GlmcError(f"{cfg_path}: is a folder, not a file (a model folder's config.json "
                        "is a JSON file)")
    if not cfg_path.is_file():
        raise GlmcError(f"{folder}: not a model folder (config.json is missing)")
    raw = _read_json(cfg_path)
    state = stored_state(folder, allow_pickle, dtype)
    if "glmc_format" in raw:
        family = family_named(str(raw.get("family", "transformer")), str(cfg_path))
        try:
            cfg = family.config_class.from_json(raw["canonical"])
        except (KeyError, TypeError, ValueError) as e:
            raise GlmcError(f"{cfg_path}: invalid glmc config ({e})") from None
        check_shapes(folder / "model.safetensors", _shapes(state),
                     module_shapes(lambda: family.build(cfg)))
        _check_values(folder, state)
        stored = stored_dtype_of(_shapes(state))
        _record_dtype(cfg, stored)
        if not isinstance(state, StoredState):
            state = {k: v.to(dtype) for k, v in state.items()}
        return StoredModel(folder, cfg, state, stored)
    model_type = raw.get("model_type")
    if model_type is None:
        raise GlmcError(f"{cfg_path}: no 'model_type' (not a transformers or glmc config)")
    importer = importer_for(model_type, str(cfg_path))
    importer.check_config(raw, str(cfg_path))
    try:
        hf_config = importer.config_class().from_dict(raw)
    except Exception as e:  # noqa: BLE001
        raise GlmcError(f"{cfg_path}: invalid {model_type} config ({e})") from None
    state = _normalized(importer, state)
    expected = _stock_shapes(importer, raw, hf_config)
    check_shapes(folder, _shapes(state), expected, optional=importer.optional_keys(hf_config))
    _check_values(folder, state)
    stored = stored_dtype_of(_shapes(state))
    if not isinstance(state, StoredState):
        state = {k: v.to(dtype) for k, v in state.items()}
    return StoredModel(folder, hf_config, state, stored, importer)


def load_model(path: str | Path, *, allow_pickle: bool = False,
               dtype: torch.dtype = torch.float32,
               only: Collection[str] | None = None, half: bool = False,
               stream: bool = False) -> LoadedModel:
    """Read a HF or glmc model folder and bring it to canonical form (exact rewrite).

    The tensors are read one at a time from the memory-mapped safetensors files (a sharded
    checkpoint shard by shard, as its index names them), each converted to ``dtype`` where
    the rewrite uses it: the model costs its canonical form in ``dtype`` plus one tensor.
    A HF folder's ``stock_state`` reads the folder again when asked (no copy is kept).

    ``only``: the canonical tensors to make (one process's share of a matching spread over
    several, :mod:`glmc.matching.spread`); the others are placeholders of their shapes and
    dtypes on the meta device, and only the stored tensors the wanted ones are made from
    are read (:func:`glmc.io.partial.read_part`; ``()``: the model's shapes alone).

    ``half``: a model stored in :data:`~glmc.io.files.HELD_HALF` (bfloat16) keeps its
    canonical tensors in it, each made in ``dtype`` as above and rounded, :data:`PART_BYTES`
    at a time: the model costs its canonical form in bfloat16 plus one part. For a pair
    handed over to weight matching, which reads it so rounded anyway
    (:mod:`glmc.matching.held`): nothing else may read these tensors as the model's own
    (B aligned is made from the folder again).

    ``stream`` (with ``half``, for such a model): none of its tensors is read now; each is
    made and rounded as above when it is read, and never kept (:mod:`glmc.io.streamed`: the
    model costs one tensor at a time)."""
    m = open_model(path, allow_pickle=allow_pickle, dtype=dtype)
    held = half and STORED_DTYPES.get(m.dtype) == HELD_HALF
    canonical = (streamed_canonical(m, HELD_HALF) if held and stream and only is None
                 else rounded_canonical(m, HELD_HALF, only) if held
                 else canonical_of(m, only)).with_files(read_side_files(m.path))
    if m.importer is None:
        return LoadedModel(m.path, canonical)
    return LoadedModel(m.path, canonical, m.importer, m.config, m.state)


#: The stock classes' shapes by config (a pair and its output share one: building the stock
#: model, on the meta device, is a quarter of a second at GPT-2 small).
_SHAPES: dict[str, dict[str, tuple[int, ...]]] = {}


def _stock_shapes(importer: Importer, raw: dict, hf_config: Any) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of ``importer``'s stock class for the config ``raw`` (read as
    ``hf_config``), remembered by every field of the config (``architectures`` included:
    it picks the class)."""
    key = json.dumps([importer.name, raw], sort_keys=True, default=str)
    if key not in _SHAPES:
        if len(_SHAPES) >= 8:
            _SHAPES.pop(next(iter(_SHAPES)))
        _SHAPES[key] = module_shapes(lambda: importer.stock_model(hf_config))
    return _SHAPES[key]


def canonical_of(m: StoredModel, only: Collection[str] | None = None) -> CanonicalModel:
    """The canonical form of the stored model ``m`` (see :func:`load_model`, also for
    ``only``), without the files beside its weights."""
    state = m.state
    if m.importer is None:
        if only is not None:
            state = {k: state[k] if k in only else _unread(state, k) for k in state}
        elif isinstance(state, StoredState):
            state = state.materialize()
        return CanonicalModel(m.config, state)
    if only is None:
        canonical = m.importer.to_canonical(m.config, state)
    elif isinstance(state, StoredState):
        canonical = read_part(lambda s: m.importer.to_canonical(m.config, s), state,
                              state.meta, state.dtype, only)
    else:  # (a pickled state dict, in memory already)
        canonical = read_part(lambda s: m.importer.to_canonical(m.config, s), state, state,
                              None, only)
    _record_dtype(canonical.config, m.dtype)
    return canonical


def rounded_canonical(m: StoredModel, half: torch.dtype,
                      only: Collection[str] | None = None) -> CanonicalModel:
    """:func:`canonical_of` with every floating tensor rounded to ``half``, made in runs
    (:func:`part_runs`), each from the stored tensors it needs (the same tensors as a whole
    conversion's: :func:`glmc.io.partial.read_part`)."""
    skeleton = canonical_of(m, only=())
    state = _held_shapes(skeleton, half)
    names = [n for n in state if only is None or n in only]
    for run in part_runs(names, {n: frozenset([n]) for n in names}, skeleton.state,
                         PART_BYTES):
        made = canonical_of(m, only=set(run)).state
        for n in run:
            t = made.pop(n)
            state[n] = t.to(half) if t.is_floating_point() else t
    return skeleton.with_state(state)


def streamed_canonical(m: StoredModel, half: torch.dtype) -> CanonicalModel:
    """:func:`rounded_canonical`'s model with a :class:`StreamedState`: each tensor made
    (the same, bit for bit) when read, never kept."""
    skeleton = canonical_of(m, only=())
    return skeleton.with_state(StreamedState(  # type: ignore[arg-type]
        lambda name: canonical_of(m, only={name}).state[name], _held_shapes(skeleton, half),
        half))


def _held_shapes(skeleton: CanonicalModel, half: torch.dtype) -> dict[str, torch.Tensor]:
    """The skeleton's tensors as held in ``half`` (floating ones), on the meta device."""
    return {n: torch.empty(t.shape, device="meta",
                           dtype=half if t.is_floating_point() else t.dtype)
            for n, t in skeleton.state.items()}


def part_runs(names: list[str], sources: Mapping[str, frozenset[str]],
              canonical: Mapping[str, torch.Tensor], limit: int) -> Iterator[list[str]]:
    """``names`` in order, cut into runs whose ``sources`` (canonical tensors, of which
    ``canonical`` gives the shapes) take at most ``limit`` bytes in float32 (a run holds
    at least one name)."""
    run: list[str] = []
    held: set[str] = set()
    for n in names:
        more = held | sources[n]
        if run and 4 * sum(canonical[s].numel() for s in more) > limit:
            yield run
            run, more = [], set(sources[n])
        run.append(n)
        held = more
    if run:
        yield run


def _unread(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    """A placeholder on the meta device of tensor ``key`` as it would be read (from the
    header of a :class:`StoredState`: its shape, in the dtype it is read in)."""
    if isinstance(state, StoredState):
        m = state.meta[key]
        return torch.empty(m.shape, dtype=state.dtype or m.dtype, device="meta")
    return torch.empty_like(state[key], device="meta")


def _record_dtype(config: Any, stored: StateDict | str) -> None:
    """Remember in the canonical config the dtype the weights were stored in (outputs are
    written in it)."""
    if isinstance(getattr(config, "source", None), dict):
        config.source["dtype"] = stored if isinstance(stored, str) else stored_dtype_of(stored)


def read_side_files(folder: Path) -> dict[str, str]:
    """The tokenizer and generation config beside a model's weights (those present)."""
    files = {}
    for name in SIDE_FILES:
        path = folder / name
        if path.is_file():
            try:
                files[name] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise GlmcError(f"{path}: cannot read ({e})") from None
    return files


#: What the library takes for a model: one in memory, a loaded folder, or a folder's path.
ModelLike = CanonicalModel | LoadedModel | str | Path


def canonical(model: ModelLike) -> CanonicalModel:
    """The canonical form of ``model`` (a folder's path is loaded)."""
    if isinstance(model, (str, Path)):
        model = load_model(model)
    return model.canonical if isinstance(model, LoadedModel) else model


def name_of(model: Any, default: str) -> str:
    """A model's folder for messages and reports (``default`` for one made in memory)."""
    if isinstance(model, LoadedModel):
        return str(model.path)
    return str(model) if isinstance(model, (str, Path)) else default


# -- writing ------------------------------------------------------------------------------


def write_stock(folder: Path, importer: Importer, model: CanonicalModel,
                release: bool = False) -> None:
    """Write ``model`` in its stock class, in its stored dtype (raises NotRepresentable).

    ``release``: ``model``'s tensors are dropped once its stock form is made, and those of
    the stock form as they are written (see :func:`write_model`)."""
    dtype = stored_dtype(model)
    hf_config, state = importer.to_stock(model)
    if release:
        model.state = {}
    write_hf(folder, hf_config, state, dtype=dtype, release=release)


class Parts(Protocol):
    """A model written part by part, never whole in memory (:class:`glmc.io.moved.Moved`):
    as its stock class (raising NotRepresentable, nothing left written) or a glmc folder."""

    def write_stock(self, folder: Path, importer: Importer) -> None: ...

    def write_glmc(self, folder: Path) -> None: ...


def write_model(folder: Path, model: CanonicalModel, stock: bool = True,
                stock_state: tuple[Any, StateDict] | None = None,
                release: bool = False, parts: Parts | None = None) -> str:
    """Write ``model`` into an existing (temporary) folder: stock when representable, with
    the files it carries (tokenizer, generation config).

    ``stock_state``: (hf_config, stock state dict) of ``model``'s function, written as is
    instead of exporting ``model`` when ``stock`` (the vanilla average of ``glmc merge
    --align none``: the stock weights averaged, not their canonical form exported).

    ``release``: ``model`` is handed over: its tensors are dropped as soon as what is
    written no longer needs them (its state is empty afterwards), so that writing holds at
    most the model and its stock form at once, never a third copy in the stored dtype.

    ``parts``: the model's tensors are made and written part by part by ``parts``
    (``model`` gives its config, files and shapes: its tensors may be placeholders).

    Returns the format written, "hf" or "glmc", and why not stock in the second case.
    """
    for name, text in model.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    if stock and stock_state is not None:
        write_hf(folder, *stock_state, dtype=stored_dtype(model))
        return "hf"

    def as_glmc() -> None:
        if parts is not None:
            parts.write_glmc(folder)
        else:
            write_glmc(folder, model, release=release)

    if model.family.canonical_is_stock:  # (a glmc folder is the family's own format)
        as_glmc()
        return "glmc"
    arch = model.config.source.get("arch")
    if stock and arch:
        try:
            if parts is not None:
                parts.write_stock(folder, importer_for(arch))
            else:
                write_stock(folder, importer_for(arch), model, release=release)
            return "hf"
        except NotRepresentable as e:
            reason = str(e)
    else:
        reason = "stock export not requested"
    as_glmc()
    return f"glmc ({reason})"


def save_folder(out: str | Path, model: CanonicalModel, *, stock: bool = True,
                report: dict | None = None, transform: Any = None,
                stock_state: tuple[Any, StateDict] | None = None,
                certify: Callable[[Path], dict] | None = None, release: bool = False,
                started: float | None = None, phases: dict | None = None,
                parts: Parts | None = None) -> dict:
    """Write ``out`` atomically: the model (see :func:`write_model`, also for
    ``stock_state`` and ``parts``), the transform when given, and ``glmc_report.json``
    (``report`` plus the format written, the ``notes`` of :func:`written_notes`,
    ``certify(folder)``'s certificate of the folder as written, and the ``seconds`` since
    ``started``, a ``time.perf_counter()``;
    all before the folder takes its name: ``out`` never exists without its certificate).

    ``release``: ``model`` is handed over; its tensors are dropped as they are written (see
    :func:`write_model`), before ``certify`` reads the folder back, so that the two copies
    are never in memory together (the caller must hold no other reference to them).

    ``phases``: when given, the ``write`` and ``certify`` phases are added to it (see
    :func:`phase`) and it is written into the report as ``phases``.

    Returns the report written (its ``format``: see :func:`write_model`). A failed write
    (disk full) is a GlmcError and leaves any earlier ``out`` as it was.
    """
    clock = time.perf_counter()
    with output_errors(out), atomic_dir(out) as tmp:
        fmt = write_model(tmp, model, stock=stock, stock_state=stock_state, release=release,
                          parts=parts)
        if transform is not None:
            transform.save(tmp / TRANSFORM)
        report = {"format": fmt, **(report or {})}
        notes = [*report.get("notes", []), *written_notes(model, tmp, fmt)]
        if notes:
            report["notes"] = notes
        if release:
            model.state = {}
        del model
        clock = phase(phases, "write", clock)
        if certify is not None:
            report["certificate"] = certify(tmp)
            clock = phase(phases, "certify", clock)
        if phases is not None:
            report["phases"] = phases
        if started is not None:
            report["seconds"] = round(time.perf_counter() - started, 3)
        write_json(tmp / REPORT, report)
    return report


def phase(phases: dict | None, name: str, since: float) -> float:
    """Record in ``phases`` (when given) that phase ``name`` took the seconds since
    ``since`` (a ``time.perf_counter()``), with the process's peak resident memory so far
    (``peak_rss_gb``: the high-water mark at the phase's end, so the phase that raised it is
    the first to show its value); return the time now."""
    now = time.perf_counter()
    if phases is not None:
        phases[name] = {"seconds": round(now - since, 3), "peak_rss_gb": peak_rss_gb()}
    return now


def peak_rss_gb() -> float | None:
    """The process's peak resident memory so far, in GB (None where it cannot be read)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak * (1 if sys.platform == "darwin" else 1024) / 1e9, 3)


def written_notes(model: CanonicalModel, folder: Path, fmt: str) -> list[str]:
    """What a user of the folder as written should know beyond its certificate: an input
    whose stock config ties the output head to the token embedding comes back untied when
    the stock config written does not (the exact rewrite folds the final norm's scale into
    the head, which then differs from the embedding)."""
    source = getattr(model.config, "source", None)
    stock = source.get("config") if isinstance(source, dict) else None
    if fmt != "hf" or not isinstance(stock, dict) or not stock.get("tie_word_embeddings"):
        return []
    if _read_json(folder / "config.json").get("tie_word_embeddings", True):
        return []
    return ["the output unties the embedding: the input's config ties the output head to the "
            "token embedding (tie_word_embeddings), but glmc's exact rewrite folds the final "
            "norm's scale into the head, so the two differ and config.json says "
            "tie_word_embeddings: false (the same function, with the head as its own matrix)"]
