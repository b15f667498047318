"""How torch runs: its intra-op thread count, and deterministic kernels, each set for a while
and then given back to the caller."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run on ``n`` torch threads, then give the caller back its own count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """Run with torch's deterministic kernels (warning, not failing, where an op has none),
    then give the caller back its own setting. On several CPU threads some backward kernels
    (scatters, index additions) otherwise add in the order the threads finish: the same seed
    then gives other bits from one process to the next."""
    previous, warn = (torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn)
