"""Shared builders: tiny stock GPT-2 / ViT models with every parameter random (LayerNorm
weights and biases included), their canonical forms and logit comparisons.

Builders are handed to tests through session-scoped fixtures (so that hypothesis tests may
use them too).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch import nn

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from transformers import GPT2Config, ViTConfig  # noqa: E402
from transformers.pytorch_utils import Conv1D  # noqa: E402

from glmc.data._files import DATA_INSTALL  # noqa: E402
from glmc.families import IMPORTERS
from glmc.families.convnet import ConvNetConfig, build  # noqa: E402
from glmc.families.importers import Importer  # noqa: E402
from glmc.model import CanonicalModel  # noqa: E402
from glmc.verify import random_inputs  # noqa: E402

# The models here are tiny: one thread is as fast, and far more robust when other processes
# compete for the CPUs (spinning BLAS threads slow a loaded 2-core machine down many-fold).
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)

settings.register_profile(
    "ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ARCHS = ("gpt2", "vit")


def gpt2_config(*, n_layer: int = 2, d: int = 32, n_head: int = 4, vocab: int = 50,
                n_positions: int = 16, tied: bool = True, n_inner: int | None = None,
                **extra: Any) -> GPT2Config:
    return GPT2Config(n_layer=n_layer, n_embd=d, n_head=n_head, vocab_size=vocab,
                      n_positions=n_positions, n_inner=n_inner, tie_word_embeddings=tied,
                      bos_token_id=None, eos_token_id=None, **extra)


def vit_config(*, n_layer: int = 2, d: int = 32, n_head: int = 4, d_mlp: int = 64,
               image_size: int = 8, patch_size: int = 4, num_channels: int = 3,
               num_labels: int = 5, qkv_bias: bool = True, **extra: Any) -> ViTConfig:
    return ViTConfig(num_hidden_layers=n_layer, hidden_size=d, num_attention_heads=n_head,
                     intermediate_size=d_mlp, image_size=image_size, patch_size=patch_size,
                     num_channels=num_channels, num_labels=num_labels, qkv_bias=qkv_bias,
                     **extra)


def decoder_config(model_type: str, *, n_layer: int = 2, d: int = 32, n_head: int = 4,
                   n_kv_head: int = 2, vocab: int = 50, n_positions: int = 32, d_mlp: int = 48,
                   tied: bool = False, **extra: Any) -> Any:
    """A rotary decoder's config (llama, mistral, qwen2, gpt_neox); ``extra`` as the class
    takes it (e.g. ``sliding_window``, ``attention_bias``, ``use_parallel_residual``)."""
    from transformers import GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(hidden_size=d, num_hidden_layers=n_layer, num_attention_heads=n_head,
                  intermediate_size=d_mlp, vocab_size=vocab, max_position_embeddings=n_positions,
                  tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    if model_type == "gpt_neox":
        return GPTNeoXConfig(**common, **extra)
    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}[model_type]
    return cls(**common, num_key_value_heads=n_kv_head, **extra)


def encoder_config(model_type: str, *, n_layer: int = 2, d: int = 32, n_head: int = 4,
                   vocab: int = 50, n_positions: int = 24, d_mlp: int = 48,
                   head: str = "masked_lm", tied: bool = True, num_labels: int = 3,
                   **extra: Any) -> Any:
    """A post-LayerNorm encoder's config (bert, roberta) with a masked-LM head,
    (``head="sequence_classifier"``) a classifier of ``num_labels`` classes, or
    (``head="features"``) none: BertModel, RobertaModel."""
    from transformers import BertConfig, RobertaConfig

    cls, stem = {"bert": (BertConfig, "Bert"), "roberta": (RobertaConfig, "Roberta")}[model_type]
    suffix = {"masked_lm": "ForMaskedLM", "sequence_classifier": "ForSequenceClassification",
              "features": "Model"}[head]
    return cls(hidden_size=d, num_hidden_layers=n_layer, num_attention_heads=n_head,
               intermediate_size=d_mlp, vocab_size=vocab, max_position_embeddings=n_positions,
               tie_word_embeddings=tied, num_labels=num_labels, type_vocab_size=2,
               architectures=[stem + suffix], **extra)


CONFIGS = {"gpt2": gpt2_config, "vit": vit_config,
           **{t: functools.partial(decoder_config, t)
              for t in ("llama", "mistral", "qwen2", "gpt_neox")},
           **{t: functools.partial(encoder_config, t) for t in ("bert", "roberta")}}


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Draw every parameter afresh: weights ~ N(0, 1/fan_in), biases ~ N(0, 0.2²), norm
    weights ~ 1 + N(0, 0.5²) and norm biases ~ N(0, 0.5²) (non-trivial LayerNorm and RMSNorm
    gains)."""
    g = torch.Generator().manual_seed(seed)

    def draw(p: torch.Tensor, std: float, mean: float = 0.0) -> None:
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std + mean)

    with torch.no_grad():
        seen: set[int] = set()
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if id(p) in seen:
                    continue
                seen.add(id(p))
                if isinstance(module, nn.LayerNorm) or "RMSNorm" in type(module).__name__:
                    draw(p, 0.5, 1.0 if name == "weight" else 0.0)
                elif name == "bias":
                    draw(p, 0.2)
                elif isinstance(module, Conv1D):  # GPT-2's (in, out) weights
                    draw(p, p.shape[0] ** -0.5)
                elif isinstance(module, nn.Linear):
                    draw(p, p.shape[1] ** -0.5)
                elif isinstance(module, nn.Conv2d):
                    draw(p, p[0].numel() ** -0.5)
                else:  # embeddings, class token, position table
                    draw(p, 1.0)
    return model


