"""Certificates of function preservation: max |Δ logits| on random inputs.

Every certificate is computed in float64 without a float64 copy of the model: the module is
built with its parameters on the meta device, and each of its blocks gets its weights, read
from the state (in memory, or from the folder's memory-mapped files) and cast to float64,
only while it runs (:func:`streamed_logits`). The weights' values are those stored (a cast
to float64 is exact) and every operation runs in float64 as in a float64 copy of the whole
module: the logits are the same numbers, and the memory is one block's weights in float64.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glmc.errors import GlmcError
from glmc.families.registry import family_of
from glmc.io.folders import LoadedModel, StoredModel, StoredState
from glmc.model import CanonicalModel
from glmc.tasks import task_of

Logits = Callable[[torch.Tensor], torch.Tensor]

#: The most parameters a block cast to float64 for a certificate may hold before its own
#: children are cast one by one instead (2**26: 512 MiB in float64); a module that holds
#: larger tensors itself (an embedding table) is cast whole.
BLOCK_PARAMS = 1 << 26


def random_inputs(cfg: Any, n: int = 4, seq: int = 32, seed: int = 0,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Inputs of the model's task drawn with ``seed``: token ids (n, min(seq, context)) or
    images (n, C, H, W)."""
    return task_of(cfg).random_inputs(cfg, n, seq, seed, dtype)


def canonical_logits(model: CanonicalModel, dtype: torch.dtype = torch.float64,
                     block_params: int = BLOCK_PARAMS) -> Logits:
    """Logits of a canonical model in ``dtype``, each block's weights cast only while it runs
    (see :func:`streamed_logits`): comparing two large models never holds either in float64."""
    return streamed_logits(lambda: model.family.build(model.config), model.state,
                           lambda module, x: module(x), dtype, block_params=block_params)


def folder_logits(m: LoadedModel | StoredModel, dtype: torch.dtype = torch.float64,
                  block_params: int = BLOCK_PARAMS) -> Logits:
    """Logits of a loaded folder computed by its own class (the stock one for HF folders),
    one block at a time in ``dtype`` (see :func:`streamed_logits`; a HF folder's weights
    are read from its files as they are needed)."""
    if isinstance(m, StoredModel):
        if m.importer is None:
            config = m.config
            return streamed_logits(lambda: family_of(config).build(config), m.state,
                                   lambda module, x: module(x), dtype,
                                   block_params=block_params, where=m.path)
        importer, hf_config, state = m.importer, m.config, m.state
    elif m.importer is None:
        return canonical_logits(m.canonical, dtype, block_params)
    else:
        importer, hf_config, state = m.importer, m.hf_config, m.stock_state
        if state is None:
            raise GlmcError(f"{m.path}: loaded without its stock weights (they were dropped)")
    return streamed_logits(lambda: importer.stock_model(hf_config), state,
                           importer.stock_logits, dtype, block_params=block_params,
                           where=m.path)


def streamed_logits(build: Callable[[], nn.Module], state: Mapping[str, torch.Tensor],
                    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                    dtype: torch.dtype = torch.float64, *, block_params: int = BLOCK_PARAMS,
                    where: Any = "the model") -> Logits:
    """Logits ``forward(module, x)`` of the module ``build`` makes, with the weights of
    ``state`` in ``dtype``, holding only one block's weights at a time.

    The module is built with its parameters on the meta device (its buffers as built, then
    those ``state`` holds), in ``dtype``. Its blocks are the largest modules with a forward
    of at most ``block_params`` parameters (a module holding tensors of its own is one
    block, whatever its size; parameters of a module without a forward of its own are read
    once, for the whole call). A forward pre-hook gives a block its tensors read from
    ``state`` in ``dtype`` and a forward hook takes them back, so a parameter used outside
    its block's forward is a meta tensor and fails loudly rather than silently. A tied
    parameter is read under any of its names that ``state`` holds.

    The values are the stored ones (a cast to float64 is exact) and the operations those of
    the module in ``dtype``: the logits are a float64 copy's, bit for bit.
    """

    def run(x: torch.Tensor) -> torch.Tensor:
        module = _on_meta(build).to(dtype)
        with _streaming(module, state, dtype, block_params, where), torch.no_grad():
            return forward(module, x if not x.is_floating_point() else x.to(dtype))

    return run


