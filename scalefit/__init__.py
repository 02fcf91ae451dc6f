"""scalefit: fit sigmoidal compute→performance curves (ScaleRL, arXiv 2510.13786).

Rooms by concern, each importing only itself and the rooms listed before it (``tests/test_layout.py``
checks): the shared ``errors`` and ``defaults``; ``models`` (curve forms, their fits and the registry
by name); ``data`` (curves read, results written, unstable runs, synthetic curves); ``forecasts``
(bands, backtests, verdicts, calls); ``decide`` (comparisons, early stops, calls from the data
alone); ``sizes`` (across model size); and the command line, ``cli`` (``python -m scalefit``). This
module, the public API, re-exports the names below.
"""

from scalefit.decide.compare import Comparison, compare_fits
from scalefit.decide.stop import StopDecision, decide_stop
from scalefit.errors import FitError
from scalefit.forecasts.interface import CampaignForecast, Forecast, Verdict, call_difference
from scalefit.forecasts.single import SingleForecast, fit_and_forecast, forecast
from scalefit.forecasts.uncertainty import Bootstrap, SeedSpread, bootstrap, seed_spread
from scalefit.models.base import CurveFit, CurveModel
from scalefit.models.curve import power_law, sigmoid
from scalefit.models.powerlaw import PowerLawFit, PowerLawModel, fit_power_law
from scalefit.models.registry import make_model
from scalefit.models.sigmoid import SigmoidFit, SigmoidModel, fit_sigmoid

__all__ = [
    "Bootstrap",
    "CampaignForecast",
    "Comparison",
    "CurveFit",
    "CurveModel",
    "FitError",
    "Forecast",
    "SingleForecast",
    "Verdict",
    "PowerLawFit",
    "PowerLawModel",
    "SeedSpread",
    "SigmoidFit",
    "SigmoidModel",
    "bootstrap",
    "call_difference",
    "StopDecision",
    "compare_fits",
    "decide_stop",
    "fit_and_forecast",
    "fit_power_law",
    "fit_sigmoid",
    "make_model",
    "forecast",
    "power_law",
    "seed_spread",
    "sigmoid",
]
