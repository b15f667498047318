"""Training small transformers from scratch: ``glmc train`` and its Python API.

>>> from glmc.training import TrainConfig, train
>>> cfg = TrainConfig(arch="gpt2", data="shakespeare", seed=1, n_layer=2, n_embd=64, steps=500)
>>> record = train(cfg, "runs/gpt-a")          # HF folder + glmc_train.json + tokenizer
>>> record["log"]["test"]                      # {"loss": ..., "accuracy": ...}
"""

from glmc.training.checkpoint import checkpoint_dir, checkpoint_path
from glmc.training.config import ARCHS, TrainConfig, hf_config, load_training_data
from glmc.training.loop import (
    TRAIN_FILE,
    TrainingStopped,
    build_model,
    evaluate,
    logits_of,
    lr_factor,
    train,
)

__all__ = [
    "ARCHS",
    "TRAIN_FILE",
    "TrainConfig",
    "TrainingStopped",
    "build_model",
    "checkpoint_dir",
    "checkpoint_path",
    "evaluate",
    "hf_config",
    "load_training_data",
    "logits_of",
    "lr_factor",
    "train",
]
