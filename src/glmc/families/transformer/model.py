"""The canonical transformer: in a pre-norm model every norm an RMSNorm without weight.

One readable transformer that every importer targets (GPT-2, ViT, Llama, Mistral, Qwen2,
GPT-NeoX; BERT and RoBERTa). A pre-norm model's norms carry no affine, so any orthogonal map
of the residual stream applied to all writers (output side) and readers (input side)
preserves the function exactly: a weightless RMSNorm commutes with orthogonal maps,
norm(Ox) = O·norm(x). A LayerNorm model (GPT-2, ViT, GPT-NeoX) is brought here with every
residual writer centred, so that its stream is mean-zero and its LayerNorms are RMSNorms; an
RMSNorm model (Llama and kin) needs its gains folded into the readers only.

A post-norm encoder (``norm_position="post"``: BERT, RoBERTa) keeps its LayerNorms, gain and
bias, on the stream itself (``x <- LN(x + attn(x))``, ``x <- LN(x + mlp(x))``, the
embeddings' sum normed too): nothing can fold them away, and the stream's symmetry shrinks to
the permutations (and, where every gain is equal, more: docs/design.md).

What varies between the stock architectures is configuration, not code: grouped-query
attention (``n_kv_head`` key/value heads, each read by ``n_head / n_kv_head`` query heads),
rotary positions on the first ``rotary_dim`` coordinates of each head (transformers'
rotate-half layout, the inverse frequencies stored as the stock model computes them) or
learned ones, a gated MLP (SwiGLU: ``proj(act(gate(x)) * fc(x))``), optional biases, a
parallel residual step (``x + attn(n(x)) + mlp(n(x))``) and per-layer sliding windows.

Parameter names (d = d_model, H query and K key/value heads of head_dim dh, F = d_mlp)::

    embed.tok                (V, d)      causal_lm: token embedding
    embed.patch.weight       (d, C, p, p) image_classifier: patch convolution
    embed.patch.bias         (d,)
    embed.cls                (d,)        image_classifier: class token
    embed.pos                (T, d)      learned positions (T = context, or patches + 1)
    blocks.{i}.attn.q.weight (H*dh, d)   attention == "heads"; q.bias when attn_bias
    blocks.{i}.attn.k.weight (K*dh, d)   also k.bias, v.weight (K*dh, d), v.bias
    blocks.{i}.attn.o.weight (d, H*dh)   o.bias when o_bias
    blocks.{i}.attn.qk.weight (H, d, d)  attention == "circuit": query circuit, key = input
    blocks.{i}.attn.qk.bias  (H, d)
    blocks.{i}.attn.ov.weight (H, d, d)  attention == "circuit": value/output circuit
    blocks.{i}.mlp.fc.weight (F, d)      (the "up" projection of a gated MLP); fc.bias
    blocks.{i}.mlp.gate.weight (F, d)    gated MLP only; gate.bias
    blocks.{i}.mlp.proj.weight (d, F)    proj.bias when mlp_bias
    norm_f.bias              (d,)        optional: bias after the final norm
    head.weight              (V | classes, d), head.bias (optional)

A post-norm encoder has no final norm and adds (P: position rows, S: token types)::

    embed.token_type         (S, d)      token types (every input is of type 0)
    embed.norm.weight        (d,)        and .bias: the embeddings' LayerNorm
    blocks.{i}.norm1.weight  (d,)        and .bias: after the attention's residual add
    blocks.{i}.norm2.weight  (d,)        and .bias: after the MLP's
    head.dense.weight        (d, d)      masked_lm: the head's transform, its bias, then
    head.norm.weight         (d,)        act and a LayerNorm (and .bias) before head.weight
    pool.weight              (d, d)      sequence_classifier: tanh(pool(first token)), .bias
                                         (features: the pooler, kept; its output not given)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from glmc.families.base import ModelConfig
from glmc.families.transformer.tables import stock_field

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
NORMS = ("layernorm", "rmsnorm")
TASKS = ("causal_lm", "image_classifier", "masked_lm", "sequence_classifier", "features")


@dataclass
class CanonicalConfig(ModelConfig):
    family: ClassVar[str] = "transformer"

    task: str  # "causal_lm" | "image_classifier" | "masked_lm" | "sequence_classifier"
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
    #: Key/value heads (grouped-query attention); None: one per query head.
    n_kv_head: int | None = None
    #: Rotary positions: the coordinates of each head they rotate (0: learned positions)
    #: and the stock model's inverse frequencies (rotary_dim / 2 of them) and cos/sin factor.
    rotary_dim: int = 0
    inv_freq: list[float] = field(default_factory=list)
    rotary_scaling: float = 1.0
    #: "plain": proj(act(fc(x))); "gated": proj(act(gate(x)) * fc(x)).
    mlp: str = "plain"
    attn_bias: bool = True  # q, k, v biases
    o_bias: bool = True
    mlp_bias: bool = True
    #: Attention and MLP read the same stream and both write into it in one step.
    parallel: bool = False
    #: Per layer, the sliding window (keys within this many positions of the query), or None.
    windows: list[int | None] = field(default_factory=list)
    #: The stock model's norm: "layernorm" (writers centred here, so its residual maps must
    #: fix the all-ones direction to be written back) or "rmsnorm".
    stock_norm: str = "layernorm"
    #: "pre": x + f(norm(x)) with weightless RMSNorms; "post": LN(x + f(x)) with each
    #: LayerNorm's gain and bias on the stream (encoders).
    norm_position: str = "pre"
    #: Post-norm encoders: token types (all inputs of type 0), the masked-LM head's
    #: activation, the head tied to the token embedding (the spec then shares the stream's
    #: map with the head's units), and RoBERTa's positions (counted over the tokens that are
    #: not ``position_pad_id``, from position_pad_id + 1; pads take position_pad_id).
    type_vocab: int = 0
    head_activation: str = "gelu"
    tied_head: bool = False
    position_pad_id: int | None = None
    #: The token a masked-language model reads where a token is hidden (None: unknown).
    mask_token_id: int | None = None
    #: Where the model came from (architecture and its original config), for exporters.
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.attn_scale is None:
            self.attn_scale = 1.0 / math.sqrt(self.head_dim)
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}")
        for act in (self.activation, self.head_activation):
            if act not in ACTIVATIONS:
                raise ValueError(f"unsupported activation {act!r}")
        if self.norm_position not in ("pre", "post"):
            raise ValueError(f"unknown norm position {self.norm_position!r} (pre or post)")
        if self.encoder != (self.norm_position == "post"):
            raise ValueError(f"task {self.task} goes with norm_position "
                             f"{'post' if self.encoder else 'pre'}")
        if self.mlp not in ("plain", "gated"):
            raise ValueError(f"unknown MLP {self.mlp!r} (plain or gated)")
        if self.stock_norm not in NORMS:
            raise ValueError(f"unknown stock norm {self.stock_norm!r} ({' or '.join(NORMS)})")
        if self.n_head % self.kv_heads:
            raise ValueError(f"{self.kv_heads} key/value heads do not divide {self.n_head} "
                             "query heads")
        if self.rotary_dim:
            if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
                raise ValueError(f"rotary_dim {self.rotary_dim} must be even and at most "
                                 f"head_dim {self.head_dim}")
            if len(self.inv_freq) != self.rotary_dim // 2:
                raise ValueError(f"{len(self.inv_freq)} inverse frequencies for rotary_dim "
                                 f"{self.rotary_dim}")
        if self.windows and len(self.windows) != self.n_layer:
            raise ValueError(f"{len(self.windows)} sliding windows for {self.n_layer} layers")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.kv_heads

    @property
    def learned_positions(self) -> bool:
        return self.rotary_dim == 0

    @property
    def encoder(self) -> bool:
        """Reads text both ways (a post-norm BERT-like encoder)."""
        return self.task in ("masked_lm", "sequence_classifier", "features")

    @property
    def max_context(self) -> int:
        """The longest input: the position rows, less those RoBERTa's positions skip."""
        skipped = 0 if self.position_pad_id is None else self.position_pad_id + 1
        return self.n_positions - skipped

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2 if self.patch_size else 0

    @property
    def n_outputs(self) -> int:
        return self.vocab_size if self.task in ("causal_lm", "masked_lm") else self.num_labels

    def field_name(self, name: str, other: Any = None) -> str:
        mine = stock_field(self.source.get("arch"), name)
        return mine if other is None or mine == other.field_name(name) else name

    def describe(self) -> str:
        arch = self.source.get("arch", "transformer")
        heads = (f"{self.n_head} heads" if self.kv_heads == self.n_head
                 else f"{self.n_head} query / {self.kv_heads} key-value heads")
        return (f"{arch}: {self.n_layer} layers, d={self.d_model}, {heads}, MLP {self.d_mlp}"
                + (", rotary" if self.rotary_dim else ""))


