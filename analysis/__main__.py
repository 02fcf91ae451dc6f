from analysis.cli import main
from scalefit.cli import run_cli

raise SystemExit(run_cli(main))