@dataclass
class Tiny:
    """A random stock model and what tests need from it."""

    arch: str
    importer: Importer
    hf_config: Any
    stock: nn.Module

    @property
    def dtype(self) -> torch.dtype:
        return next(self.stock.parameters()).dtype

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.stock.state_dict().items()}

    def canonical(self) -> CanonicalModel:
        return self.importer.to_canonical(self.hf_config, self.state())

    def inputs(self, n: int = 3, seed: int = 0) -> torch.Tensor:
        return random_inputs(self.canonical().config, n=n, seq=16, seed=seed, dtype=self.dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.importer.stock_logits(self.stock, x)


def make_tiny(arch: str, *, seed: int = 0, dtype: torch.dtype = torch.float64,
              **config: Any) -> Tiny:
    """A random stock ``arch`` model (see ``gpt2_config`` / ``vit_config`` for options)."""
    importer = IMPORTERS[arch]
    hf_config = CONFIGS[arch](**config)
    stock = importer.stock_model(hf_config)
    randomize(stock, seed)
    return Tiny(arch, importer, hf_config, stock.to(dtype).eval())


def canonical_output(model: CanonicalModel, x: torch.Tensor,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    module = model.module(dtype)
    with torch.no_grad():
        return module(x.to(dtype or model.dtype) if x.is_floating_point() else x)


def rel_diff(ref: torch.Tensor, other: torch.Tensor) -> float:
    """max |ref - other| relative to the logit scale max |ref|."""
    assert ref.shape == other.shape
    return float((ref - other).abs().max() / ref.abs().max().clamp_min(1e-30))


def require(available: bool, reason: str) -> None:
    """Skip the calling test unless ``available``; under CI (``CI`` is ``true`` or ``1``) fail
    it instead: CI installs every optional package (``.[test]``), and a skip there would hide a
    broken install step.

    Args:
        available: whether what the test needs (a package, a data file) is there.
        reason: what is missing and how to get it, e.g. "mlxtend: pip install 'glmc[data]'".
    """
    if available:
        return
    if os.environ.get("CI", "").strip().lower() in ("true", "1"):
        pytest.fail(f"missing under CI, where every test must run: {reason}", pytrace=False)
    pytest.skip(reason)


def require_packages(*packages: str, install: str = DATA_INSTALL) -> None:
    """:func:`require` the packages (found without importing them), naming how to install them."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    require(not missing, f"{', '.join(missing)}: {install}")


def rel_weight_distance(a: CanonicalModel, b: CanonicalModel) -> float:
    """sqrt(Σ ‖B_t − A_t‖²) / sqrt(Σ ‖A_t‖²) over every tensor."""
    assert a.state.keys() == b.state.keys()
    num = sum(float((b.state[k].double() - a.state[k].double()).pow(2).sum()) for k in a.state)
    den = sum(float(a.state[k].double().pow(2).sum()) for k in a.state)
    return (num / den) ** 0.5


class Helpers:
    """The builders, as one fixture value (``h``)."""

    make_tiny = staticmethod(make_tiny)
    require = staticmethod(require)
    require_packages = staticmethod(require_packages)
    canonical_output = staticmethod(canonical_output)
    rel_diff = staticmethod(rel_diff)
    rel_weight_distance = staticmethod(rel_weight_distance)
    gpt2_config = staticmethod(gpt2_config)
    vit_config = staticmethod(vit_config)


@pytest.fixture(scope="session")
def h() -> Helpers:
    return Helpers()


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    return request.param


# -- convnets ---------------------------------------------------------------------------------


def random_model(config: ConvNetConfig, seed: int) -> CanonicalModel:
    """Every tensor drawn afresh in float64: weights ~ N(0, 1/fan_in), biases and means
    ~ N(0, 0.3²), norm weights ~ 1 + N(0, 0.5²), running variances ~ U(0.5, 2)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in build(config).state_dict().items():
        x = torch.randn(t.shape, generator=g, dtype=torch.float64)
        if name.endswith("running_var"):
            x = 0.5 + 1.5 * torch.rand(t.shape, generator=g, dtype=torch.float64)
        elif t.dim() > 1:
            x = x * t[0].numel() ** -0.5
        elif ".norm" in name and name.endswith("weight"):
            x = 1 + 0.5 * x
        else:
            x = 0.3 * x
        state[name] = x
    return CanonicalModel(config, state)


def images(config: ConvNetConfig, n: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    size = (n, config.num_channels, config.image_size, config.image_size)
    return torch.randn(size, generator=g, dtype=torch.float64)
