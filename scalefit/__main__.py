from scalefit.cli import main, run_cli

raise SystemExit(run_cli(main))