def _on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` with every parameter on the meta device as it is registered (no memory,
    no initialisation work), its buffers as built (rotary frequencies, masks)."""
    register = nn.Module.register_parameter

    def on_meta(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(self, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        return build()
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _read(state: Mapping[str, torch.Tensor], key: str, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(state, StoredState):
        return state.read(key, dtype)
    return state[key].to(dtype)


def _blocks(module: nn.Module, limit: int) -> tuple[list[nn.Module], list[nn.Module]]:
    """The modules cast one at a time while they run, and those whose own parameters are
    read for the whole call (see :func:`streamed_logits`)."""
    blocks: list[nn.Module] = []
    whole: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        size = sum(p.numel() for p in m.parameters())
        if size == 0:
            return
        own = any(p is not None for p in m._parameters.values())
        children = [c for c in m.children() if any(True for _ in c.parameters())]
        if type(m).forward is not nn.Module.forward and (size <= limit or own or not children):
            blocks.append(m)
            return
        if own:
            whole.append(m)
        for c in children:
            visit(c)

    visit(module)
    return blocks, whole


@contextlib.contextmanager
def _streaming(module: nn.Module, state: Mapping[str, torch.Tensor], dtype: torch.dtype,
               limit: int, where: Any) -> Iterator[None]:
    """``module``'s buffers from ``state``, and hooks that give each block its weights while
    it runs (see :func:`streamed_logits`); everything taken back on the way out."""
    names: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    path = {id(m): prefix for prefix, m in module.named_modules(remove_duplicate=False)}

    def key(owner: nn.Module, name: str, p: nn.Parameter) -> str:
        full = f"{path[id(owner)]}.{name}".lstrip(".")
        if full in state:
            return full
        key = next((n for n in names.get(id(p), ()) if n in state), None)
        if key is None:
            raise GlmcError(f"{where}: tensor {full} (shape {list(p.shape)}) is missing")
        return key

    def entries(m: nn.Module, recurse: bool) -> list[tuple[nn.Module, str, str]]:
        owners = m.modules() if recurse else [m]
        return [(o, n, key(o, n, p)) for o in owners for n, p in o._parameters.items()
                if p is not None]

    for owner_path, owner in module.named_modules(remove_duplicate=False):
        for name, buf in owner._buffers.items():
            full = f"{owner_path}.{name}".lstrip(".")
            if buf is not None and full in state:
                owner._buffers[name] = _read(state, full, buf.dtype if not
                                             buf.is_floating_point() else dtype)
    blocks, whole = _blocks(module, limit)
    per_block = [entries(block, recurse=True) for block in blocks]
    fixed = [e for m in whole for e in entries(m, recurse=False)]
    meta = {(id(o), n): o._parameters[n] for items in (*per_block, fixed) for o, n, _ in items}

    def give(items: list[tuple[nn.Module, str, str]]) -> None:
        for owner, name, k in items:
            owner._parameters[name] = nn.Parameter(_read(state, k, dtype), requires_grad=False)

    def take(items: list[tuple[nn.Module, str, str]]) -> None:
        for owner, name, _ in items:
            owner._parameters[name] = meta[(id(owner), name)]

    handles = []
    for block, items in zip(blocks, per_block, strict=True):
        handles.append(block.register_forward_pre_hook(
            lambda _m, _args, items=items: give(items)))
        handles.append(block.register_forward_hook(
            lambda _m, _args, _out, items=items: take(items)))
    try:
        give(fixed)
        yield
    finally:
        for h in handles:
            h.remove()
        for items in (*per_block, fixed):
            take(items)


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
    its own class, evaluated in float64 one block at a time from its files) and the
    reference logits ``want`` on inputs ``x``, as a report entry; the tolerance follows the
    stored dtype (:data:`REL_TOL`)."""
    from glmc.io.folders import open_model

    stored = open_model(folder)
    cert = compare(want, folder_logits(stored)(x), rel_tol=REL_TOL.get(stored.dtype, 1e-4))
    return {**cert.to_json(), "stored_dtype": stored.dtype}


def same_interface(a: Any, b: Any, where: str) -> None:
    """Raise unless models a and b take the same inputs and give logits of the same shape."""
    if type(a) is not type(b):
        raise GlmcError(f"{where}: models of different families ({type(a).family} vs "
                        f"{type(b).family})")
    task_of(a).same_interface(a, b, where)
