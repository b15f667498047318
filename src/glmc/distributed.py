"""Data parallelism on torch.distributed: started by torchrun, gloo (the latents are on the CPU).

    torchrun --standalone --nproc-per-node 2 $(which glmc) align A B -o OUT --align learned ...
    # several machines: on each, the same command with
    torchrun --nnodes 2 --node-rank R --master-addr HOST --master-port 29500 --nproc-per-node N ...

Each rank takes a shard of every global batch; the latents' gradients are averaged with an
all-reduce, so the result matches a single process with the same global batch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TypeVar

import torch

T = TypeVar("T")


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def from_main(obj: T) -> T:
    """``obj`` as rank 0 has it, on every rank (alone: ``obj`` itself). For what only rank 0
    can read, such as a checkpoint it wrote on its own machine."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)  # (between our own processes)
    return box[0]


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """Join the process group that torchrun describes in the environment (no-op alone)."""
    if world_size() <= 1 or torch.distributed.is_initialized():
        yield
        return
    # The latents live on the CPU for now, so their all-reduce goes through gloo everywhere.
    torch.distributed.init_process_group(backend="gloo")
    try:
        yield
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
