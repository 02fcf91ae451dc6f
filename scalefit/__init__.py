"""scalefit: fit sigmoidal compute→performance curves (ScaleRL, arXiv 2510.13786)."""

from scalefit.compare import Comparison, compare_fits
from scalefit.curve import power_law, sigmoid
from scalefit.errors import FitError
from scalefit.fit import SigmoidFit, fit_sigmoid
from scalefit.forecast import Forecast, Verdict, forecast
from scalefit.powerlaw import PowerLawFit, fit_power_law
from scalefit.uncertainty import Bootstrap, SeedSpread, bootstrap, seed_spread

__all__ = [
    "Bootstrap",
    "Comparison",
    "FitError",
    "Forecast",
    "Verdict",
    "PowerLawFit",
    "SeedSpread",
    "SigmoidFit",
    "bootstrap",
    "compare_fits",
    "fit_power_law",
    "fit_sigmoid",
    "forecast",
    "power_law",
    "seed_spread",
    "sigmoid",
]
