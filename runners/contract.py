"""What runs and the code around them agree on, below both ``runners.rl`` (which writes runs) and
``runners.campaign`` and ``runners.tracking`` (which schedule and track them), and read by
``analysis``: the metrics every run logs at each evaluation, the compute axes beside them, and the
files that mark a run's folder.
The MLflow tag names and queries are ``runners.tracking.store``'s."""

from __future__ import annotations

# Metrics every run logs at step 0 and every eval.every steps.
MEAN_AT_16 = "val/mean_at_16"
PASS_AT_16 = "val/pass_at_16"
# Logged once, at a run's end (and in its done.json): the best MEAN_AT_16 of its evaluations.
BEST_MEAN_AT_16 = "val/best_mean_at_16"
# The compute axes logged beside them (a fit's x): device-hours (wall-clock × devices),
# completions generated, tokens processed, and FLOPs estimated from them.
COMPUTE_METRICS = ("compute/gpu_hours", "compute/samples", "compute/tokens", "compute/flops")

# Files in a run's folder.
STOP_FILE = "STOP"  # the run ends at its next step, at a checkpoint (an adaptive campaign's decision)
DONE_FILE = "done.json"  # the run finished: its final result; nothing is left to train
