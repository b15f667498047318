"""The family interface: what an architecture family gives the rest of glmc.

A family (``glmc.families.transformer``, ``glmc.families.convnet``) owns a canonical config
class, the module it builds, the symmetry spec of that module, the stock formats it imports,
and the architectures ``glmc train`` can train. Everything else (matchers, evaluation, the
barrier, the CLI) works on a :class:`~glmc.model.CanonicalModel` through this interface and
the config's task (:mod:`glmc.tasks`), and never names an architecture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from glmc.symmetry.spec import SymmetrySpec
from glmc.tensors import StateDict

if TYPE_CHECKING:
    from glmc.data import Dataset
    from glmc.model import CanonicalModel
    from glmc.training.options import TrainConfig



#: Keys of a stock config that say nothing of the model's shape or function.
METADATA_KEYS = frozenset({"_name_or_path", "architectures", "transformers_version",
                           "torch_dtype", "dtype", "_commit_hash", "id2label", "label2id",
                           "output_attentions", "output_hidden_states", "return_dict"})


def module_shapes(build: Callable[[], nn.Module]) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of the module ``build`` makes (built on the meta device: no
    memory, no initialisation)."""
    with torch.device("meta"):
        module = build()
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def check_shapes(where: Any, state: StateDict, expected: dict[str, tuple[int, ...]],
                 optional: tuple[str, ...] = (), *, shown: dict[str, str] | None = None,
                 needs: str = "the config implies") -> None:
    """Every expected tensor present with its shape, and no unknown tensor; else a GlmcError
    naming the first offender (as ``shown`` names it: a checkpoint's own name) and its shape.
    ``needs``: what the expected shape comes from, for the message."""
    from glmc.errors import GlmcError

    show = (shown or {}).get
    for name, shape in expected.items():
        if name not in state:
            if name in optional:
                continue
            raise GlmcError(f"{where}: tensor {name} (shape {list(shape)}) is missing")
        got = tuple(state[name].shape)
        if got != tuple(shape):
            raise GlmcError(f"{where}: tensor {show(name, name)} has shape {list(got)}, "
                            f"{needs} {list(shape)}")
    unknown = sorted(set(state) - set(expected))
    if unknown:
        first = f"{show(unknown[0], unknown[0])} (shape {list(state[unknown[0]].shape)})"
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise GlmcError(f"{where}: unexpected tensor {first}{more}")


class ModelConfig:
    """What every family's canonical config (a dataclass) shares: its family's name, its
    task's name (``task``), and a JSON form that rejects unknown keys."""

    family: ClassVar[str]

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def describe(self) -> str:
        """The model in a few words, for messages."""
        return f"a {self.family} model"

    def field_name(self, name: str, other: Any = None) -> str:
        """How the user's own config calls canonical field ``name`` (the stock config field
        it was copied from, for a model imported from one), for messages; else ``name``.
        With ``other``, the name both configs call it by, else ``name``."""
        return name

    def differences(self, other: Any) -> list[str]:
        """The fields in which ``other`` (a config of the same class) differs, in words
        (``"n_layer (2 in A, 3 in B)"``): the stock configs' own fields where both models came
        from one (the user's terms), else the canonical ones."""
        mine, theirs = (c.source.get("config") if isinstance(getattr(c, "source", None), dict)
                        else None for c in (self, other))
        if not (isinstance(mine, dict) and isinstance(theirs, dict)):
            skip = {"source"}
            mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)  # type: ignore
        else:
            skip = METADATA_KEYS
        return [f"{k} ({mine.get(k)} in A, {theirs.get(k)} in B)"
                for k in sorted(set(mine) | set(theirs))
                if k not in skip and mine.get(k) != theirs.get(k)]


    @classmethod
    def from_json(cls, d: dict) -> Any:
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown {cls.family} config keys {sorted(unknown)}")
        return cls(**d)


