"""The policy losses a recipe may name (``algorithm.loss``): one module each in this folder, each a
:class:`Loss` that carries everything about it: TRL's ``loss_type`` and ``importance_sampling_level``,
its own recipe settings (name, default, check), how they map to GRPOConfig's arguments, and the
normaliser TRL divides its per-token loss by (which ``runners.rl.trainer.aggregation_weights`` needs).

``runners.recipe`` takes from here the allowed names, the ``AlgorithmConfig`` fields of every loss's
settings and their checks; ``runners.rl.plan.trl_args``, the one recipe→TRL mapping, asks the running
loss for its TRL arguments; ``runners.identity`` which settings name a run. Imports no torch (recipes
load without it). A new loss is one module here, its test and its docs row (docs/extending.md)."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Value = float | tuple[float, ...]
Normaliser = Literal["token_sum", "sequence_mean"]
NORMALISERS: tuple[str, ...] = typing.get_args(Normaliser)


@dataclass(frozen=True)
class Setting:
    """One recipe setting of a loss: the ``algorithm.KEY`` a recipe writes, its default and its check.

    ``check`` says what is wrong with a value, naming the fix (None: nothing). A pair's default (a
    tuple) makes the key a list of that many numbers."""

    key: str
    default: Value
    check: Callable[[Any], str | None]
    doc: str = ""  # one phrase, for the recipe's comments and the docs

    @property
    def type(self) -> Any:
        """Its ``AlgorithmConfig`` field type: ``float``, or a tuple of as many floats as the default."""
        if isinstance(self.default, tuple):
            return tuple[tuple(float for _ in self.default)]
        return float


@dataclass(frozen=True)
class Loss:
    """How one loss runs in TRL, and its own settings.

    ``trl`` maps the settings' values (keyword arguments named by their keys) to GRPOConfig's keyword
    arguments. ``normaliser`` is what TRL divides the loss by: ``token_sum``, every kept token of the
    batch (one sum over tokens); ``sequence_mean``, each completion's own token count, then the mean
    over completions (TRL's ``grpo`` and ``sapo``)."""

    name: str
    trl_loss_type: str
    importance_sampling_level: Literal["token", "sequence"]
    normaliser: Normaliser
    settings: tuple[Setting, ...]
    trl: Callable[..., dict[str, Any]]
    note: str = ""  # what it is, in a phrase: errors about its settings and the batch plan quote it

    def values(self, algorithm: Any) -> dict[str, Any]:
        """Its settings' values in a recipe's ``algorithm`` section, by key."""
        return {s.key: getattr(algorithm, s.key) for s in self.settings}

    def trl_args(self, algorithm: Any) -> dict[str, Any]:
        """GRPOConfig's keyword arguments for this loss with a recipe's settings."""
        return {
            "loss_type": self.trl_loss_type,
            "importance_sampling_level": self.importance_sampling_level,
            **self.trl(**self.values(algorithm)),
        }


def positive(typical: str = "") -> Callable[[float], str | None]:
    """The check of a number that must be > 0 (``typical``: its usual values, quoted in the error)."""
    hint = f" ({typical})" if typical else ""
    return lambda v: None if v > 0 else f"must be > 0{hint}"


def clip_pair(typical: str = "") -> Callable[[tuple[float, float]], str | None]:
    """The check of a clip pair (low, high): 0 < low < 1 and high > 0."""
    hint = f" ({typical})" if typical else ""
    return lambda v: None if 0 < v[0] < 1 and v[1] > 0 else f"need 0 < low < 1 and high > 0{hint}"


LOSSES: dict[str, Loss] = {}


def register(loss: Loss) -> Loss:
    """Make ``loss`` a value ``algorithm.loss`` takes (each module of this folder registers its own).
    Its settings' keys start with its name, so an unknown ``algorithm.NAME_...`` key can list them."""
    if wrong := [s.key for s in loss.settings if not s.key.startswith(f"{loss.name}_")]:
        raise ValueError(f"loss {loss.name!r}: setting {wrong[0]!r} must start with {loss.name + '_'!r}")
    if loss.normaliser not in NORMALISERS:
        raise ValueError(
            f"loss {loss.name!r}: normaliser {loss.normaliser!r} is not one aggregation_weights knows "
            f"({', '.join(NORMALISERS)}); add its weights to runners.rl.trainer.aggregation_weights first"
        )
    LOSSES[loss.name] = loss
    return loss


def scan() -> dict[str, Loss]:
    """Import every module of this folder (each registers its loss), in name order; the registry."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")
    return LOSSES


def setting_fields() -> list[tuple[str, Any, Any]]:
    """Every registered loss's settings as ``dataclasses.make_dataclass`` fields (``AlgorithmConfig``'s)."""
    return [(s.key, s.type, dataclasses.field(default=s.default)) for loss in LOSSES.values() for s in loss.settings]


def unknown_setting(key: str) -> str | None:
    """Why ``algorithm.KEY`` is no setting, where it names a loss (``sapo_epsilon``): that loss's own
    settings and what it is; None for any other key."""
    for loss in LOSSES.values():
        if key.startswith(f"{loss.name}_"):
            own = ", ".join(f"algorithm.{s.key}" for s in loss.settings) or "none"
            note = f" ({loss.note})" if loss.note else ""
            return f"the {loss.name} loss has no such setting{note}; its settings are: {own}"
    return None


scan()
