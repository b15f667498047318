"""What a run shows and hears on the terminal: notices, its progress bar, transformers' own bars,
and Ctrl-C held until the step under way completes."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import transformers
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def notice(msg: str) -> None:
    """Say ``msg`` on stderr as ``glmc train``."""
    print(f"glmc train: {msg}", file=sys.stderr)


class ProgressBar(contextlib.AbstractContextManager):
    """A rich bar on stderr with step, train loss and the last validation loss (or nothing)."""

    def __init__(self, enabled: bool, total: int, start: int, log: dict[str, Any]) -> None:
        self.progress = None
        if enabled:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}  val {task.fields[val]}"),
                TimeElapsedColumn(), TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               loss="-", val=_last_val(log))

    def __enter__(self) -> ProgressBar:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def update(self, step: int, loss: float, log: dict[str, Any]) -> None:
        """Show ``step`` done, its training ``loss`` and the last validation loss of ``log``."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=f"{loss:.4f}",
                                 val=_last_val(log))


def _last_val(log: dict[str, Any]) -> str:
    return f"{log['val'][-1]['loss']:.4f}" if log["val"] else "-"


@contextlib.contextmanager
def hf_progress_bars(enabled: bool) -> Iterator[None]:
    """Switch transformers' tqdm bars (e.g. "Writing model shards") on or off, then restore."""
    hf_logging = transformers.utils.logging
    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


class HeldInterrupt(contextlib.AbstractContextManager):
    """Hold a Ctrl-C (SIGINT) until the step under way completes (``requested``); a second
    one interrupts at once. Only in the main thread, and only over Python's default handler."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> HeldInterrupt:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
