"""The registries of families, trainable architectures and stock importers (torch-free).

Each family package declares what it holds in its ``__init__`` (names, tasks, help texts, and
where the code lives as ``"module:attribute"``); the code is imported the first time it is
asked for. So the command line lists every architecture and checks ``--arch`` without
importing torch, and there is one definition of each name: its declaration.

    declare_family("transformer", "glmc.families.transformer.family:TransformerFamily")
    declare_arch("gpt2", family="transformer", task="causal_lm",
                 help="GPT2LMHeadModel on text", impl="glmc.families.transformer.train:GPT2Arch")
    declare_importer(("gpt2",), "glmc.families.transformer.gpt2:GPT2Importer")
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from glmc._lazy import resolve
from glmc.errors import GlmcError

T = TypeVar("T")
_INSTANCES: dict[str, Any] = {}  # one instance per class, whatever names declare it


@dataclass
class Entry(Generic[T]):
    """A declared plug-in: its name, where its class lives, what is known without importing it
    (``info``, set on the instance), and its instance once made."""

    name: str
    impl: str
    info: dict[str, Any] = field(default_factory=dict)
    _instance: T | None = None

    def get(self) -> T:
        if self._instance is None:
            if self.impl not in _INSTANCES:
                _INSTANCES[self.impl] = resolve(self.impl)()
            instance = _INSTANCES[self.impl]
            for k, v in self.info.items():
                setattr(instance, k, v)
            self._instance = instance
        return self._instance


class Registry(Mapping[str, T]):
    """Name -> instance, made on first look-up; ``entries`` holds the declarations."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.entries: dict[str, Entry[T]] = {}

    def declare(self, key: str, impl: str, **info: Any) -> None:
        if key in self.entries:
            raise ValueError(f"{self.what} {key!r} is declared twice")
        self.entries[key] = Entry(key, impl, info)

    def __getitem__(self, name: str) -> T:
        return self.entries[name].get()

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def info(self, name: str, key: str) -> Any:
        return self.entries[name].info[key]


# (Values typed Any: the classes live above this module, which imports none of them.)
#: Family name -> :class:`~glmc.families.base.Family`.
FAMILIES: Registry[Any] = Registry("family")
#: Architecture name (``glmc train --arch``) -> :class:`~glmc.families.base.Arch`; each entry's
#: info holds its ``family``, ``task`` and ``help``.
ARCHS: Registry[Any] = Registry("architecture")
#: transformers' ``config.model_type`` -> :class:`~glmc.families.importers.Importer`.
IMPORTERS: Registry[Any] = Registry("importer")


def declare_family(name: str, impl: str) -> None:
    FAMILIES.declare(name, impl)


def declare_arch(name: str, *, family: str, task: str, help: str, impl: str) -> None:
    ARCHS.declare(name, impl, name=name, family=family, task=task, help=help)


def declare_importer(model_types: tuple[str, ...], impl: str) -> None:
    for t in model_types:
        IMPORTERS.declare(t, impl)


def family_named(name: str, where: str = "") -> Any:
    if name not in FAMILIES:
        at = f"{where}: " if where else ""
        raise GlmcError(f"{at}unknown model family {name!r} (one of {', '.join(FAMILIES)})")
    return FAMILIES[name]


def family_of(config: Any) -> Any:
    """The family of a canonical config (by its class's ``family`` name)."""
    return FAMILIES[type(config).family]


def arch_named(name: str) -> Any:
    if name not in ARCHS:
        raise GlmcError(f"unknown architecture {name!r} (one of {', '.join(ARCHS)})")
    return ARCHS[name]


def importer_for(model_type: str, where: str = "") -> Any:
    if model_type not in IMPORTERS:
        at = f"{where}: " if where else ""
        raise GlmcError(f"{at}unsupported architecture {model_type!r} (supported: "
                        f"{', '.join(sorted(IMPORTERS))})")
    return IMPORTERS[model_type]
