"""Command line: ``python -m runners plan|train|base-model|campaign|import|ui|tracking-server``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path

from runners.campaign.spec import CampaignError
from runners.launch import TrainCall, train_command
from runners.locks import Busy
from runners.parent_death import die_with_parent
from runners.permissions import GroupError, restricted
from runners.recipe import RecipeError, load_recipe, parse_override
from runners.runfolder import RunFolderError
from runners.threads import configure
from runners.tracking.postgres import PostgresError
from runners.tracking.server_processes import ServerError
from runners.tracking.store import StoreError


def _recipe(args: argparse.Namespace):
    return load_recipe(args.recipe, dict(parse_override(s) for s in args.set or []))


def cmd_plan(args: argparse.Namespace) -> int:
    from runners.rl.plan import format_plan
    from runners.rl.sharding import Layout

    if args.gpus < 1:
        raise RecipeError(f"--gpus {args.gpus}: pass 1 or more")
    if args.campaign and args.recipe:
        raise RecipeError(f"plan: a recipe ({args.recipe}) or --campaign {args.campaign}, not both")
    if not (args.campaign or args.recipe):
        raise RecipeError("plan: name a recipe (e.g. scalerl) or a campaign (--campaign loo-cpu)")
    if args.campaign:
        from runners.campaign.load import campaign_baseline

        recipe, about = campaign_baseline(args.campaign, dict(parse_override(s) for s in args.set or []))
        print(about + "\n")
    else:
        recipe = _recipe(args)
    print(format_plan(recipe, Layout.from_config(args.accelerate_config, args.gpus)))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    call = TrainCall(
        recipe=args.recipe,
        sets=args.set or [],
        run_dir=Path(args.run_dir) if args.run_dir else None,
        experiment=args.experiment,
        untracked=args.untracked,
        new_store=args.new_store,
        gpus=args.gpus,
        accelerate_config=args.accelerate_config,
    )
    return train_command(_recipe(args), call)  # the recipe validates before any process is launched


def cmd_base_model(args: argparse.Namespace) -> int:
    from runners.task.basemodel import ensure_base_model

    recipe = _recipe(args)
    if recipe.model.size is None:
        raise RecipeError("base-model: this recipe uses model.path, there is nothing to build")
    t0 = time.perf_counter()
    path = ensure_base_model(
        recipe.model.size, recipe.data.task, build_seed=recipe.model.build_seed, log=lambda m: print(m, flush=True)
    )
    print(f"{path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from runners.campaign.runs import CampaignStopped, run_campaign, signal_of, stop_code
    from runners.tracking.mlflow_server import Stopped, stop_on_signals
    from runners.tracking.store import check_store, default_tracking_uri

    check_store(default_tracking_uri())  # a corrupt store is one line, before a lock, a server or a run
    t0 = time.perf_counter()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}  # an in-process caller's
    stop_on_signals(once=True)  # SIGTERM, Ctrl-C: its runs stop and are marked KILLED, in one line
    try:
        summary = run_campaign(
            args.campaign,
            only_axis=args.axis,
            only_sizes=tuple(args.size or ()),
            dry_run=args.dry_run,
            resume_stopped=args.resume_stopped,
            new_store=args.new_store,
            log=lambda m: print(m, flush=True),
        )
    except CampaignStopped as e:
        print(f"stopped: {e}", file=sys.stderr)
        return e.code
    except (Stopped, KeyboardInterrupt) as e:  # before any run started
        print(f"stopped: campaign {args.campaign} stopped by {signal_of(e)} before any run started", file=sys.stderr)
        return stop_code(e)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if args.dry_run:
        return 0
    failures = summary["failures"]
    print(
        f"campaign finished: {summary['ran']} run(s) executed, {len(failures)} failed; "
        f"wall time {time.perf_counter() - t0:.0f} s. Fit it: python -m analysis fit {summary['campaign'].name}"
    )
    for spec, tail in failures:
        print(f"  FAILED {spec.variant} seed {spec.seed}:\n    " + tail.replace("\n", "\n    "))
    return 1 if failures else 0


def cmd_ui(args: argparse.Namespace) -> int:
    from runners.campaign.ui import open_ui
    from runners.tracking.store import default_tracking_uri

    return open_ui(args.tracking_uri or default_tracking_uri(), args.port, args.campaign, new_store=args.new_store)


def cmd_import(args: argparse.Namespace) -> int:
    from runners.tracking.store import check_store, create_store, default_tracking_uri, existing_store, store_to_write
    from runners.tracking.transfer import import_store

    src = existing_store(args.source if "://" in args.source else f"sqlite:///{Path(args.source).resolve()}")
    root = Path(args.artifacts) if args.artifacts else None
    if root is not None and not root.is_dir():
        raise FileNotFoundError(f"import: --artifacts {root}: no such folder")
    dest = store_to_write(args.tracking_uri or default_tracking_uri(), new_store=args.new_store)  # none made unasked
    check_store(dest)  # a corrupt destination: one line, before a run is copied
    create_store(dest)  # a new store (the default, or --new-store): private, or PRL_GROUP's
    counts = import_store(src, dest, artifacts_root=root, experiments=args.experiment, log=print)
    print(f"{counts['runs']} run(s), {counts['metrics']} metric points → {dest}")
    return 0


def cmd_tracking_server(args: argparse.Namespace) -> int:
    from runners.tracking.shared import SharedServer, run_shared_server

    server = SharedServer(
        root=Path(args.root),
        db_uri=args.db_uri,
        host=args.host,
        port=args.port,
        pg_port=args.pg_port,
        workers=args.workers,
        auth=args.auth,
    )
    return run_shared_server(server)


def device_count(text: str) -> int:
    """``--gpus``: a whole number of devices, 1 or more."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of devices") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: pass 1 (one device, the default) or more to spread the run")
    return n


