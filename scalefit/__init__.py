"""scalefit: fit sigmoidal compute→performance curves (ScaleRL, arXiv 2510.13786)."""

from scalefit.compare import Comparison, compare_fits
from scalefit.curve import power_law, sigmoid
from scalefit.decide import StopDecision, decide_stop
from scalefit.errors import FitError
from scalefit.fit import SigmoidFit, SigmoidModel, fit_sigmoid
from scalefit.forecast import SingleForecast, fit_and_forecast, forecast
from scalefit.model import CurveFit, CurveModel
from scalefit.models import make_model
from scalefit.powerlaw import PowerLawFit, PowerLawModel, fit_power_law
from scalefit.prediction import CampaignForecast, Forecast, Verdict, call_difference
from scalefit.uncertainty import Bootstrap, SeedSpread, bootstrap, seed_spread

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
