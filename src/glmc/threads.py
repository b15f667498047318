"""Torch's intra-op thread count, set for a while and then given back to the caller."""

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