NEW_STORE_HELP = (
    "create the SQLite store MLFLOW_TRACKING_URI names if it does not exist (only ./mlflow.db is created "
    "without it), and train again into it runs whose folders hold runs of another store (set aside)"
)


NEW_STORE_HELP_URI = (
    "create the SQLite store --tracking-uri (or MLFLOW_TRACKING_URI) names if it does not exist (only ./mlflow.db "
    "is created without it)"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runners", description="RL runs of ScaleRL-style recipes on TRL.")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_: str, optional: bool = False) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument(
            "recipe", nargs="?" if optional else None, help="recipe file or name in experiments/recipes (e.g. scalerl)"
        )
        sp.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a recipe key, e.g. --set algorithm.loss=dapo (repeatable)",
        )
        sp.set_defaults(func=func)
        return sp

    pl = add("plan", cmd_plan, "print the batch plan: rollouts, updates, accumulation, memory, TRL arguments", True)
    pl.add_argument("--campaign", help="plan a campaign's baseline run (its recipe with the campaign's overrides)")
    pl.add_argument("--gpus", type=int, default=1, help="plan for N processes, one per GPU (memory per GPU)")
    pl.add_argument(
        "--accelerate-config",
        help="with --gpus: the accelerate config the run launches with (FSDP: what each GPU holds when sharded)",
    )
    t = add(
        "train",
        cmd_train,
        "run one recipe end to end (re-running the same recipe resumes it from its last checkpoint; a finished "
        "one trains nothing)",
    )
    t.add_argument(
        "--run-dir",
        help="output folder (default artifacts/runs/NAME-seedS-ID, ID the run's identity: another recipe or "
        "override gets another folder); a folder of another run is refused",
    )
    t.add_argument(
        "--experiment",
        default="runs",
        help="MLflow experiment of a single run (default 'runs'; a campaign's runs are its children)",
    )
    t.add_argument("--untracked", action="store_true", help="write metrics.jsonl only, no MLflow run")
    t.add_argument("--new-store", action="store_true", help=NEW_STORE_HELP)
    t.add_argument(
        "--gpus",
        type=device_count,
        default=1,
        help="spread the run over N devices with accelerate (DDP): N GPUs, or N CPU processes without GPUs",
    )
    t.add_argument(
        "--accelerate-config",
        help="with --gpus: an `accelerate config` file to launch with instead of plain DDP (e.g. FSDP)",
    )
    add("base-model", cmd_base_model, "build (or find cached) the embedded base model of a recipe")
    c = sub.add_parser(
        "campaign",
        help="run a campaign (baseline + LOO variants x seeds); fit it with python -m analysis fit",
        description="Run every run of a campaign that is not done yet, tracked in MLflow (fit it with "
        "`python -m analysis fit`, as `make ablation` does). Re-running skips finished runs and resumes "
        "interrupted ones.",
    )
    c.add_argument("campaign", help="campaign file or name in experiments/campaigns (e.g. loo-cpu)")
    c.add_argument("--axis", help="run only the baseline's variants along this axis")
    c.add_argument(
        "--size",
        action="append",
        metavar="SIZE",
        help="a scale campaign: run only this size (repeat for several): the smaller sizes first, "
        "the largest once its forecast is committed",
    )
    c.add_argument(
        "--resume-stopped",
        action="store_true",
        help="continue runs an adaptive campaign stopped, from their last checkpoint to the full budget",
    )
    c.add_argument("--dry-run", action="store_true", help="list every run, its identity and status; run nothing")
    c.add_argument("--new-store", action="store_true", help=NEW_STORE_HELP)
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
    i.add_argument("--new-store", action="store_true", help=NEW_STORE_HELP_URI)
    i.set_defaults(func=cmd_import)
    u = sub.add_parser(
        "ui",
        help="the MLflow UI over the store (make ui); first stops a server a killed campaign left on it",
        description="Stop the servers that killed campaigns or UIs left running on the store, then run "
        "`mlflow ui` over it on 127.0.0.1 (tracking only: no GenAI job runner; to share runs, use "
        "`tracking-server`). A port in use is an error naming its pid. Ctrl-C stops it; exit 1 if the "
        "UI stops on its own.",
    )
    u.add_argument("--tracking-uri", help="the store (default MLFLOW_TRACKING_URI or ./mlflow.db)")
    u.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    u.add_argument("--campaign", help="list this campaign's address first (its file or name)")
    u.add_argument("--new-store", action="store_true", help=NEW_STORE_HELP_URI)
    u.set_defaults(func=cmd_ui)
    ts = sub.add_parser(
        "tracking-server",
        help="a shared MLflow tracking server on PostgreSQL (started here) with an artifact root",
        description="Start PostgreSQL (initdb on first use, under ROOT/pgdata) or use --db-uri, and an MLflow "
        "tracking server in front of it serving artifacts from ROOT/artifacts, on 127.0.0.1 by default.",
    )
    ts.add_argument("--root", default="artifacts/tracking", help="folder for pgdata/ and artifacts/")
    ts.add_argument("--db-uri", help="an existing database, e.g. postgresql+psycopg2://user:pass@dbhost/mlflow")
    ts.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; read docs/operations.md)")
    ts.add_argument("--port", type=int, default=5001, help="MLflow port (default 5001)")
    ts.add_argument("--pg-port", type=int, help="PostgreSQL port (default: a free one)")
    ts.add_argument("--workers", type=int, default=4, help="MLflow server workers (default 4)")
    ts.add_argument(
        "--auth",
        action="store_true",
        help="MLflow's basic authentication: every request needs a user's password (the admin's is "
        "generated into ROOT/auth/credentials.env, mode 0600)",
    )
    ts.set_defaults(func=cmd_tracking_server)
    return p


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # a campaign's trainer does not outlive its campaign (kill -9 included)
    args = build_parser().parse_args(argv)
    if argv is None:  # a process of its own (in-process callers keep their environment): before torch loads
        configure(args.command, getattr(args, "gpus", 1) or 1)  # OpenMP: passive waits, threads sized to cores
    try:
        private = args.command in ("train", "campaign", "import", "ui")  # commands that may create a store
        with restricted() if private else contextlib.nullcontext():  # private to its owner, or PRL_GROUP's
            return args.func(args)
    except (
        GroupError,
        RecipeError,
        CampaignError,
        FileNotFoundError,
        PostgresError,
        ServerError,
        StoreError,
        RunFolderError,
        Busy,
    ) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
