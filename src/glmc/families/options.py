"""The training options each family declares (torch-free): what ``glmc train`` takes for the
model's shape beside the options every run has (:class:`~glmc.training.options.TrainConfig`).

A family's package declares its options in its ``__init__``, as data::

    declare_train_options("convnet", (
        TrainOption("width", int, 1, "multiplier of every hidden width", minimum=1), ...),
        check=check_convnet_options)

and ``glmc train --help`` lists them, one group per family, from these declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from glmc.errors import GlmcError
from glmc.families.registry import ARCHS


@dataclass(frozen=True)
class TrainOption:
    """One training option: ``--NAME`` (underscores as dashes) on the command line.

    Attributes:
        name: the field's name (in the training record and ``TrainConfig``).
        type: the value's type (int, float, str); the default may be None ("unset").
        default: the value when not given.
        help: one line for ``--help``.
        choices: the values allowed, or None.
        aliases: further flags (``--mlp`` for ``--n-inner``).
        minimum: the least value allowed (None: any; an unset value is not checked).
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    aliases: tuple[str, ...] = ()
    minimum: int | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> None:
        """Raise GlmcError on a value this option does not allow, naming the option."""
        if self.choices is not None and value not in self.choices:
            raise GlmcError(f"{self.name} must be one of {', '.join(map(str, self.choices))}, "
                            f"got {value!r}")
        if self.minimum is not None and value is not None and value < self.minimum:
            raise GlmcError(f"{self.name} must be at least {self.minimum}, got {value}")


@dataclass(frozen=True)
class FamilyOptions:
    """A family's training options and the check of how they go together (``check(values)``
    raises GlmcError; each option's own range is checked before)."""

    family: str
    options: tuple[TrainOption, ...]
    check: Callable[[Mapping[str, Any]], None] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    @property
    def defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}


#: Family name -> its declared training options.
TRAIN_OPTIONS: dict[str, FamilyOptions] = {}


def declare_train_options(family: str, options: tuple[TrainOption, ...],
                          check: Callable[[Mapping[str, Any]], None] | None = None) -> None:
    if family in TRAIN_OPTIONS:
        raise ValueError(f"training options of family {family!r} are declared twice")
    clash = sorted(declared_names() & {o.name for o in options})
    if clash:  # (one flag per name: glmc train takes every family's)
        raise ValueError(f"training option {clash[0]!r} is declared by two families")
    TRAIN_OPTIONS[family] = FamilyOptions(family, options, check)


def options_of(arch: str) -> FamilyOptions | None:
    """The training options of architecture ``arch``'s family (None: no such architecture)."""
    if arch not in ARCHS.entries:
        return None
    family = ARCHS.info(arch, "family")
    return TRAIN_OPTIONS.get(family, FamilyOptions(family, ()))


def declared_names() -> set[str]:
    """The names of every family's options."""
    return {o.name for f in TRAIN_OPTIONS.values() for o in f.options}


def train_option(name: str) -> TrainOption:
    """The option some family declares under ``name``."""
    for family in TRAIN_OPTIONS.values():
        for option in family.options:
            if option.name == name:
                return option
    raise KeyError(name)
