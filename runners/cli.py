"""Command line: ``python -m runners plan|train|base-model|campaign|import|ui|tracking-server``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from runners.modes import GroupError, restricted
from runners.ops.campaign import CampaignError, load_campaign
from runners.ops.locks import Busy, die_with_parent
from runners.ops.postgres import PostgresError
from runners.ops.servers import ServerError
from runners.ops.store import StoreError
from runners.recipe import RecipeError, load_recipe, parse_override
from runners.runfolder import RunFolderError, check_writable
from runners.threads import configure


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
        recipe, about = campaign_baseline(args.campaign, dict(parse_override(s) for s in args.set or []))
        print(about + "\n")
    else:
        recipe = _recipe(args)
    print(format_plan(recipe, Layout.from_config(args.accelerate_config, args.gpus)))
    return 0


def campaign_baseline(ref: str, sets: dict) -> tuple:
    """A campaign's baseline run as it runs (its recipe with the campaign's overrides, and ``sets``),
    and a line saying what that is."""
    from runners.ops.campaign import expand
    from runners.recipe import apply_overrides, raw_recipe, recipe_from_dict

    camp = load_campaign(ref)
    specs = expand(camp)
    base = next((s for s in specs if s.variant == "baseline"), specs[0])
    recipe = base.recipe
    if sets:
        over = {**camp.overrides, "train.seed": base.seed, "name": recipe.name, **sets}
        recipe = recipe_from_dict(apply_overrides(raw_recipe(camp.baseline), over))

    def listed(d: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in d.items()) or "none"

    about = (
        f"campaign {camp.name} ({camp.path}): its {base.variant} run is recipe {camp.baseline} with the campaign's"
        f" overrides ({listed(camp.overrides)})" + (f" and --set {listed(sets)}" if sets else "") + f"; its other"
        f" {len(specs) - 1} runs change what their variant's name says (python -m runners campaign {camp.name}"
        " --dry-run lists them)"
    )
    return recipe, about


def launch_distributed(args: argparse.Namespace, recipe, n: int, run_dir: Path) -> int:
    """Re-run this command as ``n`` processes through ``accelerate launch`` (DDP; gloo on CPU, NCCL on GPUs)."""
    import subprocess

    from runners.ops.locks import parent_death_preexec
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
    cmd += ["--run-dir", str(run_dir)]
    cmd += ["--untracked"] if args.untracked else ["--experiment", args.experiment]
    cmd += ["--new-store"] if args.new_store else []  # rank 0 makes the single run's store, where asked
    if recipe.model.size is not None:  # build the base model once, here, not in every process
        from runners.task.basemodel import ensure_base_model

        ensure_base_model(recipe.model.size, recipe.data.task, log=lambda m: print(m, flush=True))
    device = "GPUs" if torch.cuda.is_available() else "CPU processes (gloo)"
    print(f"launching {n} {device} through accelerate ({layout.describe()})", flush=True)
    return subprocess.call(cmd, preexec_fn=parent_death_preexec())  # the launcher dies with this process


def cmd_train(args: argparse.Namespace) -> int:
    from runners.ops.locks import writer
    from runners.runfolder import cache_problem, default_run_dir

    recipe = _recipe(args)  # validates before any process is launched
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(recipe)
    if "LOCAL_RANK" in os.environ:  # a rank that accelerate launched: its launcher holds the folder
        return _train(args, recipe, run_dir)
    if not args.untracked:
        from runners.ops.store import check_store, default_tracking_uri

        check_store(default_tracking_uri())  # a corrupt store: one line, before a folder, a lock, a run or a model
    if recipe.model.size is not None and (problem := cache_problem(recipe.model.size, recipe.data.task)):
        raise RunFolderError(problem)  # a base model to build into a read-only cache: before a run or the build
    check_writable(run_dir)  # before a lock, an MLflow run or a model: one line for a read-only folder
    with writer(run_dir, recipe):  # this process is the folder's one writer, for the whole run
        if args.gpus and args.gpus > 1:
            return launch_distributed(args, recipe, args.gpus, run_dir)
        return _train(args, recipe, run_dir)


def _train(args: argparse.Namespace, recipe, run_dir: Path) -> int:
    from runners.runfolder import claim, finished

    main_process = int(os.environ.get("RANK", "0")) == 0  # under accelerate only rank 0 prints and tracks

    def log(m: str) -> None:
        if main_process:
            print(m, flush=True)

    log(f"recipe {recipe.name}: {recipe.train.steps} steps → {run_dir}")
    t0 = time.perf_counter()
    claim(run_dir, recipe)  # another run's folder is refused before an MLflow run, torch or a model
    if args.untracked and (done := finished(run_dir)) is not None:
        log(f"{run_dir} is finished: best mean@16 {done['val/best_mean_at_16']:.3f}; nothing to train")
        return 0
    if main_process and not args.untracked:
        from runners.ops.tracking import tracked_train

        if not os.environ.get("MLFLOW_RUN_ID"):  # a single run: its own MLflow run, like a campaign's child
            run_id, tracked_done = _single_run(recipe, run_dir, args.experiment, args.new_store)
            done = finished(run_dir)
            if tracked_done and done is not None:
                log(
                    f"{run_dir} is finished (MLflow run {run_id}): best mean@16 {done['val/best_mean_at_16']:.3f}; "
                    "nothing to train"
                )
                return 0
            os.environ["MLFLOW_RUN_ID"] = run_id
        final = tracked_train(recipe, run_dir, log=log)
        log(
            f"MLflow run {final['run_id']} (experiment {args.experiment or 'a campaign'}); its report: "
            f"python -m analysis report {final['run_id']}"
        )
    else:
        from runners.rl.train import train  # torch, transformers, TRL: ~6 s, not paid by a finished run

        final = train(recipe, run_dir, log=log)
    log(
        f"done in {time.perf_counter() - t0:.0f} s: best mean@16 {final['val/best_mean_at_16']:.3f}, "
        f"{final['compute/gpu_hours']:.4f} device-hours"
    )
    _leave_process_group()
    return 0


def _leave_process_group() -> None:
    """Under accelerate, the ranks leave their process group together, as PyTorch asks of a
    finished script: a rank that exits while another still holds the group can abort it (gloo,
    seen as SIGABRT after 'done' on a 2-process CPU run)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _single_run(recipe, run_dir: Path, experiment: str, new_store: bool = False) -> tuple[str, bool]:
    """The MLflow run of a single tracked run: the one of the same identity and run folder (it
    resumes, as the folder does), else a new one; and whether it is done. A store is created only
    where asked for (``store.store_to_write``); a folder whose run is tracked in another store is
    refused, or with ``new_store`` set aside and trained again. The folder records its store."""
    from mlflow.tracking import MlflowClient

    from runners.identity import run_key
    from runners.ops import store
    from runners.ops.campaign_runs import new_run
    from runners.runfolder import has_history, recorded_store, remember_store, set_aside

    uri = store.store_to_write(store.default_tracking_uri(), new_store=new_store)
    db = store.sqlite_file(uri)
    client = None if db is not None and not db.exists() else MlflowClient(uri)
    exp_id = None if client is None else store.experiment_id(client, experiment)
    folder = str(run_dir.resolve())
    key = run_key(recipe, run_dir=folder)
    run = store.identified_runs(client, exp_id).get(key) if exp_id else None
    held = recorded_store(run_dir) if run is None and has_history(run_dir) else None
    if held not in (None, store.store_key(uri)):
        if not new_store:
            raise RunFolderError(
                f"{folder} holds a run tracked in the store {held}, not in {uri}: point MLFLOW_TRACKING_URI at "
                f"that store, or copy its runs here first (make import SRC={store.sqlite_file(held) or held}), or "
                f"pass {store.NEW_STORE} to train it again into this store (its files are set aside in the folder)"
            )
        print(f"{folder} held a run of {held}; set aside in {set_aside(run_dir, 'other-store')}", flush=True)
    store.create_store(uri)
    client = client or MlflowClient(uri)
    exp_id = store.experiment_id(client, experiment, create=True)
    if run is None:
        name = f"{recipe.name}/seed{recipe.train.seed}"
        run = new_run(client, exp_id, recipe, name=name, run_key=key, tags={store.RUN_DIR: folder})
    remember_store(run_dir, store.store_key(uri), run.info.run_id)
    return run.info.run_id, store.is_done(run)


