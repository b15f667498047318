"""A model folder moved by a transform, written part by part: never whole in memory.

``glmc align`` hands the pair over to weight matching, which frees the models as it goes;
B aligned is then made again from B's folder. Made whole, it would cost a float32 copy of B
(on the rank that writes, under torchrun, beside nothing else that large). Written in parts
it costs one part: the output's tensors are taken a few at a time (:data:`PART_BYTES` of
the canonical tensors they are made from), each part made from the stored tensors it needs
(:func:`glmc.io.partial.read_part`), moved by the transform, turned into the output's
tensors (the stock class's, or a glmc folder's canonical ones) and written into one
safetensors file whose header was written first (:class:`glmc.io.files.TensorFile`). Which
canonical tensors an output tensor is made from is found as ``read_part`` finds which stored
ones a canonical tensor is made from: the stock export runs over placeholders first.

The tensors written are those of the whole path, bit for bit (the same operations on the same
values). Where that cannot be done part by part (a stock export that reads a value of a
tensor it was not given, a B embedded into A's widths), the model is made whole instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from glmc.errors import GlmcError
from glmc.families.importers import Importer, NotRepresentable
from glmc.io.files import (
    WEIGHTS,
    TensorFile,
    stored_dtype,
    write_glmc,
    write_glmc_config,
    write_hf_config,
)
from glmc.io.folders import (
    PART_BYTES,
    StoredModel,
    canonical_of,
    folder_stamp,
    open_model,
    part_runs,
    read_side_files,
    write_stock,
)
from glmc.io.partial import Absent, Unreadable, placeholder
from glmc.model import CanonicalModel, fitted
from glmc.symmetry.transform import Transform, apply_axes
from glmc.tensors import StateDict

__all__ = ["PART_BYTES", "Moved"]



@dataclass
class Moved:
    """The model stored in ``folder`` moved by ``transform``, as a model of ``like``'s
    config (the model as matched: its config and the files it carries; its state may be
    empty). ``stamp``: the folder's :func:`~glmc.io.folders.folder_stamp` when it was first
    read (a folder rewritten since is an error: the transform is another model's)."""

    folder: Path
    like: CanonicalModel
    transform: Transform
    stamp: tuple = ()
    allow_pickle: bool = False
    #: The folder of the model B was aligned to: a narrower B's free entries take its values
    #: (``CanonicalModel.transformed``'s ``like``).
    fill_from: Path | None = None
    _stored: StoredModel | None = field(default=None, init=False, repr=False)
    _skeleton: CanonicalModel | None = field(default=None, init=False, repr=False)

    def stored(self) -> StoredModel:
        """The folder opened (headers only), checked to be the one matched."""
        if self.stamp and folder_stamp(self.folder) != self.stamp:
            raise GlmcError(f"{self.folder}: changed on disk since it was loaded; align again")
        if self._stored is None:
            self._stored = open_model(self.folder, allow_pickle=self.allow_pickle)
        return self._stored

    def skeleton(self) -> CanonicalModel | None:
        """The moved model's config, files and shapes, every tensor a placeholder on the
        meta device (nothing read); None when B is not of ``like``'s shapes (a narrower B,
        which its family embeds into A's widths as a whole: see :meth:`whole`)."""
        kept = self._kept()
        # (a model of its own: a writer may empty its state)
        return None if kept is None else kept.with_state(dict(kept.state))

    def _kept(self) -> CanonicalModel | None:
        """The skeleton, made once and kept (with its spec)."""
        if self._skeleton is None:
            b = canonical_of(self.stored(), only=())
            if fitted(self.like, b) is b:
                self._skeleton = self.like.with_state(b.state)
        return self._skeleton

    def whole(self) -> CanonicalModel:
        """The moved model in memory: B's folder read again (tensor by tensor, as loading
        reads it) and moved one tensor at a time, so that it costs one model and one tensor;
        B embedded into ``like``'s widths first where it is narrower."""
        b = canonical_of(self.stored()).with_files(read_side_files(self.folder))
        b = fitted(self.like, b, str(self.folder))
        if b.free and self.fill_from is not None:  # (A's tensors that fill B's, only)
            a = canonical_of(open_model(self.fill_from, allow_pickle=self.allow_pickle),
                             only=set(b.free))
            return self.like.with_state(b.transformed(self.transform, like=a).state)
        return self.like.with_state(self.transform.apply(b.spec, b.state, consume=True))

    def part(self, names: Collection[str]) -> StateDict:
        """The canonical tensors ``names`` moved, made from the stored tensors they need."""
        m = canonical_of(self.stored(), only=set(names))
        spec = self._shaped().spec
        return {n: apply_axes(m.state[n], spec.axes.get(n) or (), self.transform.elements)
                for n in names}

    def write_stock(self, folder: Path, importer: Importer) -> None:
        """Write the moved model into ``folder`` as its stock class, part by part (raises
        NotRepresentable, with nothing left in ``folder``): each part's stock tensors
        exported from the moved canonical tensors they need. Where the export reads a value
        of a tensor it was not given, the model is made whole and written so instead."""
        skeleton = self._shaped()
        unread = {n: placeholder(t, [n]) for n, t in skeleton.state.items()}
        try:
            hf_config, out = importer.to_stock(skeleton.with_state(dict(unread)))
        except Unreadable:
            out = None
        if out is None or not self._writable(out):
            write_stock(folder, importer, self.whole(), release=True)
            return
        sources = {n: t.sources if isinstance(t, Absent) else frozenset()
                   for n, t in out.items()}

        def export(needed: set[str]) -> StateDict:
            return importer.to_stock(skeleton.with_state({**unread, **self.part(needed)}))[1]

        try:
            self._write(folder, out, sources, export)
        except NotRepresentable:  # (a writer found uncentred once read)
            (folder / WEIGHTS).unlink(missing_ok=True)
            raise
        write_hf_config(folder, hf_config, stored_dtype(skeleton))

    def write_glmc(self, folder: Path) -> None:
        """Write the moved model into ``folder`` as a glmc folder (canonical tensors), part
        by part."""
        skeleton = self._shaped()
        if not self._writable(skeleton.state):
            write_glmc(folder, self.whole(), release=True)
            return
        names = sorted(skeleton.state)
        self._write(folder, {n: skeleton.state[n] for n in names},
                    {n: frozenset([n]) for n in names}, self.part)
        write_glmc_config(folder, skeleton)

    def _writable(self, state: dict[str, torch.Tensor]) -> bool:
        """Whether the tensors of ``state`` can be written as they are made (else: whole,
        by safetensors' own writer: a big-endian machine, a dtype it names otherwise)."""
        return TensorFile.writable(d for _, _, d in _layout(state, stored_dtype(self._shaped())))

    def _write(self, folder: Path, shapes: dict[str, torch.Tensor],
               sources: dict[str, frozenset[str]],
               make: Callable[[set[str]], StateDict]) -> None:
        """The weights file: the tensors of ``shapes`` (placeholders, in the file's order),
        run by run (:func:`_parts`), each run's made by ``make`` from the canonical tensors
        ``sources`` names, in the stored dtype."""
        dtype = stored_dtype(self._shaped())
        with TensorFile(folder / WEIGHTS, _layout(shapes, dtype), {"format": "pt"}) as f:
            for names in _parts(list(shapes), sources, self._shaped().state):
                made = make(set().union(*(sources[n] for n in names)))
                for n in names:
                    f.write(n, _as(made.pop(n), dtype))
                del made

    def _shaped(self) -> CanonicalModel:
        """The kept skeleton, which the writers need."""
        kept = self._kept()
        if kept is None:
            raise GlmcError(f"{self.folder}: B is not of the matched model's shapes: write "
                            "it whole (Moved.whole)")
        return kept


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as written: floating tensors in the stored ``dtype``."""
    return t.to(dtype) if t.is_floating_point() else t


def _layout(state: dict[str, torch.Tensor], dtype: torch.dtype,
            ) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The file's header: each tensor's name, shape and dtype as written, in order."""
    return [(n, tuple(t.shape), dtype if t.is_floating_point() else t.dtype)
            for n, t in state.items()]


def _parts(names: list[str], sources: dict[str, frozenset[str]],
           canonical: dict[str, Any]) -> Iterator[list[str]]:
    """``names`` in order, cut into runs whose canonical sources take at most
    :data:`PART_BYTES` in float32 (:func:`~glmc.io.folders.part_runs`)."""
    return part_runs(names, sources, canonical, PART_BYTES)
