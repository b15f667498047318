"""The ``glmc`` command line: one module per command, each exposing ``register``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from glmc.errors import GlmcError

COMMANDS = ("demo", "train", "barrier", "align", "merge", "verify", "canonicalize")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="glmc",
        description="Align transformers modulo their weight symmetries, measure loss barriers "
        "on the straight line between them, and merge them.",
        epilog="Run `glmc COMMAND --help` for a command's options and an example.",
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"glmc.cli.{name}")
        module.register(sub)
    return parser


def add_command(sub, name: str, help: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser whose --help ends with an example."""
    return sub.add_parser(name, help=help, description=help,
                          epilog=f"example:\n  {example}", formatter_class=HelpFormatter)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    transformers.logging.set_verbosity_error()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GlmcError as e:
        print(f"glmc {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glmc {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout.flush()


def entry() -> None:  # pragma: no cover
    sys.exit(main())
