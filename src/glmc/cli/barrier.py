"""glmc barrier (not implemented yet)."""

from __future__ import annotations

import argparse

from glmc.cli.main import add_command
from glmc.errors import GlmcError


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "barrier", "Not implemented yet.", "glmc barrier --help")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise GlmcError("glmc barrier is not implemented yet")
