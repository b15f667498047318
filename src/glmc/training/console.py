"""What a run shows and hears on the terminal: notices, its progress bar, transformers' own bars,
and Ctrl-C: the first held until the step under way completes, a second one obeyed at once."""

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


class SecondInterrupt(KeyboardInterrupt):
    """A Ctrl-C after the first: the run stops at once (no further checkpoint)."""


class HeldInterrupt(contextlib.AbstractContextManager):
    """Ctrl-C (SIGINT) during a run. The first is held while :meth:`held` (the step under way
    completes; ``requested`` says one came) and interrupts at once elsewhere (KeyboardInterrupt);
    any later one raises :class:`SecondInterrupt` at once, wherever the run is (the checkpoint
    of the step it stopped after included). Only in the main thread, and only over Python's
    default handler."""

    def __init__(self) -> None:
        self.requested = False
        self.holding = False
        self._previous: Any = None

    def __enter__(self) -> HeldInterrupt:
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold a first Ctrl-C inside (until the caller checks ``requested``)."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise SecondInterrupt
        self.requested = True
        if not self.holding:
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
