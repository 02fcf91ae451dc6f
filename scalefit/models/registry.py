"""The fit models by name (a campaign's ``fit.model``): the registry above the models themselves,
so that ``base`` (the interface) imports no implementation.

The sigmoid and the power law are built in. A new model is a module ``scalefit/models/model_NAME.py`` whose
class is decorated with ``@register``: every ``model_*`` module of this package is imported when the
registry is first read, so no central file names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import scalefit.models
from scalefit.errors import FitError
from scalefit.models.base import CurveModel
from scalefit.models.powerlaw import PowerLawModel
from scalefit.models.sigmoid import SigmoidModel

MODELS: dict[str, type[CurveModel]] = {"sigmoid": SigmoidModel, "power_law": PowerLawModel}
MODULE_PREFIX = "model_"  # modules of the scalefit.models package the registry loads
_scanned = False


def register(cls: type[CurveModel]) -> type[CurveModel]:
    """Add a model to the registry under its ``name`` (a class decorator); a name taken by another
    class, a missing name or a model without a declaration is refused."""
    if not cls.name:
        raise FitError(f"{cls.__name__} has no name: set name = '...', the campaign's fit.model")
    if not len(cls.parameters):
        raise FitError(f"{cls.__name__} declares no parameters: set parameters = Parameters(...)")
    taken = MODELS.get(cls.name)
    if taken is not None and taken.__qualname__ != cls.__qualname__:
        raise FitError(f"fit model {cls.name!r} is already registered by {taken.__name__}")
    MODELS[cls.name] = cls
    return cls


def registered(rescan: bool = False) -> dict[str, type[CurveModel]]:
    """Every model by name, after importing each ``model_*`` module of the package once."""
    global _scanned
    if rescan or not _scanned:
        for mod in pkgutil.iter_modules(scalefit.models.__path__):
            if mod.name.startswith(MODULE_PREFIX):
                importlib.import_module(f"scalefit.models.{mod.name}")
        _scanned = True
    return MODELS


def model_names() -> tuple[str, ...]:
    return tuple(registered())


def make_model(name: str | CurveModel = "sigmoid", **settings: Any) -> CurveModel:
    """A model by its ``fit.model`` name with these settings. A setting that is None is left at the
    model's default (not given); one the model does not take is refused, naming those it takes. A
    ``CurveModel`` passes through as a clone with the settings applied."""
    if isinstance(name, CurveModel):
        proto = name
    else:
        models = registered()
        if name not in models:
            raise FitError(f"unknown fit model {name!r}; one of {', '.join(models)}")
        proto = models[name]()
    given = {k: v for k, v in settings.items() if v is not None}
    known = proto.get_params()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise FitError(
            f"fit model {proto.name!r} takes no setting {', '.join(map(repr, unknown))};"
            f" its settings: {', '.join(known)}"
        )
    return proto.clone(**given)