class Params(nn.Module):
    """A bag of named parameters (keeps parameter names short and predictable)."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without weight over the last axis."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Rotary(nn.Module):
    """cos and sin of the rotary angles, as transformers computes them (in float32, from the
    stored inverse frequencies), applied in the rotate-half layout to the first
    ``rotary_dim`` coordinates of each head."""

    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.dim, self.scaling = cfg.rotary_dim, cfg.rotary_scaling
        # (numbers, not a buffer: a module built on the meta device and filled later keeps
        # them)
        self.inv_freq = list(cfg.inv_freq)

    def forward(self, t: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, rotary_dim) for positions 0..t-1, in x's dtype and on its device."""
        inv = torch.tensor(self.inv_freq, dtype=torch.float32, device=x.device)
        pos = torch.arange(t, device=x.device, dtype=torch.float32)
        freqs = pos[:, None] * inv[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(x.dtype), (emb.sin() * self.scaling).to(x.dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, heads, T, dh): the first ``dim`` coordinates rotated, the rest as they are."""
        rot, rest = x[..., :self.dim], x[..., self.dim:]
        x1, x2 = rot[..., :self.dim // 2], rot[..., self.dim // 2:]
        rotated = rot * cos + torch.cat((-x2, x1), dim=-1) * sin
        return torch.cat((rotated, rest), dim=-1) if rest.shape[-1] else rotated


def attention_mask(t: int, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Which keys each query sees under a causal sliding window (T, T): the ``window`` latest
    positions up to its own, as transformers' sliding-window layers; None when the window
    spans the whole sequence (SDPA's own causal mask)."""
    if window is None or window >= t:
        return None
    q = torch.arange(t, device=device)[:, None]
    k = torch.arange(t, device=device)[None, :]
    return (k > q - window) & (k <= q)


class Attention(nn.Module):
    def __init__(self, cfg: CanonicalConfig, window: int | None = None) -> None:
        super().__init__()
        self.cfg, self.window = cfg, window
        d, h, kv, dh = cfg.d_model, cfg.n_head, cfg.kv_heads, cfg.head_dim
        if cfg.attention == "heads":
            self.q = nn.Linear(d, h * dh, bias=cfg.attn_bias)
            self.k = nn.Linear(d, kv * dh, bias=cfg.attn_bias)
            self.v = nn.Linear(d, kv * dh, bias=cfg.attn_bias)
            self.o = nn.Linear(h * dh, d, bias=cfg.o_bias)
        elif cfg.attention == "circuit":
            if cfg.rotary_dim or cfg.kv_heads != cfg.n_head:
                raise ValueError("circuit form needs learned positions and one key/value head "
                                 "per query head")
            self.qk = Params(weight=(h, d, d), bias=(h, d))
            self.ov = Params(weight=(h, d, d))
            self.o = Params(bias=(d,))
        else:
            raise ValueError(f"unknown attention form {cfg.attention!r}")

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        """x: (B, T, d), already normed."""
        cfg = self.cfg
        b, t, d = x.shape
        causal = cfg.task == "causal_lm"
        mask = attention_mask(t, self.window, x.device) if causal else None
        if cfg.attention == "heads":
            h, kv, dh = cfg.n_head, cfg.kv_heads, cfg.head_dim
            q = self.q(x).view(b, t, h, dh).transpose(1, 2)  # (B, H, T, dh)
            k = self.k(x).view(b, t, kv, dh).transpose(1, 2)  # (B, K, T, dh)
            v = self.v(x).view(b, t, kv, dh).transpose(1, 2)
            if rotary is not None:
                cos, sin = rotary(t, x)
                q, k = rotary.apply(q, cos, sin), rotary.apply(k, cos, sin)
            if kv != h:  # each key/value head serves the query heads of its group
                k = k.repeat_interleave(h // kv, dim=1)
                v = v.repeat_interleave(h // kv, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               is_causal=causal and mask is None,
                                               scale=cfg.attn_scale)
            return self.o(y.transpose(1, 2).reshape(b, t, h * dh))
        # Circuit form: the query of head h is qk_h x + qk_bias_h; keys and values are x itself.
        q = torch.einsum("hkq,btq->bhtk", self.qk.weight, x) + self.qk.bias[None, :, None, :]
        kvx = x[:, None].expand(b, cfg.n_head, t, d)
        y = F.scaled_dot_product_attention(q, kvx, kvx, attn_mask=mask,
                                           is_causal=causal and mask is None,
                                           scale=cfg.attn_scale)
        return torch.einsum("hoi,bhti->bto", self.ov.weight, y) + self.o.bias


class MLP(nn.Module):
    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
        if cfg.mlp == "gated":
            self.gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.mlp_bias)
        self.proj = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.mlp_bias)
        self.act = ACTIVATIONS[cfg.activation]
        self.gated = cfg.mlp == "gated"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.proj(self.act(self.gate(x)) * self.fc(x))
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: CanonicalConfig, window: int | None = None) -> None:
        super().__init__()
        self.eps, self.parallel = cfg.norm_eps, cfg.parallel
        self.attn = Attention(cfg, window)
        self.mlp = MLP(cfg)
        self.post = cfg.norm_position == "post"
        if self.post:
            self.norm1 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
            self.norm2 = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)

    def forward(self, x: torch.Tensor, rotary: Rotary | None = None) -> torch.Tensor:
        if self.post:  # (an encoder: each sum normed, gain and bias on the stream)
            x = self.norm1(x + self.attn(x, rotary))
            return self.norm2(x + self.mlp(x))
        if self.parallel:  # (both read the same normed stream)
            n = rms_norm(x, self.eps)
            return x + self.attn(n, rotary) + self.mlp(n)
        x = x + self.attn(rms_norm(x, self.eps), rotary)
        return x + self.mlp(rms_norm(x, self.eps))


