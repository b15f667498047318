"""Options and output helpers shared by commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console

console = Console(stderr=True)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def add_allow_pickle(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-pickle", action="store_true",
                   help="also read pytorch_model.bin (torch.load with weights_only=True)")


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")
