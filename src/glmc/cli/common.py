"""Options and output helpers shared by commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    console: Console  # rich's console on stderr, made on first use (see __getattr__)


def __getattr__(name: str) -> Any:
    """``console``, made when a command first uses it: importing rich slows down ``--help``."""
    if name != "console":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    globals()["console"] = Console(stderr=True)
    return globals()["console"]


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def nonempty_path(value: str) -> str:
    """An argparse ``type``: a path, refused when empty (``-o ""`` names no place; the current
    folder it would resolve to is no output)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty path")
    return value


def add_out(p: argparse.ArgumentParser, help: str, **kwargs: Any) -> None:
    """-o/--out (a model folder, replaced atomically) and --force."""
    p.add_argument("-o", "--out", required=True, metavar="OUT", type=nonempty_path, help=help,
                   **kwargs)
    p.add_argument("--force", action="store_true",
                   help="replace an existing OUT (without it, an OUT that exists and is not "
                   "empty is refused before any work)")


def add_allow_pickle(p: argparse.ArgumentParser,
                     what: str = "also read pytorch_model.bin") -> None:
    p.add_argument("--allow-pickle", action="store_true",
                   help=f"{what} (torch.load with weights_only=True)")


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_notes(report: dict) -> None:
    """The report's notes on stdout, one ``note:`` line each (under --json they are in the
    JSON)."""
    for note in report.get("notes", []):
        print(f"note: {note}")


def print_warnings(warnings: list[str]) -> None:
    """Each warning on stderr, one line each (not wrapped at the terminal's width; a path's
    brackets are not markup); a :class:`~glmc.errors.Note` as ``note:``."""
    from rich.markup import escape

    from glmc.cli.common import console  # (made on first use, see __getattr__)
    from glmc.errors import Note

    for w in warnings:
        kind = "note:" if isinstance(w, Note) else "[yellow]warning:[/yellow]"
        console.print(f"{kind} {escape(w)}", soft_wrap=True)
