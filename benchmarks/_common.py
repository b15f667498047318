"""What every benchmark script shares: the machine it ran on, writing its JSON, and replacing
its own section of benchmarks/README.md (so that every figure there comes from a script)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmc.provenance import cpu

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE / "README.md"


def cpu_model() -> str:
    """The CPU's model name and its widest vector units (glmc.provenance.cpu)."""
    return cpu()


def machine(**extra: Any) -> dict[str, Any]:
    """The machine, interpreter and torch build a figure was measured with."""
    info = {"platform": platform.platform(), "processor": platform.processor(),
            "cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "executable": sys.executable}
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info |= {"torch": torch.__version__, "threads": torch.get_num_threads()}
    return info | extra


def provenance(**extra: Any) -> dict[str, Any]:
    """What a row of results comes from: the commit (and whether the tree had changes), the
    date, the machine and the thread count (stamped on every row a table shows)."""
    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True)
        return run.stdout.strip()

    info = machine()
    return {"commit": git("rev-parse", "--short", "HEAD"), "command": command(),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", "src")),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{info['cpu'] or info['platform']}, {info['cpus']} cpus",
            "threads": info.get("threads"), **extra}


def command() -> str:
    """The command line that ran this process, as typed from the repository's root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), HERE.parent)
    return shlex.join(["python", script, *sys.argv[1:]])


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    """Write ``data`` atomically, stamped with the command and the commit that made it (unless
    it says them itself)."""
    path = Path(path)
    stamp = {k: v for k, v in (("command", command()), ("commit", provenance()["commit"]))
             if not _records(data, k)}  # (rows that record their own runs are left as they are)
    data = {**stamp, **data}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def _records(data: Any, key: str) -> bool:
    """Whether ``key`` is a field of ``data`` at any depth."""
    if isinstance(data, dict):
        return key in data or any(_records(v, key) for v in data.values())
    return isinstance(data, list) and any(_records(v, key) for v in data)


def read_json(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else {}


def write_run(path: str | Path, run: str, data: dict[str, Any]) -> Path:
    """One experiment is one file; its variants are runs inside it: put ``data`` (stamped with
    its own provenance) under ``runs[run]`` of ``path``, keeping the other runs."""
    results = read_json(path)
    runs = results.get("runs", {})
    runs[run] = {"run": provenance(), **data}
    return write_json(path, {"benchmark": Path(path).stem, "runs": runs})


@dataclass(frozen=True)
class Section:
    """A generated section of a README: the markdown ``render`` makes from ``sources`` (results
    files), checked against the README by benchmarks/figures.py."""

    render: Callable[[], str]
    sources: tuple[Path, ...]

    def __call__(self) -> str:
        return self.render()

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(str(p.relative_to(HERE.parent)) for p in self.sources)


def replace_section(name: str, markdown: str, readme: Path = README) -> None:
    """Put ``markdown`` between ``<!-- name:start -->`` and ``<!-- name:end -->`` in the
    README (the markers must be there)."""
    text = readme.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{readme}: add the markers {start} and {end} first")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    tmp = readme.with_name(f".{readme.name}.tmp")
    tmp.write_text(f"{head}{start}\n{markdown.rstrip()}\n{end}{tail}")
    os.replace(tmp, readme)  # never a half-written README


#: The speed issue's yardstick: 15 float32 products of 3072 x 3072 matrices (870 GFLOP) on 2
#: threads took this many seconds on the machine its targets were set on. A machine slower on
#: it gets proportionally more time (:func:`allowance`).
WORKLOAD_REFERENCE_S = 6.08


def matrix_workload(threads: int = 2, n: int = 3072, reps: int = 15) -> float:
    """Seconds of the yardstick (``reps`` n x n float32 products on ``threads`` threads), the
    fastest of three runs after a warm-up."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    x, y = torch.randn(n, n), torch.randn(n, n)
    x @ y
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            x @ y
        best = min(best, time.perf_counter() - t0)
    torch.set_num_threads(before)
    return round(best, 3)


def allowance(target_s: float, workload_s: float) -> float:
    """A time target on this machine: ``target_s`` scaled up by how much longer the yardstick
    took here than on the reference machine (never down)."""
    return target_s * max(1.0, workload_s / WORKLOAD_REFERENCE_S)