@dataclass(frozen=True)
class Probe:
    """A point inside the module where a space's units can be observed on data.

    ``module`` is a submodule's name; the tensor observed there is its output (``point``
    ``"output"``) or its first input (``"input"``: what a linear layer reads, such as the
    heads' outputs before an attention's output projection), and its axis ``axis`` lists the
    units of ``space`` in the model's order (1: the channels of (N, C, ...) or the features
    of (N, F); -1: the features of (B, T, F)). ``affine``: the tensors (weight, bias), both
    indexed by that axis, through which an affine correction of each unit's output is folded
    in (REPAIR reads only such probes); None where the output cannot be rescaled that way.
    ``activation``: the nonlinearity the model applies to that output next (``"relu"``),
    which activation matching applies before correlating (None: the output as it is, which
    is then what the next layer reads). ``stream``: the probe observes a space that several
    writers add to where the sum itself is (a residual stream after the addition, what every
    reader reads), not one writer's term of it.
    """

    module: str
    space: str
    affine: tuple[str, str] | None = None
    activation: str | None = None
    point: str = "output"
    axis: int = 1
    stream: bool = False

    def __post_init__(self) -> None:
        if self.point not in ("output", "input"):
            raise ValueError(f"probe {self.module}: point must be 'output' or 'input', got "
                             f"{self.point!r}")


class Family:
    """An architecture family; one instance per family, registered in ``FAMILIES``."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    #: The canonical form is the model as trained (no rewrite): averaging "as loaded" (align
    #: method ``none``) is averaging the canonical weights.
    canonical_is_stock: ClassVar[bool] = False
    #: The architectures whose plain state dicts :meth:`read_state_dict` reads.
    state_dict_archs: ClassVar[tuple[str, ...]] = ()

    def build(self, config: Any, state: StateDict | None = None) -> nn.Module:
        """The module of ``config`` in eval mode, with ``state`` loaded strictly when given
        (its dtype then follows ``state``)."""
        raise NotImplementedError

    def spec(self, config: Any) -> SymmetrySpec:
        raise NotImplementedError

    def uncentred_writer(self, model: CanonicalModel, tol: float) -> tuple[str, float] | None:
        """The first residual writer that is not mean-zero (see CanonicalModel)."""
        return None

    def token_rows(self, config: Any) -> dict[str, int]:
        """Tensors with an axis indexed by the vocabulary (name -> axis), for token masks."""
        return {}

    def circuit_form(self, model: CanonicalModel) -> CanonicalModel:
        """The same function with attention heads as circuits (``--heads circuit``)."""
        from glmc.errors import GlmcError

        raise GlmcError(f"{self.name} models have no attention heads to write as circuits")

    def embed_into(self, model: CanonicalModel, config: Any, where: str = "") -> CanonicalModel:
        """``model`` as a model of the wider ``config`` that computes its function (a
        narrower B aligned to A), or a GlmcError saying why it cannot be; ``model`` itself
        where the family has no such embedding (the pair's check then names the
        difference)."""
        return model

    def read_state_dict(self, state: StateDict, where: str, **hints: Any) -> CanonicalModel:
        """A plain state dict (a PyTorch or safetensors file's, not a model folder) in one of
        the family's layouts; ``hints``: what its tensors do not say (arch, image size...)."""
        from glmc.errors import GlmcError

        raise GlmcError(f"{where}: {self.name} models are read from model folders")

    #: Layouts :meth:`export_state_dict` writes (besides the canonical names themselves).
    export_layouts: ClassVar[tuple[str, ...]] = ()

    def export_state_dict(self, model: CanonicalModel, layout: str) -> StateDict:
        """The model's tensors under a layout's names, for a module built elsewhere."""
        from glmc.errors import GlmcError

        raise GlmcError(f"{self.name} models have no state-dict layout {layout!r}; they are "
                        "written as model folders")

    def probes(self, config: Any) -> list[Probe]:
        """Where each space's units can be observed (activation matching, REPAIR)."""
        return []


class Arch:
    """An architecture ``glmc train`` can train from scratch (``--arch NAME``).

    ``model_config`` derives the architecture's config from the training options and the
    data; ``build`` initialises a fresh module from torch's global RNG; ``save`` writes a
    folder that :func:`glmc.io.folders.load_model` reads.
    """

    name: ClassVar[str]
    task: ClassVar[str]
    help: ClassVar[str]

    def model_config(self, cfg: TrainConfig, ds: Dataset) -> Any:
        raise NotImplementedError

    def describe(self, cfg: TrainConfig) -> str:
        """The model a training config makes, in a few words (for reports)."""
        return self.name

    def config_to_json(self, config: Any) -> dict:
        return config.to_json()

    def config_from_json(self, raw: dict) -> Any:
        raise NotImplementedError

    def build(self, config: Any) -> nn.Module:
        raise NotImplementedError

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x)

    def save(self, model: nn.Module, config: Any, folder: Any) -> None:
        raise NotImplementedError
