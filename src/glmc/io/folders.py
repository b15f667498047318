"""Model folders: Hugging Face folders (config.json + safetensors) and glmc folders.

A glmc folder holds ``config.json`` with ``{"glmc_format": 1, "family": ..., "canonical":
{...}}`` and ``model.safetensors`` in canonical parameter names: the format of families
without a stock class, and of models with no exact stock equivalent (circuit-form attention,
a residual map that moves the all-ones direction). A folder without ``family`` is a
transformer's (written before families existed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from glmc.errors import GlmcError, reason
from glmc.families.base import check_shapes, module_shapes
from glmc.families.importers import Importer, NotRepresentable
from glmc.families.registry import family_named, importer_for
from glmc.io.atomic import atomic_dir
from glmc.io.files import (
    stored_dtype,
    stored_dtype_of,
    write_glmc,
    write_hf,
    write_json,
)
from glmc.io.outputs import output_errors
from glmc.model import CanonicalModel
from glmc.tensors import StateDict

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
    """A model read from a folder, in canonical form (and in stock form for HF folders)."""

    path: Path
    canonical: CanonicalModel
    importer: Importer | None = None  # None for a glmc folder
    hf_config: Any = None
    stock_state: StateDict | None = None

    @property
    def kind(self) -> str:
        return "glmc" if self.importer is None else "hf"

    def stock_module(self, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
        assert self.importer is not None and self.stock_state is not None
        m = self.importer.stock_model(self.hf_config).to(dtype)
        m.load_state_dict(self.stock_state, strict=False)  # (copy_ casts: no float64 copy)
        return m


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


def _read_safetensors(path: Path) -> StateDict:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise GlmcError(f"{path}: cannot read safetensors file ({e})") from None


def read_weights(folder: Path, allow_pickle: bool = False) -> StateDict:
    """The state dict stored in ``folder`` (single or sharded safetensors; pickle on request)."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        files = sorted(set(_read_json(index).get("weight_map", {}).values()))
        state: StateDict = {}
        for f in files:
            if not (folder / f).is_file():
                raise GlmcError(f"{folder / f}: shard named in {index.name} is missing")
            state |= _read_safetensors(folder / f)
        return state
    pickled = folder / "pytorch_model.bin"
    if pickled.is_file():
        return _read_pickle(pickled, allow_pickle)
    raise GlmcError(f"{folder}: no model.safetensors (or sharded index) in the folder")


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


def _check_values(where: Path, state: StateDict) -> None:
    """Every tensor floating point (an int tensor would be cast silently) and finite."""
    for name, t in state.items():
        if not t.is_floating_point():
            dtype = str(t.dtype).removeprefix("torch.")
            raise GlmcError(f"{where}: tensor {name} has dtype {dtype} (shape {list(t.shape)}); "
                            "model weights must be floating point")
        if not bool(torch.isfinite(t).all()):
            raise GlmcError(f"{where}: tensor {name} contains NaN or Inf")


