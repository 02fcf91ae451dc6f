"""The fit models by name (a campaign's ``fit.model``): the registry above the models themselves,
so that ``model`` (the interface) imports no implementation."""

from __future__ import annotations

import inspect
from typing import Any

from scalefit.errors import FitError
from scalefit.fit import SigmoidModel
from scalefit.model import CurveModel
from scalefit.powerlaw import PowerLawModel

MODELS: dict[str, type[CurveModel]] = {"sigmoid": SigmoidModel, "power_law": PowerLawModel}
MODEL_NAMES = tuple(MODELS)


def make_model(name: str | CurveModel = "sigmoid", **settings: Any) -> CurveModel:
    """A model by its ``fit.model`` name (``sigmoid`` or ``power_law``) with these settings; settings
    that are None are left at the model's defaults, and settings the model does not take (the
    sigmoid's ``cmid_grid`` for the power law) are ignored. A ``CurveModel`` passes through as a
    clone with the settings applied."""
    if isinstance(name, CurveModel):
        known = name.get_params()
        return name.clone(**{k: v for k, v in settings.items() if v is not None and k in known})
    if name not in MODELS:
        raise FitError(f"unknown fit model {name!r}; one of {', '.join(MODEL_NAMES)}")
    cls = MODELS[name]
    known = set(inspect.signature(cls.__init__).parameters)
    return cls(**{k: v for k, v in settings.items() if v is not None and k in known})
