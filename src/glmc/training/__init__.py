"""Training small transformers from scratch: ``glmc train`` and its Python API.

>>> from glmc.training import TrainConfig, train
>>> cfg = TrainConfig(arch="gpt2", data="shakespeare", seed=1, n_layer=2, n_embd=64, steps=500)
>>> record = train(cfg, "runs/gpt-a")          # HF folder + glmc_train.json + tokenizer
>>> record["log"]["test"]                      # {"loss": ..., "accuracy": ...}
"""

from glmc._lazy import lazy_exports

# Loaded on first use: glmc.training.options (TrainConfig, for the command line) stays torch-free.
_EXPORTS = {
    **dict.fromkeys(("ARCHS", "TrainConfig"), "glmc.training.options"),
    **dict.fromkeys(("checkpoint_dir", "checkpoint_path"), "glmc.training.checkpoint"),
    **dict.fromkeys(("load_training_data", "model_config"), "glmc.training.config"),
    **dict.fromkeys(("TRAIN_FILE", "TrainingStopped", "evaluate", "lr_factor", "train"),
                    "glmc.training.loop"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
