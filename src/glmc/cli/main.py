"""The ``glmc`` command line: one module per command, each exposing ``register``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from glmc._version import __version__
from glmc.errors import GlmcError

COMMANDS = ("demo", "train", "import", "export", "barrier", "align", "merge", "verify",
            "canonicalize")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's line breaks (the example) and appends "(default: X)" to an option's
    help only when X says something: not for None, a flag's False, or a suppressed default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not action.option_strings or action.nargs == 0:
            return text  # positionals, and flags (store_true/false: the default is the absence)
        if action.default is None or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """A usage error is one line, as every other error (``glmc merge: error: argument
    --align: invalid choice: ...``), pointing to --help rather than printing the usage."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    import importlib
    import keyword

    parser = Parser(
        prog="glmc",
        description="Align transformers modulo their weight symmetries, measure loss barriers "
        "on the straight line between them, and merge them.",
        epilog="Run `glmc COMMAND --help` for a command's options and an example.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        # (a command named by a Python keyword lives in NAME_.py)
        module = importlib.import_module(f"glmc.cli.{name}" + "_" * keyword.iskeyword(name))
        module.register(sub)
    return parser


def add_command(sub, name: str, help: str, example: str) -> argparse.ArgumentParser:
    """A subcommand parser whose --help ends with an example."""
    return sub.add_parser(name, help=help, description=help,
                          epilog=f"example:\n  {example}", formatter_class=HelpFormatter)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # (--help and --version exit here, without torch)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # (to print a command to rerun)
    try:
        check = getattr(args, "check", None)
        if check is not None:  # (torch-free checks of the values: a typo is refused at once)
            check(args)
        _quiet_transformers()
        return int(args.func(args) or 0)
    except GlmcError as e:  # (one line, whatever the message holds)
        if getattr(e, "reported_elsewhere", False):  # (a rank other than 0 under torchrun:
            return 2  # rank 0 says it, once)
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"glmc {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glmc {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout.flush()


def _quiet_transformers() -> None:
    """transformers' warnings off (the commands say what matters in their own words)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    transformers.logging.set_verbosity_error()


def entry() -> None:  # pragma: no cover
    code = main()
    # The work is done and said: a Ctrl-C while the interpreter exits (torch's exit
    # handlers, say) ends it at once with the command's status instead of a traceback.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(code))
    sys.exit(code)
