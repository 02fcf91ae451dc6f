"""Curves in and results out, before and after any forecast: compute→value curves read from a CSV
(``curves_csv``), results written as JSON (``outputs``), runs that collapsed below their sibling
seeds (``unstable``) and synthetic curves from the paper's published fits (``synthetic``). Below the
forecasts; imports only ``scalefit.models`` (the curve formulas) and the shared errors."""
