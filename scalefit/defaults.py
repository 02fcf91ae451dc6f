"""The library's defaults, each written once: the margin a comparison or prediction is judged by
and the coverage of intervals and bands (a campaign's ``fit:`` section starts from them too)."""

DEFAULT_MARGIN = 0.02  # the paper's margin on A (the run-to-run spread of A), and a prediction's target accuracy
DEFAULT_LEVEL = 0.9  # coverage of intervals and bands