class Embedding(nn.Module):
    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.task, self.pad = cfg.task, cfg.position_pad_id
        d = cfg.d_model
        if cfg.encoder:
            self.tok = nn.Parameter(torch.zeros(cfg.vocab_size, d))
            self.pos = nn.Parameter(torch.zeros(cfg.n_positions, d))
            self.token_type = nn.Parameter(torch.zeros(cfg.type_vocab, d))
            self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        elif cfg.task == "causal_lm":
            self.tok = nn.Parameter(torch.zeros(cfg.vocab_size, d))
            if cfg.learned_positions:
                self.pos = nn.Parameter(torch.zeros(cfg.n_positions, d))
        else:
            p = cfg.patch_size
            self.patch = nn.Conv2d(cfg.num_channels, d, kernel_size=p, stride=p)
            self.cls = nn.Parameter(torch.zeros(d))
            self.pos = nn.Parameter(torch.zeros(cfg.n_patches + 1, d))

    def positions(self, x: torch.Tensor) -> torch.Tensor:
        """Position ids (B, T) or (T,) of token ids x (B, T): 0..T-1, or RoBERTa's count."""
        if self.pad is None:
            return torch.arange(x.shape[1], device=x.device)
        real = (x != self.pad).long()
        return torch.cumsum(real, dim=1) * real + self.pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "norm"):  # an encoder's: x (B, T) token ids, all of type 0
            return self.norm(self.tok[x] + self.token_type[0] + self.pos[self.positions(x)])
        if self.task == "causal_lm":  # x: (B, T) token ids
            h = self.tok[x]
            return h + self.pos[: x.shape[1]] if hasattr(self, "pos") else h
        patches = self.patch(x).flatten(2).transpose(1, 2)  # (B, N, d)
        cls = self.cls.expand(x.shape[0], 1, -1)
        return torch.cat([cls, patches], dim=1) + self.pos


