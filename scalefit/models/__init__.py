"""The curve forms and their fits: the formulas (``curve``), a model's declared parameters
(``parameters``), the model interface (``base``: ``CurveModel``/``CurveFit``), the sigmoid
(``sigmoid``), the power law (``powerlaw``), a model from its declaration alone (``declared``), the
batched least squares they share (``lm``), the search grids (``grids``) and the registry by name
(``registry``, which also loads every ``model_*.py`` module of this folder). Imports only
``scalefit.errors``/``scalefit.defaults``: nothing here knows of forecasts."""