def load_model(path: str | Path, *, allow_pickle: bool = False,
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Read a HF or glmc model folder and bring it to canonical form (exact rewrite)."""
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
    state = read_weights(folder, allow_pickle)
    if "glmc_format" in raw:
        family = family_named(str(raw.get("family", "transformer")), str(cfg_path))
        try:
            cfg = family.config_class.from_json(raw["canonical"])
        except (KeyError, TypeError, ValueError) as e:
            raise GlmcError(f"{cfg_path}: invalid glmc config ({e})") from None
        check_shapes(folder / "model.safetensors", state, module_shapes(lambda: family.build(cfg)))
        _check_values(folder, state)
        _record_dtype(cfg, state)
        state = {k: v.to(dtype) for k, v in state.items()}
        return LoadedModel(folder, CanonicalModel(cfg, state, read_side_files(folder)))
    model_type = raw.get("model_type")
    if model_type is None:
        raise GlmcError(f"{cfg_path}: no 'model_type' (not a transformers or glmc config)")
    importer = importer_for(model_type, str(cfg_path))
    importer.check_config(raw, str(cfg_path))
    try:
        hf_config = importer.config_class().from_dict(raw)
    except Exception as e:  # noqa: BLE001
        raise GlmcError(f"{cfg_path}: invalid {model_type} config ({e})") from None
    state = importer.normalize_keys(state)
    expected = module_shapes(lambda: importer.stock_model(hf_config))
    check_shapes(folder, state, expected, optional=importer.optional_keys(hf_config))
    _check_values(folder, state)
    stored = stored_dtype_of(state)
    state = {k: v.to(dtype) for k, v in state.items()}
    canonical = importer.to_canonical(hf_config, state).with_files(read_side_files(folder))
    _record_dtype(canonical.config, stored)
    return LoadedModel(folder, canonical, importer, hf_config, state)


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


def write_stock(folder: Path, importer: Importer, model: CanonicalModel) -> None:
    """Write ``model`` in its stock class, in its stored dtype (raises NotRepresentable)."""
    write_hf(folder, *importer.to_stock(model), dtype=stored_dtype(model))


def write_model(folder: Path, model: CanonicalModel, stock: bool = True,
                stock_state: tuple[Any, StateDict] | None = None) -> str:
    """Write ``model`` into an existing (temporary) folder: stock when representable, with
    the files it carries (tokenizer, generation config).

    ``stock_state``: (hf_config, stock state dict) of ``model``'s function, written as is
    instead of exporting ``model`` when ``stock`` (the vanilla average of ``glmc merge
    --align none``: the stock weights averaged, not their canonical form exported).

    Returns the format written, "hf" or "glmc", and why not stock in the second case.
    """
    for name, text in model.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    if stock and stock_state is not None:
        write_hf(folder, *stock_state, dtype=stored_dtype(model))
        return "hf"
    if model.family.canonical_is_stock:  # (a glmc folder is the family's own format)
        write_glmc(folder, model)
        return "glmc"
    arch = model.config.source.get("arch")
    if stock and arch:
        try:
            write_stock(folder, importer_for(arch), model)
            return "hf"
        except NotRepresentable as e:
            reason = str(e)
    else:
        reason = "stock export not requested"
    write_glmc(folder, model)
    return f"glmc ({reason})"


def save_folder(out: str | Path, model: CanonicalModel, *, stock: bool = True,
                report: dict | None = None, transform: Any = None,
                stock_state: tuple[Any, StateDict] | None = None,
                certify: Callable[[Path], dict] | None = None, release: bool = False,
                started: float | None = None) -> dict:
    """Write ``out`` atomically: the model (see :func:`write_model`, also for
    ``stock_state``), the transform when given, and ``glmc_report.json`` (``report`` plus the
    format written, the ``notes`` of :func:`written_notes`, ``certify(folder)``'s certificate
    of the folder as written, and the ``seconds`` since ``started``, a ``time.perf_counter()``;
    all before the folder takes its name: ``out`` never exists without its certificate).

    ``release``: ``model`` is handed over; its tensors are dropped once written, before
    ``certify`` reads the folder back, so that the two copies are never in memory together
    (the caller must hold no other reference to them).

    Returns the report written (its ``format``: see :func:`write_model`). A failed write
    (disk full) is a GlmcError and leaves any earlier ``out`` as it was.
    """
    with output_errors(out), atomic_dir(out) as tmp:
        fmt = write_model(tmp, model, stock=stock, stock_state=stock_state)
        if transform is not None:
            transform.save(tmp / TRANSFORM)
        report = {"format": fmt, **(report or {})}
        notes = [*report.get("notes", []), *written_notes(model, tmp, fmt)]
        if notes:
            report["notes"] = notes
        if release:
            model.state = {}
        del model
        if certify is not None:
            report["certificate"] = certify(tmp)
        if started is not None:
            report["seconds"] = round(time.perf_counter() - started, 3)
        write_json(tmp / REPORT, report)
    return report


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
