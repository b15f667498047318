"""Where glmc computes: a device named by the user (``"cpu"``, ``"cuda"``, ``"cuda:1"`` or
``"auto"``), checked against what this machine has before any work.

The matchers follow one rule on a device: the models' tensors, the products made of them and
the dense maps (the residual map, the heads' inner maps, learned matching's latents) live
there; permutations live on the host (their assignments are solved there, by scipy or lapx,
on the n × n cost moved back) and move to a tensor's device only to act on it; what the
matchers return (the transform's elements) is on the host again.
"""

from __future__ import annotations

import os

import torch

from glmc import distributed
from glmc.errors import GlmcError

#: The device types glmc computes on.
TYPES = ("cpu", "cuda")


def available() -> str:
    """This machine's devices, as a user names them: ``"cpu, cuda:0, cuda:1"``."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ", ".join(["cpu", *(f"cuda:{i}" for i in range(count))])


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device ``device`` names; ``"auto"``/None: CUDA when available, else the CPU.

    Raises:
        GlmcError: an unknown name, a type glmc does not compute on, CUDA where this machine
            has none, or a CUDA index past its devices (the message lists the devices there
            are).
    """
    if device is None or device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise GlmcError(f"unknown device {device!r} ({', '.join(TYPES)}, cuda:N or auto; "
                        f"this machine has {available()})") from None
    if dev.type not in TYPES:
        raise GlmcError(f"device {device!r}: glmc computes on {' or '.join(TYPES)} (this "
                        f"machine has {available()})")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GlmcError(f"device {device!r} requested but CUDA is not available (this "
                            f"machine has {available()})")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise GlmcError(f"device {device!r} requested but this machine has {count} CUDA "
                            f"device{'s' * (count != 1)} ({available()})")
        if dev.index is None:  # (as its tensors name it: "cuda" is the current one)
            dev = torch.device("cuda", torch.cuda.current_device())
        # Learned matching runs on deterministic kernels (glmc.threads.deterministic), and
        # cuBLAS's need a fixed workspace, read when it is first used: set before any work.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return dev


def matching_device(device: str | torch.device | None) -> torch.device:
    """:func:`resolve_device` for weight and learned matching (None: the CPU), which under
    torchrun run on the CPU alone: their ranks exchange through gloo."""
    dev = resolve_device("cpu" if device is None else device)
    if dev.type != "cpu" and distributed.spread():
        raise GlmcError(f"device {str(device)!r}: under torchrun the ranks match on the CPU "
                        "(they exchange through gloo); run one process to match on "
                        f"{dev.type}")
    return dev
