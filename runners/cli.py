"""Command line: ``python -m runners plan|train|base-model|campaign|import|ui|tracking-server``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from runners.ops.campaign import CampaignError
from runners.ops.postgres import PostgresError
from runners.ops.store import StoreError
from runners.recipe import RecipeError, load_recipe, parse_override


def _recipe(args: argparse.Namespace):
    return load_recipe(args.recipe, dict(parse_override(s) for s in args.set or []))


def cmd_plan(args: argparse.Namespace) -> int:
    from runners.rl.plan import format_plan
    from runners.rl.sharding import Layout

    if args.gpus < 1:
        raise RecipeError(f"--gpus {args.gpus}: pass 1 or more")
    print(format_plan(_recipe(args), Layout.from_config(args.accelerate_config, args.gpus)))
    return 0


def launch_distributed(args: argparse.Namespace, recipe, n: int) -> int:
    """Re-run this command as ``n`` processes through ``accelerate launch`` (DDP; gloo on CPU, NCCL on GPUs)."""
    import subprocess

    from runners.ops.tracking import free_port

    if n < 2:
        raise RecipeError(f"--gpus {n}: pass 2 or more to spread one run over several devices")
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < n:
        raise RecipeError(f"--gpus {n}: only {torch.cuda.device_count()} GPU(s) visible (CUDA_VISIBLE_DEVICES)")
    from runners.rl.sharding import Layout

    layout = Layout.from_config(args.accelerate_config, n)
    if layout.fsdp is not None and not torch.cuda.is_available():
        raise RecipeError(
            f"--accelerate-config {args.accelerate_config}: FSDP needs GPUs (accelerate would run these CPU "
            "processes unsharded); on CPU, spread a run with plain DDP: --gpus N without --accelerate-config"
        )
    if torch.cuda.is_available():  # refuse here, in one line, what every launched process would refuse
        from runners.rl.memory import check_fits

        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        check_fits(recipe, total, total, layout=layout)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n)]
    if args.accelerate_config:  # the user's accelerate config (e.g. FSDP for a model that needs sharding)
        cmd += ["--config_file", args.accelerate_config]
    else:
        cmd += ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"]
    cmd += ["--mixed_precision", "bf16" if recipe.model.dtype == "bfloat16" else "no"]  # the recipe decides
    cmd += ["--main_process_port", str(free_port())]
    cmd += ["-m", "runners", "train", args.recipe, *[f"--set={s}" for s in args.set or []]]
    if args.run_dir:
        cmd += ["--run-dir", args.run_dir]
    cmd += ["--untracked"] if args.untracked else ["--experiment", args.experiment]
    if recipe.model.size is not None:  # build the base model once, here, not in every process
        from runners.task.basemodel import ensure_base_model
        from runners.task.data import task_of

        ensure_base_model(recipe.model.size, task_of(recipe), log=lambda m: print(m, flush=True))
    device = "GPUs" if torch.cuda.is_available() else "CPU processes (gloo)"
    print(f"launching {n} {device} through accelerate ({layout.describe()})", flush=True)
    return subprocess.call(cmd)


def cmd_train(args: argparse.Namespace) -> int:
    recipe = _recipe(args)  # validates before any process is launched
    if args.gpus and args.gpus > 1 and "LOCAL_RANK" not in os.environ:
        return launch_distributed(args, recipe, args.gpus)
    from runners.rl.train import train

    run_dir = Path(args.run_dir or f"artifacts/runs/{recipe.name.replace('/', '-')}-seed{recipe.train.seed}")
    main_process = int(os.environ.get("RANK", "0")) == 0  # under accelerate only rank 0 prints and tracks

    def log(m: str) -> None:
        if main_process:
            print(m, flush=True)

    log(f"recipe {recipe.name}: {recipe.train.steps} steps → {run_dir}")
    t0 = time.perf_counter()
    if main_process and not args.untracked:
        from runners.ops.tracking import tracked_train

        if not os.environ.get("MLFLOW_RUN_ID"):  # a single run: its own MLflow run, like a campaign's child
            os.environ["MLFLOW_RUN_ID"] = _single_run(recipe, run_dir, args.experiment)
        final = tracked_train(recipe, run_dir, log=log)
        log(
            f"MLflow run {final['run_id']} (experiment {args.experiment or 'a campaign'}); its report: "
            f"python -m analysis report {final['run_id']}"
        )
    else:
        final = train(recipe, run_dir, log=log)
    log(
        f"done in {time.perf_counter() - t0:.0f} s: best mean@16 {final['val/best_mean_at_16']:.3f}, "
        f"{final['compute/gpu_hours']:.4f} device-hours"
    )
    return 0


def _single_run(recipe, run_dir: Path, experiment: str) -> str:
    """The MLflow run of a single tracked run: the one of the same identity and run folder (it
    resumes, as the folder does), else a new one."""
    from mlflow.tracking import MlflowClient

    from runners.ops import store
    from runners.ops.campaign import run_key
    from runners.ops.campaign_runs import new_run

    client = MlflowClient(store.default_tracking_uri())
    exp_id = store.experiment_id(client, experiment, create=True)
    folder = str(run_dir.resolve())
    key = run_key(recipe, run_dir=folder)
    run = store.identified_runs(client, exp_id).get(key)
    if run is None:
        name = f"{recipe.name}/seed{recipe.train.seed}"
        run = new_run(client, exp_id, recipe, name=name, run_key=key, tags={store.RUN_DIR: folder})
    return run.info.run_id


def cmd_base_model(args: argparse.Namespace) -> int:
    from runners.task.basemodel import ensure_base_model
    from runners.task.data import task_of

    recipe = _recipe(args)
    if recipe.model.size is None:
        raise RecipeError("base-model: this recipe uses model.path, there is nothing to build")
    t0 = time.perf_counter()
    path = ensure_base_model(recipe.model.size, task_of(recipe), log=lambda m: print(m, flush=True))
    print(f"{path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from runners.ops.campaign_runs import run_campaign

    t0 = time.perf_counter()
    summary = run_campaign(
        args.campaign,
        only_axis=args.axis,
        dry_run=args.dry_run,
        resume_stopped=args.resume_stopped,
        log=lambda m: print(m, flush=True),
    )
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
    """Stop a server a killed campaign left on the store, then become ``mlflow ui`` over it."""
    from runners.ops.store import default_tracking_uri
    from runners.ops.tracking import TRACKING_ONLY, server_record, stop_stale_server

    uri = args.tracking_uri or default_tracking_uri()
    if uri.startswith(("http://", "https://")):
        print(f"error: {uri} is a tracking server: it serves its own UI, open it in a browser", file=sys.stderr)
        return 2
    if uri.startswith("sqlite:///"):
        stop_stale_server(server_record(uri, Path("artifacts")), log=print)
    print(f"MLflow UI: http://127.0.0.1:{args.port}  (store {uri})", flush=True)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--workers", "1"]
    os.execve(sys.executable, [*cmd, "--port", str(args.port)], os.environ | TRACKING_ONLY)


def cmd_import(args: argparse.Namespace) -> int:
    from runners.ops.store import default_tracking_uri, existing_store
    from runners.ops.transfer import import_store

    src = existing_store(args.source if "://" in args.source else f"sqlite:///{Path(args.source).resolve()}")
    root = Path(args.artifacts) if args.artifacts else None
    if root is not None and not root.is_dir():
        raise FileNotFoundError(f"import: --artifacts {root}: no such folder")
    dest = args.tracking_uri or default_tracking_uri()
    counts = import_store(src, dest, artifacts_root=root, experiments=args.experiment, log=print)
    print(f"{counts['runs']} run(s), {counts['metrics']} metric points → {dest}")
    return 0


def cmd_tracking_server(args: argparse.Namespace) -> int:
    import contextlib
    import signal

    from runners.ops.postgres import PostgresCluster
    from runners.ops.tracking import free_port, local_server

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # a SIGTERM stops MLflow and PostgreSQL as Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    root = Path(args.root)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: binding {args.host}: anyone who reaches this port can read and write every run; "
            "put it behind auth or an SSH tunnel (README: shared tracking server)",
            file=sys.stderr,
        )
    with contextlib.ExitStack() as stack:
        db = args.db_uri
        if db is None:
            pg = stack.enter_context(PostgresCluster(root / "pgdata", port=args.pg_port or free_port()))
            db = pg.uri
            print(f"PostgreSQL {db} (data {root / 'pgdata'})", flush=True)
        url = stack.enter_context(
            local_server(db, root / "artifacts", port=args.port, host=args.host, workers=args.workers)
        )
        print(f"MLflow tracking server {url}: export MLFLOW_TRACKING_URI={url}   (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
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

    pl = add("plan", cmd_plan, "print the batch plan: rollouts, updates, accumulation, memory, TRL arguments")
    pl.add_argument("--gpus", type=int, default=1, help="plan for N processes, one per GPU (memory per GPU)")
    pl.add_argument(
        "--accelerate-config",
        help="with --gpus: the accelerate config the run launches with (FSDP: what each GPU holds when sharded)",
    )
    t = add("train", cmd_train, "run one recipe end to end (resumes from its last checkpoint)")
    t.add_argument("--run-dir", help="output folder (default artifacts/runs/NAME-seedS)")
    t.add_argument(
        "--experiment",
        default="runs",
        help="MLflow experiment of a single run (default 'runs'; a campaign's runs are its children)",
    )
    t.add_argument("--untracked", action="store_true", help="write metrics.jsonl only, no MLflow run")
    t.add_argument(
        "--gpus",
        type=int,
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
        "--resume-stopped",
        action="store_true",
        help="continue runs an adaptive campaign stopped, from their last checkpoint to the full budget",
    )
    c.add_argument("--dry-run", action="store_true", help="list every run, its identity and status; run nothing")
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
    u = sub.add_parser(
        "ui",
        help="the MLflow UI over the store (make ui); first stops a server a killed campaign left on it",
        description="Stop a tracking server that a killed campaign left running on the store, then run "
        "`mlflow ui` over it on 127.0.0.1 (tracking only: no GenAI job runner; to share runs, use "
        "`tracking-server`). Ctrl-C stops it.",
    )
    u.add_argument("--tracking-uri", help="the store (default MLFLOW_TRACKING_URI or ./mlflow.db)")
    u.add_argument("--port", type=int, default=5000, help="port (default 5000)")
    u.set_defaults(func=cmd_ui)
    ts = sub.add_parser(
        "tracking-server",
        help="a shared MLflow tracking server on PostgreSQL (started here) with an artifact root",
        description="Start PostgreSQL (initdb on first use, under ROOT/pgdata) or use --db-uri, and an MLflow "
        "tracking server in front of it serving artifacts from ROOT/artifacts, on 127.0.0.1 by default.",
    )
    ts.add_argument("--root", default="artifacts/tracking", help="folder for pgdata/ and artifacts/")
    ts.add_argument("--db-uri", help="an existing database, e.g. postgresql+psycopg2://user:pass@dbhost/mlflow")
    ts.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; see the README first)")
    ts.add_argument("--port", type=int, default=5001, help="MLflow port (default 5001)")
    ts.add_argument("--pg-port", type=int, help="PostgreSQL port (default: a free one)")
    ts.add_argument("--workers", type=int, default=4, help="MLflow server workers (default 4)")
    ts.set_defaults(func=cmd_tracking_server)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RecipeError, CampaignError, FileNotFoundError, PostgresError, StoreError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
