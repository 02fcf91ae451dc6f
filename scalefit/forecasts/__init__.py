"""Forecasts of fitted curves: the interface every forecast answers (``interface``: ``Forecast``,
``Verdict``, calls), a curve fitted alone (``single``: ``SingleForecast``), a campaign's joint fit
(``pooled_fit``) and its forecasts (``pooled``), seeds as the unit of uncertainty (``seeds``), the
sigmoid's bootstrap and seed spread (``uncertainty``), a campaign's fit settings (``settings``), the
slower-or-lower reading a call carries (``slower_or_lower``) and the figures (``plot``). Imports the
models and data below it, never the decisions, the sizes study or the command line above it."""
