"""The record of a run (``glmc_train.json``), and the checks that what a folder or a checkpoint
holds is the run asked for (before it is returned or resumed)."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from glmc.data import Dataset
from glmc.errors import GlmcError
from glmc.families.registry import arch_named
from glmc.io.folders import TRAIN_FILE
from glmc.training.config import check_fits
from glmc.training.options import TrainConfig

RECORD_FORMAT = 1

_START_OVER = "pass --force without --resume to start over, discarding the checkpoint"


def training_record(cfg: TrainConfig, summary: dict[str, Any], model: nn.Module,
                    log: dict[str, Any]) -> dict[str, Any]:
    """The record of a finished run: its config, data summary, model size, log and versions."""
    try:
        glmc_version = metadata.version("glmc")
    except metadata.PackageNotFoundError:
        glmc_version = None
    return {
        "format": RECORD_FORMAT,
        "arch": cfg.arch,
        "data": cfg.data,
        "seed": cfg.seed,
        "data_seed": cfg.data_seed,
        "config": cfg.to_json(),
        "dataset": summary,
        "model": {"class": type(model).__name__,
                  "n_params": sum(p.numel() for p in model.parameters())},
        "log": log,
        "versions": {"glmc": glmc_version, "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }


def finished_record(out: Path, cfg: TrainConfig) -> dict[str, Any] | None:
    """The record of a finished run in ``out`` if it is ``cfg``'s run; error if another run's."""
    path = out / TRAIN_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        old = TrainConfig.from_json(record["config"], str(path)).identity()
    except (ValueError, KeyError, TypeError) as e:
        raise GlmcError(f"{path}: not a glmc training record ({e})") from None
    if old != cfg.identity():
        raise GlmcError(f"cannot resume: {out} holds a finished run with "
                        f"{_differences(old, cfg.identity())}; choose another -o, or pass "
                        "--force without --resume to replace it")
    return record


def check_resumable(
    state: dict[str, Any], cfg: TrainConfig, ds: Dataset, summary: dict[str, Any], where: Path
) -> None:
    """The checkpoint ``state`` (read from ``where``) must be of this config and this data."""
    old = TrainConfig.from_json(state["config"], str(where)).identity()
    if old != cfg.identity():
        raise GlmcError(f"cannot resume: {where} was made with {_differences(old, cfg.identity())}"
                        f"; {_START_OVER}")
    arch = arch_named(cfg.arch)
    check_fits(arch, arch.config_from_json(state["model_config"]), ds, cfg)
    if state["data"] != summary:
        diff = [k for k in summary if state["data"].get(k) != summary[k]]
        raise GlmcError(f"cannot resume: the data '{cfg.data}' differ from those of {where} "
                        f"({', '.join(diff)} changed); {_START_OVER}")


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = [k for k in new if old.get(k) != new[k]]
    return ", ".join(f"{k}={old.get(k)!r} (requested {new[k]!r})" for k in keys)
