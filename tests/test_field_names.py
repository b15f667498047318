"""Messages about two models' configs name the fields of the users' own config.json
(``num_hidden_layers`` for Llama, ``n_layer`` for GPT-2), which the architectures' tables
give (glmc.families.transformer.tables), not the canonical config's."""

from __future__ import annotations

import re

import pytest

from glmc.errors import GlmcError
from glmc.model import fitted
from glmc.verify import same_interface

DEPTH = [("llama", "num_hidden_layers"), ("qwen2", "num_hidden_layers"),
         ("mistral", "num_hidden_layers"), ("gpt_neox", "num_hidden_layers"),
         ("gpt2", "n_layer")]


@pytest.mark.parametrize(("arch", "field"), DEPTH)
def test_a_pair_of_other_depths_is_refused_naming_the_users_field(h, arch, field):
    a = h.make_tiny(arch, seed=0, n_layer=2).canonical()
    b = h.make_tiny(arch, seed=1, n_layer=3).canonical()
    with pytest.raises(GlmcError, match=rf"the models differ in {field} \(2 in A, 3 in B\)"
                       ".*only their widths") as e:
        fitted(a, b, "a vs b")
    assert field == "n_layer" or not re.search(r"\bn_layer\b", str(e.value))


def test_a_pair_of_other_contexts_is_refused_naming_the_users_field(h):
    a = h.make_tiny("llama", seed=0, n_positions=32).canonical()
    b = h.make_tiny("llama", seed=1, n_positions=16).canonical()
    with pytest.raises(GlmcError, match=r"a vs b: models differ in max_position_embeddings "
                       r"\(32 vs 16\)"):
        same_interface(a.config, b.config, "a vs b")


def test_fields_of_models_from_no_stock_config_keep_their_canonical_names(h):
    a = h.make_tiny("llama", seed=0, n_positions=32).canonical()
    b = h.make_tiny("llama", seed=1, n_positions=16).canonical()
    bare_a, bare_b = a.config.replace(source={}), b.config.replace(source={})
    with pytest.raises(GlmcError, match=r"models differ in n_positions \(32 vs 16\)"):
        same_interface(bare_a, bare_b, "a vs b")
