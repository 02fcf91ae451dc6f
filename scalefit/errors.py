"""Errors that scalefit reports to users instead of tracebacks."""


class FitError(ValueError):
    """The data cannot be fitted as given; the message says why and what to change."""
