"""What the transformer importers share: the canonical config of a stock model, the checks a
stock config must pass, its rotary frequencies, and the test that a canonical model can be
written back as its stock class."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from glmc.errors import GlmcError
from glmc.families.base import METADATA_KEYS
from glmc.families.importers import NotRepresentable
from glmc.families.transformer.model import ACTIVATIONS, CanonicalConfig
from glmc.model import CanonicalModel

#: Keys every transformers config may carry that do not change the function: generation,
#: tokenizer and training bookkeeping.
HARMLESS_KEYS = METADATA_KEYS | {
    "model_type", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "tokenizer_class", "task_specific_params", "use_cache",
    "initializer_range", "problem_type", "is_encoder_decoder", "is_decoder",
    "chunk_size_feed_forward", "tie_encoder_decoder", "torchscript", "prefix",
    "finetuning_task", "cross_attention_hidden_size", "add_cross_attention",
    "pruned_heads", "tf_legacy_loss", "use_bfloat16", "typical_p",
    # (the older spellings transformers still reads into rope_parameters and dtype)
    "rope_scaling", "rope_theta", "rotary_pct", "rotary_emb_base", "torch_dtype",
}
#: Rotary types whose frequencies do not depend on the sequence length (the symmetry group
#: and the canonical form are fixed); others are refused.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def check_config_keys(raw: dict, config_class: type, where: str,
                      also: Iterable[str] = ()) -> None:
    """Refuse a config field glmc does not know (it might change attention or positions, so
    that the spec's group is not a symmetry): one line naming the field."""
    known = set(config_class().to_dict()) | HARMLESS_KEYS | set(also)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise GlmcError(f"{where}: config field {unknown[0]!r} is not one glmc knows for "
                        f"{raw.get('model_type')} models; it may change attention or "
                        "positions, so glmc cannot tell which maps keep the function")


def check_activation(raw: dict, where: str, default: str) -> None:
    """Refuse a ``hidden_act`` the canonical model does not compute, naming it."""
    act = raw.get("hidden_act", default)
    if act not in ACTIVATIONS:
        raise GlmcError(f"{where}: hidden_act {act!r} is not supported (one of "
                        f"{', '.join(ACTIVATIONS)})")


def rotary_of(hf_config: Any, head_dim: int, where: str) -> tuple[int, list[float], float]:
    """(rotary dimensions per head, inverse frequencies, cos/sin factor) as transformers
    computes them for ``hf_config``."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise GlmcError(f"{where}: rope_parameters.rope_type {rope_type!r} is not supported "
                        f"(supported: {', '.join(STATIC_ROPE_TYPES)}; its frequencies depend "
                        "on the sequence length)")
    factor = float(params.get("partial_rotary_factor", 1.0))
    dim = int(head_dim * factor)
    if dim % 2 or dim == 0:
        raise GlmcError(f"{where}: rope_parameters.partial_rotary_factor {factor} gives "
                        f"{dim} rotary dimensions per head (must be even and positive)")
    if rope_type == "default":
        import torch

        theta = float(params.get("rope_theta", 10000.0))
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return dim, [float(v) for v in inv], 1.0
    try:
        inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    except (KeyError, TypeError, ValueError) as e:
        raise GlmcError(f"{where}: rope_parameters of type {rope_type!r} are incomplete "
                        f"({e})") from None
    if inv.numel() != dim // 2:
        raise GlmcError(f"{where}: rope_parameters give {inv.numel()} frequencies for "
                        f"{dim} rotary dimensions")
    return dim, [float(v) for v in inv.float()], float(scaling)


def require_stock_form(model: CanonicalModel, source: str | tuple[str, ...],
                       tol: float = 1e-5) -> None:
    """Raise NotRepresentable unless ``model`` can be written as its stock class: attention
    in head form and, for a LayerNorm model, every residual writer mean-zero (the residual
    map fixed the all-ones direction), so that LayerNorm(γ=1, β=0) = RMSNorm."""
    cfg = model.config
    sources = (source,) if isinstance(source, str) else source
    if cfg.source.get("arch") not in sources:
        raise NotRepresentable(f"model came from {cfg.source.get('arch')!r}, not "
                               f"{' or '.join(map(repr, sources))}")
    if cfg.attention != "heads":
        raise NotRepresentable("attention is in circuit form (head dim = d_model)")
    if cfg.stock_norm != "layernorm" or cfg.norm_position == "post":
        return  # (no LayerNorm rewritten as an RMSNorm)
    bad = model.uncentred_writer(tol)
    if bad is not None:
        raise NotRepresentable(
            f"residual writer {bad[0]} is not mean-zero (relative mean {bad[1]:.2e}): the "
            "residual map does not fix the all-ones direction"
        )


def base_config(hf_config: Any, task: str, **fields: Any) -> CanonicalConfig:
    """A canonical config recording the stock config for export."""
    return CanonicalConfig(task=task, source={"arch": hf_config.model_type,
                                              "config": hf_config.to_dict()}, **fields)
