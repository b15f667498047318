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
  ``gpt-neox``, ``bert``).

This module only declares them (torch-free); each loads on first use.
"""

from glmc._lazy import lazy_exports
from glmc.families.registry import declare_arch, declare_family, declare_importer

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
declare_arch("gpt2", task="causal_lm", help="GPT2LMHeadModel on text",
             impl=f"{_HERE}.train:GPT2Arch")
declare_arch("vit", task="image_classifier", help="ViTForImageClassification on images",
             impl=f"{_HERE}.train:ViTArch")
declare_arch("llama", task="causal_lm", help="LlamaForCausalLM (grouped-query attention, "
             "SwiGLU, rotary) on text", impl=f"{_HERE}.train:LlamaArch")
declare_arch("gpt-neox", task="causal_lm", help="GPTNeoXForCausalLM as in Pythia (partial "
             "rotary, parallel residual) on text", impl=f"{_HERE}.train:GPTNeoXArch")
declare_arch("bert", task="masked_lm", help="BertForMaskedLM (post-LayerNorm encoder) on "
             "text, 15 percent of tokens masked", impl=f"{_HERE}.train:BertArch")

# The family's code, loaded on first use (it imports torch).
_EXPORTS = {
    "TransformerFamily": f"{_HERE}.family",
    **dict.fromkeys(("CanonicalConfig", "build"), f"{_HERE}.model"),
    "canonical_spec": f"{_HERE}.spec",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
