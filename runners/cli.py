"""Command line: ``python -m runners plan|train|base-model``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from runners.recipe import RecipeError, load_recipe, parse_override


def _recipe(args: argparse.Namespace):
    return load_recipe(args.recipe, dict(parse_override(s) for s in args.set or []))


def cmd_plan(args: argparse.Namespace) -> int:
    from runners.plan import format_plan

    print(format_plan(_recipe(args)))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    recipe = _recipe(args)
    from runners.train import train

    run_dir = Path(args.run_dir or f"artifacts/runs/{recipe.name.replace('/', '-')}-seed{recipe.train.seed}")
    print(f"recipe {recipe.name}: {recipe.train.steps} steps → {run_dir}", flush=True)
    t0 = time.perf_counter()
    if os.environ.get("MLFLOW_RUN_ID"):
        from runners.tracking import tracked_train

        final = tracked_train(recipe, run_dir, log=lambda m: print(m, flush=True))
    else:
        final = train(recipe, run_dir, log=lambda m: print(m, flush=True))
    print(
        f"done in {time.perf_counter() - t0:.0f} s: best mean@16 {final['val/best_mean_at_16']:.3f}, "
        f"{final['compute/gpu_hours']:.4f} device-hours"
    )
    return 0


def cmd_base_model(args: argparse.Namespace) -> int:
    from runners.basemodel import ensure_base_model
    from runners.data import task_of

    recipe = _recipe(args)
    if recipe.model.size is None:
        raise RecipeError("base-model: this recipe uses model.path, there is nothing to build")
    t0 = time.perf_counter()
    path = ensure_base_model(recipe.model.size, task_of(recipe), log=lambda m: print(m, flush=True))
    print(f"{path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from runners.campaign import run_campaign

    t0 = time.perf_counter()
    summary = run_campaign(args.campaign, only_axis=args.axis, dry_run=args.dry_run, log=lambda m: print(m, flush=True))
    if args.dry_run:
        return 0
    failures = summary["failures"]
    if not args.no_fit:
        from analysis.loo import write_report

        camp = summary["campaign"]
        try:
            write_report(
                camp.name,
                Path("artifacts/campaigns") / camp.name / "fit",
                camp.fit,
                tracking_uri=summary["tracking_uri"],
                parent_run_id=summary["parent_run_id"],
            )
            print(f"run reports: {Path('artifacts/campaigns') / camp.name / 'fit' / 'runs.md'}")
        except ValueError as e:
            print(f"fit skipped: {e}")
    print(
        f"campaign finished: {summary['ran']} run(s) executed, {len(failures)} failed; "
        f"wall time {time.perf_counter() - t0:.0f} s"
    )
    for spec, tail in failures:
        print(f"  FAILED {spec.variant} seed {spec.seed}:\n    " + tail.replace("\n", "\n    "))
    return 1 if failures else 0


def cmd_import(args: argparse.Namespace) -> int:
    from runners.tracking import default_tracking_uri
    from runners.transfer import import_store

    src = args.source if "://" in args.source else f"sqlite:///{Path(args.source).resolve()}"
    if "://" not in args.source and not Path(args.source).is_file():
        raise FileNotFoundError(f"import: {args.source}: no such MLflow store file")
    root = Path(args.artifacts) if args.artifacts else None
    if root is not None and not root.is_dir():
        raise FileNotFoundError(f"import: --artifacts {root}: no such folder")
    dest = args.tracking_uri or default_tracking_uri()
    counts = import_store(src, dest, artifacts_root=root, experiments=args.experiment, log=print)
    print(f"{counts['runs']} run(s), {counts['metrics']} metric points → {dest}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runners", description="RL runs of ScaleRL-style recipes on TRL.")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("recipe", help="recipe file or name in experiments/recipes (e.g. scalerl)")
        sp.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a recipe key, e.g. --set algorithm.loss=dapo (repeatable)",
        )
        sp.set_defaults(func=func)
        return sp

    add("plan", cmd_plan, "print the batch plan: rollouts, updates, accumulation, memory, TRL arguments")
    t = add("train", cmd_train, "run one recipe end to end (resumes from its last checkpoint)")
    t.add_argument("--run-dir", help="output folder (default artifacts/runs/NAME-seedS)")
    add("base-model", cmd_base_model, "build (or find cached) the embedded base model of a recipe")
    c = sub.add_parser(
        "campaign",
        help="run a campaign (baseline + LOO variants x seeds), then fit it",
        description="Run every run of a campaign that is not done yet, tracked in MLflow, then fit "
        "the LOO table. Re-running skips finished runs and resumes interrupted ones.",
    )
    c.add_argument("campaign", help="campaign file or name in experiments/campaigns (e.g. loo-cpu)")
    c.add_argument("--axis", help="run only the baseline's variants along this axis")
    c.add_argument("--dry-run", action="store_true", help="list every run, its identity and status; run nothing")
    c.add_argument("--no-fit", action="store_true", help="skip the fit at the end")
    c.set_defaults(func=cmd_campaign)
    i = sub.add_parser(
        "import",
        help="copy the runs of an MLflow store made elsewhere (e.g. a GPU machine) into the local store",
        description="Copy experiments, runs (parent/child kept), params, tags, full metric histories and "
        "artifacts from another MLflow store into the local one. Safe to repeat: copied runs are skipped.",
    )
    i.add_argument("source", help="the other store: a SQLite file (mlflow.db) or a tracking URI")
    i.add_argument("--artifacts", help="folder that served the source's mlflow-artifacts:/ root (its mlartifacts)")
    i.add_argument("--experiment", action="append", help="only this experiment (repeatable; default all)")
    i.add_argument("--tracking-uri", help="destination (default MLFLOW_TRACKING_URI or ./mlflow.db)")
    i.set_defaults(func=cmd_import)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RecipeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
