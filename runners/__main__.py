"""`python -m runners`: the runners CLI (runners/cli.py), quiet when its reader closes the pipe early
(scalefit.cli.run_cli)."""

from runners.cli import main
from scalefit.cli import run_cli

raise SystemExit(run_cli(main))
