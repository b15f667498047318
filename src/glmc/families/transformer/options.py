"""The training options of the transformer family (torch-free): the shape of a GPT-2,
ViT, Llama, GPT-NeoX or BERT that ``glmc train`` trains (vocabulary, image size, channels and
classes come from the data)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glmc.errors import GlmcError
from glmc.families.options import TrainOption

OPTIONS = (
    TrainOption("n_layer", int, 2, "transformer blocks", minimum=1),
    TrainOption("n_embd", int, 64, "residual width d", minimum=1),
    TrainOption("n_head", int, 4, "attention heads (must divide --n-embd)", minimum=1),
    TrainOption("n_inner", int, None, "MLP hidden width; unset: 4 x n-embd (llama: 8/3 x "
                "n-embd)", aliases=("--mlp",), minimum=1),
    TrainOption("n_kv_head", int, None, "llama: key/value heads (grouped-query attention; "
                "must divide --n-head); unset: one per two query heads", minimum=1),
    TrainOption("patch_size", int, 4, "vit: patch side; must divide the image side",
                minimum=1),
)


def check(values: Mapping[str, Any]) -> None:
    """The heads divide the width, the key/value heads the query heads."""
    d, h, kv = values["n_embd"], values["n_head"], values["n_kv_head"]
    if d % h:
        raise GlmcError(f"n_head {h} does not divide n_embd {d} (head width must be an "
                        "integer)")
    if kv is not None and h % kv:
        raise GlmcError(f"n_kv_head {kv} does not divide n_head {h} (each key/value head "
                        "serves a whole group of query heads)")


def mlp_width(cfg: Any) -> int:
    """The MLP hidden width a run uses: ``n_inner``, else 4·``n_embd``."""
    return cfg.n_inner if cfg.n_inner is not None else 4 * cfg.n_embd
