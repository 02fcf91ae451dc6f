"""`python -m scalefit`: the fitter's CLI (scalefit/cli.py), quiet when its reader closes the pipe early (run_cli)."""

from scalefit.cli import main, run_cli

raise SystemExit(run_cli(main))
