"""Errors that scalefit reports to users instead of tracebacks."""

from __future__ import annotations


class FitError(ValueError):
    """The data cannot be fitted as given; the message says why and what to change. Raised with a
    ``scalefit.reasons.Reason``, it keeps it as data (``why``)."""

    @property
    def why(self) -> str:
        """The message as it was raised: the ``Reason`` itself where it was one (``str(e)`` is its text)."""
        return self.args[0] if len(self.args) == 1 and isinstance(self.args[0], str) else str(self)
