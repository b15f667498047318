"""Attention heads in circuit form, an exact rewrite of head form.

Per head h with query/key rows Q_h, K_h (dh, d) and biases: the score between a query input x
and a key input y is (Q_h x + q_h)·(K_h y + k_h). Terms that depend on x alone are constant
over keys and vanish in the softmax, so the score is (K_hᵀQ_h x + K_hᵀq_h)·y: the circuit
``qk.weight[h] = K_hᵀ Q_h`` (d, d) and ``qk.bias[h] = K_hᵀ q_h`` with the key the input itself.
Values: O_h (V_h y + v_h) summed with weights adding to one gives ``ov.weight[h] = O_h V_h``
and a constant O_h v_h that joins the output bias.
"""

from __future__ import annotations

from glmc.errors import GlmcError
from glmc.model import CanonicalModel


def to_circuit(model: CanonicalModel) -> CanonicalModel:
    """The same function with every attention layer in circuit form (head dim = d_model)."""
    cfg = model.config
    if cfg.attention == "circuit":
        return model
    if cfg.rotary_dim or cfg.kv_heads != cfg.n_head or not (cfg.attn_bias and cfg.o_bias):
        # (a rotary score is not a fixed bilinear form of the inputs; grouped heads share
        # keys and values)
        raise GlmcError(f"{cfg.describe()}: heads as circuits (--heads circuit) need learned "
                        "positions, one key/value head per query head and attention biases")
    h, dh, d = cfg.n_head, cfg.head_dim, cfg.d_model
    state = {}
    for name, x in model.state.items():
        if ".attn." not in name:
            state[name] = x
    for i in range(cfg.n_layer):
        a = f"blocks.{i}.attn"
        s = model.state
        q = s[f"{a}.q.weight"].view(h, dh, d)
        qb = s[f"{a}.q.bias"].view(h, dh)
        k = s[f"{a}.k.weight"].view(h, dh, d)
        v = s[f"{a}.v.weight"].view(h, dh, d)
        vb = s[f"{a}.v.bias"]
        o = s[f"{a}.o.weight"].view(d, h, dh).permute(1, 0, 2)  # (H, d, dh)
        state[f"{a}.qk.weight"] = k.mT @ q  # (H, d_key, d_query)
        state[f"{a}.qk.bias"] = (k.mT @ qb[..., None])[..., 0]  # (H, d)
        state[f"{a}.ov.weight"] = o @ v  # (H, d_out, d_in)
        state[f"{a}.o.bias"] = s[f"{a}.o.bias"] + s[f"{a}.o.weight"] @ vb
    return CanonicalModel(cfg.replace(attention="circuit"), state, model.files)
