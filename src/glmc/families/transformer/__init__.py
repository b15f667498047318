"""The transformer family: GPT-2, ViT, Llama, Mistral, Qwen2 and GPT-NeoX imported exactly
into one canonical pre-norm transformer whose norms are weightless RMSNorms, so that the
residual stream carries an orthogonal symmetry (see docs/design.md); BERT and RoBERTa into
its post-norm form, whose stream keeps its LayerNorms and a permutation symmetry.

- ``family``: the family (:class:`TransformerFamily`); ``model``: the canonical config and
  module; ``spec``: its symmetry spec;
- ``gpt2``, ``vit``, ``llama`` (Llama, Mistral, Qwen2), ``gpt_neox``, ``bert`` (BERT,
  RoBERTa): importers from the transformers classes and back; ``stock``, ``rewrite``: what
  they share; ``circuit``: attention in circuit form;
- ``train``: the stock architectures ``glmc train`` trains (``gpt2``, ``vit``, ``llama``,
  ``gpt-neox``, ``bert``); ``options``: the training options they take;
- ``tables``: each Hugging Face architecture's names, as data; ``hf``: the importer that
  reads them.

This module only declares them (torch-free); each loads on first use.
"""

from glmc._lazy import lazy_exports
from glmc.families.options import declare_train_options
from glmc.families.registry import declare_arch, declare_family, declare_importer
from glmc.families.transformer.options import OPTIONS, check

_HERE = "glmc.families.transformer"

declare_family("transformer", f"{_HERE}.family:TransformerFamily")
declare_importer(("gpt2",), f"{_HERE}.gpt2:GPT2Importer")
declare_importer(("vit",), f"{_HERE}.vit:ViTImporter")
declare_importer(("llama",), f"{_HERE}.llama:LlamaImporter")
declare_importer(("mistral",), f"{_HERE}.llama:MistralImporter")
declare_importer(("qwen2",), f"{_HERE}.llama:Qwen2Importer")
declare_importer(("gpt_neox",), f"{_HERE}.gpt_neox:GPTNeoXImporter")
declare_importer(("bert",), f"{_HERE}.bert:BertImporter")
declare_importer(("roberta",), f"{_HERE}.bert:RobertaImporter")
declare_train_options("transformer", OPTIONS, check=check)
for _name, _task, _class, _help in (
        ("gpt2", "causal_lm", "GPT2Arch", "GPT2LMHeadModel on text"),
        ("vit", "image_classifier", "ViTArch", "ViTForImageClassification on images"),
        ("llama", "causal_lm", "LlamaArch",
         "LlamaForCausalLM (grouped-query attention, SwiGLU, rotary) on text"),
        ("gpt-neox", "causal_lm", "GPTNeoXArch",
         "GPTNeoXForCausalLM as in Pythia (partial rotary, parallel residual) on text"),
        ("bert", "masked_lm", "BertArch",
         "BertForMaskedLM (post-LayerNorm encoder) on text, 15 percent of tokens masked")):
    declare_arch(_name, family="transformer", task=_task, help=_help,
                 impl=f"{_HERE}.train:{_class}")

# The family's code, loaded on first use (it imports torch).
_EXPORTS = {
    "TransformerFamily": f"{_HERE}.family",
    **dict.fromkeys(("CanonicalConfig", "build"), f"{_HERE}.model"),
    "canonical_spec": f"{_HERE}.spec",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
