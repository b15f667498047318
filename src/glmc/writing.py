"""Writing model folders as the commands do: the model (its stock class when representable),
the files it carries, the transform, and the report with its certificate; and plain state
dicts (:func:`export_state_dict`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from glmc.errors import GlmcError
from glmc.io.atomic import atomic_path
from glmc.io.folders import (
    REPORT,
    TRAIN_FILE,
    LoadedModel,
    ModelLike,
    Parts,
    canonical,
    load_model,
    save_folder,
    write_json,
)
from glmc.io.outputs import check_output, model_bytes, output_errors
from glmc.model import CanonicalModel
from glmc.symmetry.transform import Transform, apply_axes
from glmc.tensors import StateDict
from glmc.verify import canonical_logits, certify_folder, folder_logits, random_inputs

if TYPE_CHECKING:
    from glmc.methods import Alignment


def save(model: ModelLike, path: str | Path, *, force: bool = False, stock: bool = True,
         report: dict | None = None, transform: Transform | None = None,
         stock_state: tuple[Any, StateDict] | None = None,
         certify: Callable[[Path], dict] | None = None, release: bool = False,
         started: float | None = None, phases: dict | None = None,
         parts: Parts | None = None) -> dict:
    """Write a model folder as the command line does, and return its report.

    ``model``: a merged or aligned model (CanonicalModel) or a loaded one. The folder holds
    the stock class when the model is representable (else a glmc folder, which every glmc
    command reads), the tokenizer and generation config the model carries, ``transform``
    when given, and ``glmc_report.json``: what is known of the model (see
    :func:`model_facts`) updated by ``report``, the format written, its notes, with
    ``certify`` its certificate of the folder as written (see :func:`save_certified`), and
    the ``seconds`` since ``started`` (a ``time.perf_counter()``). An existing non-empty
    ``path`` is replaced only with ``force``; the location is checked (writable, free space)
    before anything is written, and the write is atomic.

    ``release``: ``model`` (a CanonicalModel the caller no longer needs) is emptied as it is
    written (see :func:`glmc.io.folders.write_model`), before ``certify`` reads the folder
    back: the two are never in memory together. ``phases``: a dict of the phases so far
    (:func:`glmc.io.folders.phase`), to which writing and certifying are added; written
    into the report.

    ``parts``: the model is made and written part by part (:class:`glmc.io.moved.Moved`:
    B aligned from its folder), ``model`` giving its config, files and shapes.
    """
    m = canonical(model).to(torch.float32)
    check_output(path, model_bytes(m.n_params()), force=force, option="path",
                 force_flag="force=True")
    report = model_facts(model, m) | dict(report or {})
    if release and isinstance(model, CanonicalModel):
        model.state = {}  # (m holds the tensors now; save_folder drops them once written)
    del model
    return save_folder(path, m, stock=stock, report=report, transform=transform,
                       stock_state=stock_state, certify=certify, release=release,
                       started=started, phases=phases, parts=parts)


def model_facts(model: ModelLike, m: CanonicalModel) -> dict[str, Any]:
    """What a report can say of any model saved: the command that made it when its folder
    says (its ``glmc_report.json``, or ``glmc_train.json``: train), the folder it was read
    from, its description, its parameters and the files it carries; ``m`` is its canonical
    form."""
    facts: dict[str, Any] = {}
    folder = model.path if isinstance(model, LoadedModel) else model
    if isinstance(folder, (str, Path)):
        command = made_by(Path(folder))
        facts |= {"command": command} if command else {}
        facts["model"] = str(folder)
    return facts | {"description": m.config.describe(), "n_params": m.n_params(),
                    "files": sorted(m.files)}


def made_by(folder: Path) -> str | None:
    """The glmc command that wrote ``folder``, as its report or training record says."""
    if (folder / TRAIN_FILE).is_file():
        return "train"
    try:
        command = json.loads((folder / REPORT).read_text(encoding="utf-8")).get("command")
    except (OSError, ValueError, AttributeError):
        return None
    return command if isinstance(command, str) else None


def save_certified(model: CanonicalModel, path: str | Path, report: dict,
                   reference: tuple[torch.Tensor, torch.Tensor], *,
                   transform: Transform | None = None, force: bool = False,
                   stock: bool = True, release: bool = False,
                   started: float | None = None, phases: dict | None = None,
                   parts: Parts | None = None) -> dict:
    """Write ``model`` (see :func:`save`, also for ``release``, ``started``, ``phases`` and
    ``parts``)
    with ``report`` plus the certificate that the folder as written computes ``reference`` =
    (inputs, the logits it must give), taken before the folder takes its name; returns the
    report. An aligned B must give B's logits, a canonical form its input's; where the
    model's output is a vector of a space (``spec.output``: a bare encoder's hidden state),
    B's moved by ``transform``."""
    x, want = reference
    if transform is not None and model.spec.output:
        want = apply_axes(want, (None,) * (want.dim() - 1) + (model.spec.output,),
                          transform.elements)
    return save(model, path, force=force, stock=stock, report=report, transform=transform,
                certify=lambda folder: certify_folder(folder, x, want), release=release,
                started=started, phases=phases, parts=parts)


