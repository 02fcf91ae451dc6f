"""Across model size (issues 44, 62): predict a larger model's RL curve from smaller ones' runs of one recipe.

This room owns everything between a scale study's curves and the forecast of a size that was not fitted,
one concern a module, every import pointing down this list:

- ``data``: each size's parameter count and evaluations (``SizeData``), read from a curves CSV and checked;
- ``fits``: one size's sigmoid and each parameter's spread (``SizeFit``), a size of several base-model
  builds fitted build by build;
- ``builds``: the between-build spread of A and the size trend stated with it (issue 62);
- ``laws``: A, log C_mid, log B (and R0) as functions of the parameter count, their forms chosen by
  leave-one-size-out error, and draws of a new size's parameters from them;
- ``actual``: a size's own runs against a forecast of them (coverage of the band by curve and by build, its
  own A against the interval once its runs end);
- ``forecast``: ``SizeForecast``, a ``scalefit.forecasts.interface.CurveForecast`` as every forecast is (bands,
  intervals, ``Verdict``, record), complete when built;
- ``backtest``: each fitted size forecast from the others, and the coverage;
- ``judge``: a forecast committed before its size ran, read as written and judged on the runs that came after;
- ``report``: the forecast and a judgment in words and as plots;
- ``command``: the ``sizes`` and ``judge`` subcommands, which ``scalefit.cli`` adds (the command line imports
  this room, never the reverse).

A study's tables (``analysis.sizes``) and ``python -m scalefit sizes`` read it through the names below.
"""

from scalefit.sizes.backtest import SizesBacktest, backtest_sizes
from scalefit.sizes.data import SizeData, read_sizes, size_data
from scalefit.sizes.fits import A_GRID, SizeFit, fit_size
from scalefit.sizes.forecast import SizeForecast, forecast_size
from scalefit.sizes.judge import Committed, judge, read_committed
from scalefit.sizes.laws import MIN_SIZES, Choice, choose_forms
from scalefit.sizes.report import forecast_lines, plot_sizes

__all__ = [
    "A_GRID",
    "MIN_SIZES",
    "Choice",
    "Committed",
    "SizeData",
    "SizeFit",
    "SizeForecast",
    "SizesBacktest",
    "backtest_sizes",
    "choose_forms",
    "fit_size",
    "forecast_lines",
    "forecast_size",
    "judge",
    "plot_sizes",
    "read_committed",
    "read_sizes",
    "size_data",
]
