"""The canonical transformer: every norm an RMSNorm without weight, every writer centred.

One readable pre-norm transformer that every importer targets (GPT-2, ViT, ...). The
residual stream is mean-zero and the norms carry no affine, so any orthogonal map of the
residual stream applied to all writers (output side) and readers (input side) preserves the
function exactly: a weightless RMSNorm commutes with orthogonal maps, norm(Ox) = O·norm(x).

Parameter names (d = d_model, H heads of head_dim dh, F = d_mlp)::

    embed.tok                (V, d)      causal_lm: token embedding
    embed.patch.weight       (d, C, p, p) image_classifier: patch convolution
    embed.patch.bias         (d,)
    embed.cls                (d,)        image_classifier: class token
    embed.pos                (T, d)      position embedding (T = context, or patches + 1)
    blocks.{i}.attn.q.weight (H*dh, d)   attention == "heads"; also q.bias, k.*, v.*
    blocks.{i}.attn.o.weight (d, H*dh)
    blocks.{i}.attn.qk.weight (H, d, d)  attention == "circuit": query circuit, key = input
    blocks.{i}.attn.qk.bias  (H, d)
    blocks.{i}.attn.ov.weight (H, d, d)  attention == "circuit": value/output circuit
    blocks.{i}.attn.o.bias   (d,)
    blocks.{i}.mlp.fc.weight (F, d), mlp.fc.bias (F,), mlp.proj.weight (d, F), mlp.proj.bias (d,)
    norm_f.bias              (d,)        optional: bias after the final norm
    head.weight              (V | classes, d), head.bias (optional)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from glmc.families.base import ModelConfig

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


@dataclass
class CanonicalConfig(ModelConfig):
    family: ClassVar[str] = "transformer"

    task: str  # "causal_lm" | "image_classifier"
    d_model: int
    n_layer: int
    n_head: int
    head_dim: int
    d_mlp: int
    activation: str = "gelu"
    norm_eps: float = 1e-5
    attention: str = "heads"  # "heads" | "circuit"
    attn_scale: float | None = None  # default 1/sqrt(head_dim)
    vocab_size: int = 0
    n_positions: int = 0
    image_size: int = 0
    patch_size: int = 0
    num_channels: int = 0
    num_labels: int = 0
    norm_f_bias: bool = False
    head_bias: bool = False
    #: Where the model came from (architecture and its original config), for exporters.
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.attn_scale is None:
            self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if self.task not in ("causal_lm", "image_classifier"):
            raise ValueError(f"unknown task {self.task!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unsupported activation {self.activation!r}")

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0

    @property
    def n_outputs(self) -> int:
        return self.vocab_size if self.task == "causal_lm" else self.num_labels


class Params(nn.Module):
    """A bag of named parameters (keeps parameter names short and predictable)."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without weight over the last axis."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Attention(nn.Module):
    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, dh = cfg.d_model, cfg.n_head, cfg.head_dim
        if cfg.attention == "heads":
            self.q = nn.Linear(d, h * dh)
            self.k = nn.Linear(d, h * dh)
            self.v = nn.Linear(d, h * dh)
            self.o = nn.Linear(h * dh, d)
        elif cfg.attention == "circuit":
            self.qk = Params(weight=(h, d, d), bias=(h, d))
            self.ov = Params(weight=(h, d, d))
            self.o = Params(bias=(d,))
        else:
            raise ValueError(f"unknown attention form {cfg.attention!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, d), already normed
        cfg = self.cfg
        b, t, d = x.shape
        causal = cfg.task == "causal_lm"
        if cfg.attention == "heads":
            h, dh = cfg.n_head, cfg.head_dim
            q = self.q(x).view(b, t, h, dh).transpose(1, 2)  # (B, H, T, dh)
            k = self.k(x).view(b, t, h, dh).transpose(1, 2)
            v = self.v(x).view(b, t, h, dh).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=cfg.attn_scale)
            return self.o(y.transpose(1, 2).reshape(b, t, h * dh))
        # Circuit form: the query of head h is qk_h x + qk_bias_h; keys and values are x itself.
        q = torch.einsum("hkq,btq->bhtk", self.qk.weight, x) + self.qk.bias[None, :, None, :]
        kv = x[:, None].expand(b, cfg.n_head, t, d)
        y = F.scaled_dot_product_attention(q, kv, kv, is_causal=causal, scale=cfg.attn_scale)
        return torch.einsum("hoi,bhti->bto", self.ov.weight, y) + self.o.bias


class MLP(nn.Module):
    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_mlp)
        self.proj = nn.Linear(cfg.d_mlp, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.eps = cfg.norm_eps
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(rms_norm(x, self.eps))
        return x + self.mlp(rms_norm(x, self.eps))


class Embedding(nn.Module):
    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.task = cfg.task
        d = cfg.d_model
        if cfg.task == "causal_lm":
            self.tok = nn.Parameter(torch.zeros(cfg.vocab_size, d))
            self.pos = nn.Parameter(torch.zeros(cfg.n_positions, d))
        else:
            p = cfg.patch_size
            self.patch = nn.Conv2d(cfg.num_channels, d, kernel_size=p, stride=p)
            self.cls = nn.Parameter(torch.zeros(d))
            self.pos = nn.Parameter(torch.zeros(cfg.n_patches + 1, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.task == "causal_lm":  # x: (B, T) token ids
            return self.tok[x] + self.pos[: x.shape[1]]
        patches = self.patch(x).flatten(2).transpose(1, 2)  # (B, N, d)
        cls = self.cls.expand(x.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.pos


class CanonicalTransformer(nn.Module):
    """Pre-norm transformer in canonical form; ``forward`` returns logits.

    causal_lm: (B, T) token ids -> (B, T, V); image_classifier: (B, C, H, W) -> (B, classes).
    """

    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        if cfg.norm_f_bias:
            self.norm_f = Params(bias=(cfg.d_model,))
        self.head = nn.Linear(cfg.d_model, cfg.n_outputs, bias=cfg.head_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        if cfg.task == "image_classifier":
            h = h[:, 0]  # the class token
        h = rms_norm(h, cfg.norm_eps)
        if cfg.norm_f_bias:
            h = h + self.norm_f.bias
        return self.head(h)


def build(
    cfg: CanonicalConfig, state: dict[str, torch.Tensor] | None = None
) -> CanonicalTransformer:
    """A canonical model, with ``state`` loaded (strictly) when given; dtype follows ``state``."""
    model = CanonicalTransformer(cfg)
    if state is not None:
        dtype = next(iter(state.values())).dtype
        model = model.to(dtype)
        model.load_state_dict(state, strict=True)
    return model.eval()