class MaskedLMHead(nn.Module):
    """An encoder's token predictions: head.weight · LN(act(dense(h))) + head.bias."""

    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.dense = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=cfg.norm_eps)
        self.weight = nn.Parameter(torch.zeros(cfg.vocab_size, d))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.act = ACTIVATIONS[cfg.head_activation]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(self.act(self.dense(h))), self.weight, self.bias)


class CanonicalTransformer(nn.Module):
    """A transformer in canonical form; ``forward`` returns logits.

    causal_lm and masked_lm: (B, T) token ids -> (B, T, V); image_classifier: (B, C, H, W)
    -> (B, classes); sequence_classifier: (B, T) token ids -> (B, classes); features: (B, T)
    token ids -> the last hidden state (B, T, d).
    """

    def __init__(self, cfg: CanonicalConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        windows = cfg.windows or [None] * cfg.n_layer
        self.blocks = nn.ModuleList(Block(cfg, windows[i]) for i in range(cfg.n_layer))
        self.rotary = Rotary(cfg) if cfg.rotary_dim else None
        if cfg.norm_f_bias:
            self.norm_f = Params(bias=(cfg.d_model,))
        if cfg.task == "masked_lm":
            self.head: nn.Module = MaskedLMHead(cfg)
        elif cfg.task != "features":  # (the bare encoder's output is the stream)
            self.head = nn.Linear(cfg.d_model, cfg.n_outputs, bias=cfg.head_bias)
        if cfg.task in ("sequence_classifier", "features"):
            self.pool = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, self.rotary)
        if cfg.task == "features":
            return h  # (the last hidden state; the pooler is kept, its output not given)
        if cfg.encoder:  # (no final norm: every block ends in one)
            if cfg.task == "sequence_classifier":
                h = torch.tanh(self.pool(h[:, 0]))  # the first token, pooled
            return self.head(h)
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
