"""Tensors kept in files instead of memory: the residual cache of a pair too large to hold it.

Weight matching's residual cache (:class:`glmc.matching.residual.ResidualCache`) keeps a
d × d cross-correlation for every tensor the residual map acts on once: at Llama-2-7B's
widths, 96 of 4096² in float32, 6.4 GB beside the 13.5 GB of B. Each is read when its unit's
assignment changes and twice per iteration by the residual step, which sums them: a mapping
that writes each to its own file and reads it back when asked holds one at a time, for a
read from the page cache (about 0.03 s for 67 MB) where a recomputation would be a product of
the tensor's full size. The values are the same bit for bit, so the matching is too.

The files live in a temporary folder (``.glmc-spill-*``) under the folder given (``glmc
align`` uses OUT's parent: the disk the output goes to, not a memory-backed /tmp), removed
when the mapping is closed or collected, or when the process exits.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import torch

from glmc.errors import GlmcError

__all__ = ["SpilledTensors"]


class SpilledTensors(MutableMapping[str, torch.Tensor]):
    """A mapping of names to CPU tensors, each stored in a file under ``root`` (a temporary
    folder made there) and read back, as a fresh tensor, on every access."""

    def __init__(self, root: str | Path) -> None:
        try:
            self._dir = tempfile.TemporaryDirectory(prefix=".glmc-spill-", dir=root)
        except OSError as e:
            raise GlmcError(f"{root}: cannot make a folder for the residual cache ({e})"
                            ) from None
        self.folder = Path(self._dir.name)
        self._meta: dict[str, tuple[Path, torch.Size, torch.dtype]] = {}
        self._files = 0  # (files made so far: each new name gets its own)

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if key in self._meta:
            path = self._meta[key][0]
        else:
            path, self._files = self.folder / f"{self._files}.bin", self._files + 1
        flat = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        part = path.with_suffix(".part")  # (a unit's entry is read only by its own step)
        try:
            with open(part, "wb") as f:
                f.write(memoryview(flat.numpy()))
            os.replace(part, path)
        except OSError as e:
            raise GlmcError(f"{path}: cannot write the residual cache ({e})") from None
        self._meta[key] = (path, value.shape, value.dtype)

    def __getitem__(self, key: str) -> torch.Tensor:
        path, shape, dtype = self._meta[key]
        out = torch.empty(shape, dtype=dtype)
        with open(path, "rb") as f:
            if f.readinto(memoryview(out.reshape(-1).view(torch.uint8).numpy())) != (
                    out.numel() * out.element_size()):
                raise GlmcError(f"{path}: the residual cache's file is shorter than written")
        return out

    def __delitem__(self, key: str) -> None:
        path, _, _ = self._meta.pop(key)
        path.unlink(missing_ok=True)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._meta))

    def __len__(self) -> int:
        return len(self._meta)

    def close(self) -> None:
        """Remove the files (the mapping is empty afterwards)."""
        self._meta.clear()
        self._dir.cleanup()