def cmd_base_model(args: argparse.Namespace) -> int:
    from runners.task.basemodel import ensure_base_model

    recipe = _recipe(args)
    if recipe.model.size is None:
        raise RecipeError("base-model: this recipe uses model.path, there is nothing to build")
    t0 = time.perf_counter()
    path = ensure_base_model(recipe.model.size, recipe.data.task, log=lambda m: print(m, flush=True))
    print(f"{path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from runners.ops.campaign_runs import run_campaign
    from runners.ops.store import check_store, default_tracking_uri

    check_store(default_tracking_uri())  # a corrupt store is one line, before a lock, a server or a run
    t0 = time.perf_counter()
    summary = run_campaign(
        args.campaign,
        only_axis=args.axis,
        dry_run=args.dry_run,
        resume_stopped=args.resume_stopped,
        new_store=args.new_store,
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
    """``mlflow ui`` over the store, after the servers killed runs left on it are stopped; its
    whole process tree stops with it, and it fails (exit 1) if the UI stops on its own."""
    import signal

    from runners.ops.store import check_store, default_tracking_uri
    from runners.ops.tracking import TRACKING_ONLY, exit_reason, serve

    uri = args.tracking_uri or default_tracking_uri()
    if uri.startswith(("http://", "https://")):
        print(f"error: {uri} is a tracking server: it serves its own UI, open it in a browser", file=sys.stderr)
        return 2
    check_store(uri)  # a corrupt store: one line, not the UI's own traceback

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # a SIGTERM stops the UI as Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--workers", "1"]
    try:
        with serve(
            [*cmd, "--port", str(args.port)],
            uri,
            Path("artifacts"),
            port=args.port,
            record_name=f"ui-{args.port}",
            what="the MLflow UI",
            env=os.environ | TRACKING_ONLY,
        ) as proc:
            print(f"MLflow UI: http://127.0.0.1:{args.port}  (store {uri}; Ctrl-C stops it)", flush=True)
            print_campaign_urls(uri, f"http://127.0.0.1:{args.port}", args.campaign)
            code = proc.wait()
    except KeyboardInterrupt:
        return 0
    print(
        f"error: the MLflow UI (pid {proc.pid}) stopped on its own ({exit_reason(code)}); so did its workers",
        file=sys.stderr,
    )
    return 1


def print_campaign_urls(uri: str, base: str, first: str | None = None) -> None:
    """The address of each campaign's curves in the UI (``runners.ops.ui``), ``first`` first."""
    from mlflow.tracking import MlflowClient

    from runners.ops import ui
    from runners.ops.store import existing_store

    try:
        views = ui.campaign_views(MlflowClient(existing_store(uri)), base)
    except StoreError:
        views = []
    if first:  # a campaign file's path or name: its experiment is named after the file's `name`
        with contextlib.suppress(CampaignError):
            first = load_campaign(first).name
        views.sort(key=lambda v: v[0] != first)
    if not views:
        print("  no campaign in this store yet: make ablation runs one", flush=True)
    for name, url in views:
        print(f"  campaign {name}, mean@16 against compute for every run: {url}", flush=True)


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
    """PostgreSQL (unless --db-uri) and ``mlflow server`` in front of it, owned by this process
    (a lock in ROOT): what an owner killed with ``kill -9`` left is stopped first."""
    import contextlib
    import json
    import signal

    from filelock import FileLock, Timeout

    from runners.ops.auth import BasicAuth
    from runners.ops.postgres import PostgresCluster
    from runners.ops.servers import check_port, owner
    from runners.ops.tracking import free_port, local_server, stop_stale_servers

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # a SIGTERM stops MLflow and PostgreSQL as Ctrl-C does

    signal.signal(signal.SIGTERM, stop)
    root = Path(args.root)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: binding {args.host}: anyone who reaches this port can "
            + ("log in with a user's password" if args.auth else "read and write every run")
            + "; put it behind TLS or an SSH tunnel (docs/operations.md: tracking-server security)",
            file=sys.stderr,
        )
    root.mkdir(parents=True, exist_ok=True)
    record = root / "tracking-server.json"
    lock = FileLock(root / "tracking-server.lock")
    try:
        owned = lock.acquire(timeout=0)  # released when this process ends, however it ends
    except Timeout:
        with contextlib.suppress(OSError, ValueError):
            held = json.loads(record.read_text())
            raise ServerError(
                f"a tracking server of {root} runs already (pid {held['owner']}, MLflow port {held['port']}): "
                f"use it, stop it (kill {held['owner']}), or pass another --root"
            ) from None
        raise ServerError(f"a tracking server of {root} runs already (it holds {lock.lock_file})") from None
    with owned, contextlib.ExitStack() as stack, contextlib.suppress(KeyboardInterrupt):
        record.write_text(json.dumps({**owner(), "port": args.port}))
        stack.callback(record.unlink, missing_ok=True)
        pg = PostgresCluster(root / "pgdata", port=args.pg_port or free_port()) if args.db_uri is None else None
        # nothing else owns ROOT: whatever of it still runs was left by an owner killed with kill -9
        stop_stale_servers(args.db_uri or pg.uri, root / "artifacts", log=print)
        if pg is not None:
            pg.stop_leftover(log=print)
        check_port(args.port, args.host, "tracking-server")
        if args.pg_port:
            check_port(args.pg_port, "127.0.0.1", "tracking-server (PostgreSQL)", flag="--pg-port")
        auth = BasicAuth(root / "auth").prepare() if args.auth else None
        db = args.db_uri
        if pg is not None:
            db = stack.enter_context(pg).uri
            print(f"PostgreSQL {db} (data {root / 'pgdata'})", flush=True)
        url = stack.enter_context(
            local_server(
                db,
                root / "artifacts",
                port=args.port,
                host=args.host,
                workers=args.workers,
                auth_env=auth.server_env() if auth else None,
            )
        )
        print(f"MLflow tracking server {url}: export MLFLOW_TRACKING_URI={url}   (Ctrl-C stops it)", flush=True)
        if auth is not None:
            print(
                f"basic authentication on: every request needs a user's password; clients: "
                f"set -a; . {auth.credentials}; set +a   (user {auth.client_env()['MLFLOW_TRACKING_USERNAME']})",
                flush=True,
            )
        while True:
            time.sleep(3600)
    return 0


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