def certify_saved(path: str | Path, report: dict, reference: tuple[torch.Tensor, torch.Tensor],
                  started: float | None = None) -> dict:
    """Certify a folder written without its certificate and rewrite its report with it (and
    the ``seconds`` since ``started``, a ``time.perf_counter()``). The folder exists
    uncertified meanwhile: prefer :func:`save_certified`, whose ``release`` also keeps the
    model and its read-back copy apart in memory (as ``glmc align`` does)."""
    report = report | {"certificate": certify_folder(path, *reference)}
    if started is not None:
        report["seconds"] = round(time.perf_counter() - started, 3)
    write_report(path, report)
    return report


def write_report(folder: str | Path, report: dict) -> None:
    """Replace ``folder``'s ``glmc_report.json`` (atomically)."""
    with output_errors(folder):
        write_json(Path(folder) / REPORT, report)


def save_alignment(al: Alignment, path: str | Path, *, force: bool = False,
                   stock: bool = True) -> dict:
    """Write B aligned as ``glmc align`` does: the model folder (stock class when
    representable) with B's tokenizer and generation config, ``transform.safetensors``, and
    ``glmc_report.json`` with the certificate that the folder computes B's function. An
    existing non-empty ``path`` needs ``force``. Returns the report."""
    x = random_inputs(al.b.config)
    return save_certified(al.aligned, path, al.report(), (x, canonical_logits(al.b)(x)),
                          transform=al.transform, force=force, stock=stock)


def save_canonical(model: LoadedModel | str | Path, path: str | Path, *,
                   attention: str = "heads", stock: bool = False, force: bool = False) -> dict:
    """Write a model folder's canonical form as ``glmc canonicalize`` does (``attention``:
    ``"heads"``, or ``"circuit"`` for heads as QK/OV circuits; ``stock``: the stock class
    when representable), with the certificate that the written folder computes the input
    folder's function in its own class; returns the report."""
    if attention not in ("heads", "circuit"):
        raise GlmcError(f"attention must be 'heads' or 'circuit', got {attention!r}")
    m = model if isinstance(model, LoadedModel) else load_model(model)
    canon = m.canonical if attention == "heads" else m.canonical.family.circuit_form(m.canonical)
    x = random_inputs(canon.config)
    report = {"command": "canonicalize", "model": str(m.path), "out": str(path),
              "n_params": canon.n_params()}
    return save_certified(canon, path, report, (x, folder_logits(m)(x)), force=force,
                          stock=stock)


def export_state_dict(model: ModelLike, path: str | Path, *, layout: str = "torchvision",
                      force: bool = False) -> dict:
    """Write ``model``'s tensors as one ``.safetensors`` state dict under ``layout``'s names
    (``"canonical"``: glmc's own; ``"torchvision"`` for convnets: what a torchvision-style
    module loads), as ``glmc export`` does; atomically, refusing an existing file unless
    ``force``. Returns what was written (layout, tensors, parameters)."""
    m = canonical(model).to(torch.float32)
    if Path(path).suffix != ".safetensors":
        raise GlmcError(f"{path}: the state dict is written as safetensors (name it "
                        "*.safetensors; torch.load users: safetensors.torch.load_file)")
    state = m.state if layout == "canonical" else m.family.export_state_dict(m, layout)
    check_output(path, model_bytes(m.n_params()), force=force, option="path",
                 force_flag="force=True")
    with output_errors(path), atomic_path(Path(path)) as tmp:
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp),
                  metadata={"format": "pt"})
    return {"path": str(path), "layout": layout, "tensors": len(state),
            "n_params": m.n_params()}
