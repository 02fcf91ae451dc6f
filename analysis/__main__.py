from analysis.cli import main
from runners.cli import run_cli

raise SystemExit(run_cli(main))
