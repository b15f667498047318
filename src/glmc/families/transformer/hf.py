"""The one importer of every Hugging Face architecture's names: it reads the architecture's
table (:mod:`glmc.families.transformer.tables`) for the key handling, tied heads, the stock
classes and the config fields copied as they are. An architecture's subclass adds only its
conversion's arithmetic (``to_canonical``, ``to_stock``) and the checks of its own fields."""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

import torch
import transformers

from glmc.families.importers import Importer
from glmc.families.transformer.stock import check_activation, check_config_keys
from glmc.families.transformer.tables import TABLES, HFTable
from glmc.tensors import StateDict


@functools.cache
def _renames(model_type: str) -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((re.compile(p), r) for p, r in TABLES[model_type].renames)


class TableImporter(Importer):
    """An importer whose names come from ``table`` (its ``name`` is the table's
    ``model_type``)."""

    table: ClassVar[HFTable]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "table" in cls.__dict__:
            cls.name = cls.table.model_type

    # -- the stock classes -----------------------------------------------------------------
    def config_class(self) -> type:
        return getattr(transformers, self.table.config_class)

    def task(self, hf_config: Any) -> str:
        """The task of the class a config's ``architectures`` names (the table's first when
        it names none of them)."""
        arch = (getattr(hf_config, "architectures", None) or [""])[0]
        tasks = [task for task, cls in self.table.classes.items() if cls == arch]
        return tasks[0] if tasks else next(iter(self.table.classes))

    def stock_model(self, hf_config: Any) -> torch.nn.Module:
        hf_config._attn_implementation = "sdpa"  # exact in float64, unlike eager's float32 softmax
        return getattr(transformers, self.table.classes[self.task(hf_config)])(hf_config).eval()

    def stock_logits(self, stock: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = stock(**{self.table.inputs: x}, **self.table.call)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out.logits

    # -- the config ------------------------------------------------------------------------
    def check_config(self, raw: dict, where: str) -> None:
        if not self.table.checked:
            return
        check_config_keys(raw, self.config_class(), where, also=self.table.also)
        self.check_fields(raw, where)
        if self.table.activation is not None:
            check_activation(raw, where, self.table.activation)

    def check_fields(self, raw: dict, where: str) -> None:
        """Refuse values of the architecture's own fields the canonical form does not cover
        (after the fields themselves are known to glmc)."""

    def copied_fields(self, hf_config: Any) -> dict[str, Any]:
        """The canonical config fields copied as they are from the stock config."""
        return {ours: getattr(hf_config, theirs) for ours, theirs in self.table.fields.items()}

    # -- the keys --------------------------------------------------------------------------
    def layer_modules(self, i: int, base: str = "") -> dict[str, str]:
        """Layer ``i``'s canonical module (``attn.q``) -> its stock module's full name (under
        ``base``, e.g. ``bert.``), as the table's ``modules`` name them."""
        layer = base + self.table.layer.format(i=i)
        return {ours: f"{layer}.{theirs}" for ours, theirs in self.table.modules.items()}

    def optional_keys(self, hf_config: Any) -> tuple[str, ...]:
        tied = self.table.tied
        head = (tied.head,) if tied is not None and hf_config.tie_word_embeddings else ()
        return tuple(dict.fromkeys(self.table.optional + head))

    def normalize_keys(self, state: StateDict) -> StateDict:
        t = self.table
        dropped = t.dropped + tuple(p for key, prefixes in t.dropped_beside if key in state
                                    for p in prefixes)
        bare = (f"{t.bare_prefix}.", *t.heads) if t.bare_prefix else None
        out = {}
        for k, v in state.items():
            if k.endswith(t.ignored) or k.startswith(dropped):
                continue
            for pattern, repl in _renames(t.model_type):
                k, n = pattern.subn(repl, k)
                if n:
                    break
            if bare is not None and not k.startswith(bare):
                k = f"{t.bare_prefix}.{k}"  # a bare *Model checkpoint
            out[k] = v
        return out

    def untied(self, hf_config: Any, state: StateDict) -> tuple[Any, StateDict]:
        """A tied head becomes a copy of the embedding, the config saying it is untied."""
        tied = self.table.tied
        if (tied is None or not hf_config.tie_word_embeddings
                or self.task(hf_config) not in tied.tasks):
            return hf_config, state
        cfg = self.config_class().from_dict({**hf_config.to_dict(),
                                             "tie_word_embeddings": False})
        return cfg, {**state, tied.head: self.head_weight(state)}

    def head_weight(self, state: StateDict) -> torch.Tensor:
        """The head's weight: its own tensor, or the embedding a tied head reads (read only
        then: reads may be costly, see :mod:`glmc.io.partial`)."""
        tied = self.table.tied
        assert tied is not None
        return state[tied.head] if tied.head in state else state[tied.embedding]
