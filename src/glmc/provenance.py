"""What a figure comes from: the code (glmc's version and, in a git checkout, its commit), the
machine and the command, recorded beside every result glmc writes for people to quote."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from glmc._version import __version__

_SOURCE = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    """``git args`` run in glmc's own source folder; None outside a checkout or without git."""
    try:
        run = subprocess.run(["git", *args], cwd=_SOURCE, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def cpu() -> str:
    """The CPU's model name and its widest vector units (machines of one core count differ
    several-fold in float32 throughput, and a model name may not tell them apart)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    units = [f for f in ("avx2", "avx512f", "amx_tile") if f in flags]
    return f"{fields.get('model name', '?')} ({', '.join(units) or 'no AVX2'})"


def provenance() -> dict[str, Any]:
    """``{"glmc", "commit", "dirty", "date", "machine", "command"}``: commit and dirty are None
    when glmc does not run from a git checkout; dirty says whether src/ had changes."""
    top = _git("rev-parse", "--show-toplevel")
    # (an installed glmc may sit inside someone else's repository, e.g. a venv in a project)
    ours = top is not None and (Path(top) / "src" / "glmc").resolve() == _SOURCE
    commit = _git("rev-parse", "--short", "HEAD") if ours else None
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".") if commit else None
    torch = sys.modules.get("torch")
    threads = f", {torch.get_num_threads()} threads" if torch is not None else ""
    return {"glmc": __version__, "commit": commit,
            "dirty": None if status is None else bool(status),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{cpu()}, {os.cpu_count()} cpus{threads}",
            "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}
