"""GPT-2's BPE (tiktoken ``r50k_base``) built offline from a local ``gpt2.tiktoken`` file.

Nothing is downloaded at run time. The merge table is looked for, in order, at
``$GLMC_GPT2_TIKTOKEN`` and in an installed ``whisper`` package (``whisper/assets/gpt2.tiktoken``),
which is byte-identical to tiktoken's ``r50k_base`` (same SHA-256, checked on load). tiktoken
itself is optional and imported only here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from glmc.data._files import GPT2_INSTALL, package_dir
from glmc.errors import GlmcError

ENV_VAR = "GLMC_GPT2_TIKTOKEN"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"
END_OF_TEXT_ID = 50256
HOW_TO_GET = (
    f"{GPT2_INSTALL} (tiktoken, and openai-whisper, whose package holds "
    f"whisper/assets/gpt2.tiktoken), or set {ENV_VAR} to a copy of that file"
)


def find_gpt2_file() -> Path:
    """Return the local ``gpt2.tiktoken`` file.

    Raises:
        GlmcError: ``$GLMC_GPT2_TIKTOKEN`` names a missing file, or no file is found; the message
            says how to get one.
    """
    configured = os.environ.get(ENV_VAR)
    if configured:
        path = Path(configured).expanduser()
        if not path.is_file():
            raise GlmcError(f"{ENV_VAR}={configured} is not a file; to get it: {HOW_TO_GET}")
        return path
    try:
        candidate = package_dir("whisper", GPT2_INSTALL) / "assets/gpt2.tiktoken"
    except GlmcError:
        candidate = None
    if candidate is not None and candidate.is_file():
        return candidate
    raise GlmcError(f"tokenizer 'gpt2' needs GPT-2's BPE file offline: {HOW_TO_GET}")


def gpt2_encoding() -> Any:
    """Build the ``tiktoken.Encoding`` for GPT-2 (50,257 tokens, ``<|endoftext|>`` = 50256).

    Raises:
        GlmcError: the BPE file or tiktoken is missing, or the file is not ``r50k_base``.
    """
    path = find_gpt2_file()
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError as error:
        raise GlmcError(f"tokenizer 'gpt2' needs tiktoken: {HOW_TO_GET}") from error
    try:
        ranks = load_tiktoken_bpe(str(path), expected_hash=R50K_SHA256)
    except ValueError as error:
        raise GlmcError(f"{path} is not GPT-2's r50k_base BPE file ({error})") from error
    return tiktoken.Encoding(
        name="r50k_base",
        pat_str=R50K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={END_OF_TEXT: END_OF_TEXT_ID},
        explicit_n_vocab=END_OF_TEXT_ID + 1,
    )
