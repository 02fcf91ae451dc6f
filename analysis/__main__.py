"""`python -m analysis`: the analysis CLI (analysis/cli.py), quiet when its reader closes the pipe early
(scalefit.cli.run_cli)."""

from analysis.cli import main
from scalefit.cli import run_cli

raise SystemExit(run_cli(main))
