"""Atomic writes: nothing is ever half-written (write to a temp name, then rename)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary file path beside ``path``; rename it over ``path`` on success, with
    ordinary permissions (see :func:`ordinary_permissions`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        ordinary_permissions(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ordinary_permissions(path: Path) -> None:
    """Give ``path`` (and, for a folder, everything in it) the permissions of a file or
    folder made anew under the umask (0644 and 0755 under 022): mkstemp and mkdtemp make them
    private, and so do some writers (safetensors writes 0600)."""
    umask = _umask()
    for p in (path, *path.rglob("*")) if path.is_dir() else (path,):
        if not p.is_symlink():
            p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (setting it to read
    it would, for a moment, let another thread create a world-writable file)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o077)  # (the moment's files private, not world-writable)
    os.umask(umask)
    return umask


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8, atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_dir(path: str | Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; it replaces ``path`` only on success, with
    ordinary permissions throughout (see :func:`ordinary_permissions`).

    An interrupted run leaves no partial output folder (only a hidden temp folder that is
    removed on the way out).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        ordinary_permissions(tmp)
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            old = path.with_name(f".{path.name}.old")
            _remove(old)
            os.replace(path, old)
            os.replace(tmp, path)
            _remove(old)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove(path: Path) -> None:
    """Remove a folder or a file (what ``path`` was may be either), if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()
