"""Offline datasets: Tiny Shakespeare, small image sets, and user files, behind one loader.

Everything loads from local files (packages installed with pip or apt, or paths given by the
user); nothing is downloaded at run time. Use :func:`load_dataset` with a name from
:data:`DATASETS` or a path::

    ds = load_dataset("shakespeare", context=256)         # TextDataset, 65-character vocabulary
    x, y = next(ds.batches("train", 32, generator=torch.Generator().manual_seed(0)))
    ds = load_dataset("mnist5k", seed=1)                   # ImageDataset, (n, 1, 28, 28)

Both dataset kinds offer ``batches`` (endless random training batches) and ``eval_batches``
(one ordered pass). Save a text dataset's tokenizer next to a model with :func:`save_tokenizer`.
"""

from glmc._lazy import lazy_exports

# Loaded on first use: glmc.data.catalog (the names, for the command line) stays torch-free.
_EXPORTS = {
    "DATASETS": "glmc.data.catalog",
    "fixed_batches": "glmc.data.batches",
    **dict.fromkeys(("Dataset", "load_dataset"), "glmc.data.registry"),
    **dict.fromkeys(("check_images_fit", "check_text_fits"), "glmc.data.checks"),
    "ImageDataset": "glmc.data.images",
    "TextDataset": "glmc.data.text",
    "LabelledText": "glmc.data.labelled",
    **dict.fromkeys(("IGNORE", "MASK_RATE", "MaskedText", "mask_tokens"), "glmc.data.masked"),
    **dict.fromkeys(("TOKENIZER_FILE", "HF_TOKENIZER_FILE", "CharTokenizer", "Gpt2Tokenizer",
                     "HFTokenizer", "Tokenizer", "fits_vocabulary", "tokenizer_file",
                     "load_tokenizer", "save_tokenizer", "tokenizer_from_json"),
                    "glmc.data.tokenizers"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
