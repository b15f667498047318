"""The held-out suite's models, trained by a plain PyTorch loop on transformers' classes.

Nothing here is glmc's trainer: the stock config is written out for each family, the model
is transformers' own class, and the loop is a nanoGPT-style recipe (AdamW with betas
0.9/0.95, weight decay 0.1 on matrices only, linear warm-up then cosine decay to a tenth,
gradient clipping at 1, no dropout). glmc is used only for the data (so that the splits a
model trains on are the ones ``glmc barrier`` holds out) and to write the tokenizer file its
commands read. Run by ``heldout.py``, one model per process::

    python benchmarks/heldout_train.py SPEC.json OUT

SPEC holds ``family``, ``data``, ``shape`` (the config's sizes), ``steps``, ``batch``,
``context``, ``lr`` and ``seed``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def stock_config(family: str, shape: dict, vocab: int, context: int, data=None):
    """The transformers config of ``family`` at ``shape`` for a vocabulary of ``vocab``."""
    import transformers as tf

    d, layers, heads = shape["d"], shape["layers"], shape["heads"]
    inner = shape.get("inner", 4 * d)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=vocab, n_positions=context, n_embd=d, n_layer=layers,
                             n_head=heads, n_inner=inner, resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, tie_word_embeddings=False, bos_token_id=None,
                             eos_token_id=None)
    if family in ("llama", "mistral", "qwen2"):
        cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig,
               "qwen2": tf.Qwen2Config}[family]
        extra = {"sliding_window": None} if family != "llama" else {}
        return cls(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                   num_attention_heads=heads, num_key_value_heads=shape.get("kv", heads),
                   intermediate_size=shape.get("inner", 8 * d // 3 // 8 * 8 + 8),
                   max_position_embeddings=context, hidden_act="silu",
                   tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                   pad_token_id=None, **extra)
    if family == "gpt-neox":
        return tf.GPTNeoXConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                                num_attention_heads=heads, intermediate_size=inner,
                                max_position_embeddings=context, hidden_act="gelu",
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.25},
                                use_parallel_residual=True, tie_word_embeddings=False,
                                bos_token_id=None, eos_token_id=None)
    if family == "bert":  # the data's vocabulary and one mask token, the last id
        return tf.BertConfig(vocab_size=vocab + 1, hidden_size=d, num_hidden_layers=layers,
                             num_attention_heads=heads, intermediate_size=inner,
                             max_position_embeddings=context, type_vocab_size=1,
                             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             tie_word_embeddings=True, pad_token_id=None, mask_token_id=vocab,
                             architectures=["BertForMaskedLM"])
    if family == "vit":
        return tf.ViTConfig(image_size=data.image_size, patch_size=shape["patch"],
                            num_channels=data.num_channels, num_labels=data.num_classes,
                            hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=inner, qkv_bias=True, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    raise SystemExit(f"unknown family {family}")


def stock_model(family: str, config):
    import transformers as tf

    cls = {"gpt2": tf.GPT2LMHeadModel, "llama": tf.LlamaForCausalLM,
           "mistral": tf.MistralForCausalLM, "qwen2": tf.Qwen2ForCausalLM,
           "gpt-neox": tf.GPTNeoXForCausalLM, "bert": tf.BertForMaskedLM,
           "vit": tf.ViTForImageClassification}[family]
    return cls(config)


def _mask(x: torch.Tensor, mask_id: int, vocab: int, g: torch.Generator):
    """BERT's masking: 15% of the tokens are targets, 80% of them [MASK], 10% random."""
    pick = torch.rand(x.shape, generator=g) < 0.15
    r = torch.rand(x.shape, generator=g)
    inp = x.clone()
    inp[pick & (r < 0.8)] = mask_id
    rand = pick & (r >= 0.8) & (r < 0.9)
    inp[rand] = torch.randint(vocab, x.shape, generator=g)[rand]
    return inp, torch.where(pick, x, torch.full_like(x, -100))


def train(spec: dict, out: Path) -> dict:
    from glmc.data import load_dataset, save_tokenizer

    torch.manual_seed(spec["seed"])
    family, context = spec["family"], spec.get("context")
    image = family == "vit"
    data = load_dataset(spec["data"], seed=spec.get("data_seed", 0),
                        context=None if image else context)
    if image:
        xs, ys = data.split("train")
        config = stock_config(family, spec["shape"], 0, 0, data)
    else:
        tokens = data.split("train")
        config = stock_config(family, spec["shape"], data.vocab_size, context)
    model = stock_model(family, config).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=spec["lr"], betas=(0.9, 0.95))
    steps, warm = spec["steps"], max(1, spec["steps"] // 20)

    def factor(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    g = torch.Generator().manual_seed(1000 + spec["seed"])
    t0 = time.perf_counter()
    for _ in range(steps):
        if image:
            idx = torch.randint(len(ys), (spec["batch"],), generator=g)
            logits = model(pixel_values=xs[idx]).logits
            loss = F.cross_entropy(logits, ys[idx])
        else:
            start = torch.randint(len(tokens) - context - 1, (spec["batch"],), generator=g)
            win = torch.stack([tokens[s:s + context + 1] for s in start.tolist()]).long()
            if family == "bert":
                inp, tgt = _mask(win[:, :-1], config.mask_token_id, data.vocab_size, g)
                logits = model(input_ids=inp).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
            else:
                logits = model(input_ids=win[:, :-1], use_cache=False).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                       win[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    seconds = time.perf_counter() - t0
    tmp = out.with_name(f".{out.name}.tmp")
    model.eval().save_pretrained(str(tmp), save_original_format=False)
    if not image:
        save_tokenizer(tmp, data.tokenizer)
    record = {"spec": spec, "final_train_loss": float(loss), "seconds": round(seconds, 1),
              "trainer": "benchmarks/heldout_train.py (plain PyTorch loop, not glmc's)",
              "torch": torch.__version__}
    (tmp / "heldout_train.json").write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, out)
    return record


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    rec = train(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
    print(json.dumps({k: rec[k] for k in ("final_train_loss", "seconds")}))
