"""One run from the command line (``python -m runners train``): the checks that refuse it before
anything starts (a missing or corrupt store, a base model to build into a read-only cache, a read-only folder),
its folder's one writer (``locks.writer``), its MLflow run (a single run's own, or the campaign's
child named by ``MLFLOW_RUN_ID``), and its processes: this one, or several through
``accelerate launch`` (``launch_distributed``: DDP, or the user's accelerate config).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runners.contract import BEST_MEAN_AT_16
from runners.locks import writer
from runners.parent_death import parent_death_preexec
from runners.recipe import Recipe, RecipeError
from runners.runfolder import RunFolderError, cache_problem, check_run_folder_writable, claim, default_run_dir, finished


@dataclass(frozen=True)
class TrainCall:
    """What ``python -m runners train`` was asked (its arguments), to run here or launch again per process."""

    recipe: str  # the recipe file or name, as given
    sets: list[str] = field(default_factory=list)  # --set KEY=VALUE, as given
    run_dir: Path | None = None  # default: the recipe's own folder (``runfolder.default_run_dir``)
    experiment: str = "runs"
    untracked: bool = False
    new_store: bool = False
    gpus: int = 1
    accelerate_config: str | None = None


def train_command(recipe: Recipe, call: TrainCall) -> int:
    """Run ``recipe`` as ``call`` asks, after the checks that refuse it in one line."""
    run_dir = call.run_dir or default_run_dir(recipe)
    if "LOCAL_RANK" in os.environ:  # a rank that accelerate launched: its launcher holds the folder
        return train_here(recipe, call, run_dir)
    if not call.untracked:
        from runners.tracking.store import check_store, default_tracking_uri, store_to_write

        uri = store_to_write(default_tracking_uri(), new_store=call.new_store)  # made only where asked
        check_store(uri)  # a mistyped or corrupt store: one line, before a folder, a lock, a run or a model
    if recipe.model.size is not None and (
        problem := cache_problem(recipe.model.size, recipe.data.task, None, recipe.model.build_seed)
    ):
        raise RunFolderError(problem)  # a base model to build into a read-only cache: before a run or the build
    check_run_folder_writable(run_dir)  # before a lock, an MLflow run or a model: one line for a read-only folder
    with writer(run_dir, recipe):  # this process is the folder's one writer, for the whole run
        if call.gpus > 1:
            return launch_distributed(recipe, call, run_dir)
        return train_here(recipe, call, run_dir)


def launch_distributed(recipe: Recipe, call: TrainCall, run_dir: Path) -> int:
    """Re-run this command as ``call.gpus`` processes through ``accelerate launch`` (DDP; gloo on CPU,
    NCCL on GPUs)."""
    from runners.tracking.server_processes import free_port

    n = call.gpus
    if n < 2:
        raise RecipeError(f"--gpus {n}: pass 2 or more to spread one run over several devices")
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() < n:
        raise RecipeError(f"--gpus {n}: only {torch.cuda.device_count()} GPU(s) visible (CUDA_VISIBLE_DEVICES)")
    layout = _layout(recipe, call, torch.cuda.is_available())
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n)]
    if call.accelerate_config:  # the user's accelerate config (e.g. FSDP for a model that needs sharding)
        cmd += ["--config_file", call.accelerate_config]
    else:
        cmd += ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"]
    cmd += ["--mixed_precision", "bf16" if recipe.model.dtype == "bfloat16" else "no"]  # the recipe decides
    cmd += ["--main_process_port", str(free_port())]
    cmd += ["-m", "runners", "train", call.recipe, *[f"--set={s}" for s in call.sets]]
    cmd += ["--run-dir", str(run_dir)]
    cmd += ["--untracked"] if call.untracked else ["--experiment", call.experiment]
    cmd += ["--new-store"] if call.new_store else []  # rank 0 makes the single run's store, where asked
    if recipe.model.size is not None and os.environ.get("MLFLOW_RUN_ID"):  # a tracked run's: ready, checked, once
        from mlflow.tracking import MlflowClient

        from runners.tracking.basemodels import ready
        from runners.tracking.store import default_tracking_uri

        ready(MlflowClient(default_tracking_uri()), os.environ["MLFLOW_RUN_ID"], recipe, log=print)
    elif recipe.model.size is not None:  # build the base model once, here, not in every process
        from runners.task.basemodel import ensure_base_model

        ensure_base_model(recipe.model.size, recipe.data.task, build_seed=recipe.model.build_seed, log=print)
    device = "GPUs" if torch.cuda.is_available() else "CPU processes (gloo)"
    print(f"launching {n} {device} through accelerate ({layout.describe()})", flush=True)
    return subprocess.call(cmd, preexec_fn=parent_death_preexec())  # the launcher dies with this process


def _layout(recipe: Recipe, call: TrainCall, cuda: bool):
    """The processes' layout (``runners.rl.sharding.Layout``), refused here, in one line, where every
    launched process would refuse it: FSDP without GPUs, a run that does not fit in a GPU's memory."""
    from runners.rl.sharding import Layout

    layout = Layout.from_config(call.accelerate_config, call.gpus)
    if layout.fsdp is not None and not cuda:
        raise RecipeError(
            f"--accelerate-config {call.accelerate_config}: FSDP needs GPUs (accelerate would run these CPU "
            "processes unsharded); on CPU, spread a run with plain DDP: --gpus N without --accelerate-config"
        )
    if cuda:
        import torch

        from runners.rl.memory import check_fits

        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        check_fits(recipe, total, total, layout=layout)
    return layout


def train_here(recipe: Recipe, call: TrainCall, run_dir: Path) -> int:
    """Train in this process (under accelerate: one rank), in its MLflow run unless untracked."""
    main_process = int(os.environ.get("RANK", "0")) == 0  # under accelerate only rank 0 prints and tracks

    def log(m: str) -> None:
        if main_process:
            print(m, flush=True)

    log(f"recipe {recipe.name}: {recipe.train.steps} steps → {run_dir}")
    t0 = time.perf_counter()
    claim(run_dir, recipe)  # another run's folder is refused before an MLflow run, torch or a model
    if call.untracked and (done := finished(run_dir)) is not None:
        log(f"{run_dir} is finished: best mean@16 {done[BEST_MEAN_AT_16]:.3f}; nothing to train")
        return 0
    if main_process and not call.untracked:
        final = _train_tracked(recipe, call, run_dir, log)
        if final is None:
            return 0
    else:
        from runners.rl.train import train  # torch, transformers, TRL: ~6 s, not paid by a finished run

        final = train(recipe, run_dir, log=log)
    log(
        f"done in {time.perf_counter() - t0:.0f} s: best mean@16 {final[BEST_MEAN_AT_16]:.3f}, "
        f"{final['compute/gpu_hours']:.4f} device-hours"
    )
    _end_rank()  # a rank of several processes ends here
    return 0


def _train_tracked(recipe: Recipe, call: TrainCall, run_dir: Path, log: Callable[[str], None]) -> dict | None:
    """Train inside the run's MLflow run: a campaign's (``MLFLOW_RUN_ID``), else the single run's own
    (``tracking.run.single_run``); None when that one is done already (nothing to train)."""
    from runners.tracking.run import single_run, tracked_train

    if not os.environ.get("MLFLOW_RUN_ID"):  # a single run: its own MLflow run, like a campaign's child
        run_id, tracked_done = single_run(recipe, run_dir, call.experiment, call.new_store)
        done = finished(run_dir)
        if tracked_done and done is not None:
            log(
                f"{run_dir} is finished (MLflow run {run_id}): best mean@16 {done[BEST_MEAN_AT_16]:.3f}; "
                "nothing to train"
            )
            return None
        os.environ["MLFLOW_RUN_ID"] = run_id
    final = tracked_train(recipe, run_dir, log=log)
    log(
        f"MLflow run {final['run_id']} (experiment {call.experiment or 'a campaign'}); its report: "
        f"python -m analysis report {final['run_id']}"
    )
    return final


def _end_rank() -> None:
    """Under accelerate, end this rank once its run is done: the ranks leave their process group
    together (a barrier, then ``destroy_process_group``), run the exit handlers (MLflow's, logging's),
    flush, and exit 0 without finalizing the interpreter. Finalizing it aborted a finished rank now
    and then (SIGABRT, "terminate called without an active exception", seen on a loaded machine):
    DTensor's caches keep FSDP 2's device mesh and through it the gloo group alive past
    ``destroy_process_group``, so gloo's worker threads live on into finalization, where one that
    frees a tensor takes the GIL and Python ends it with ``pthread_exit``, which C++ answers with
    ``std::terminate``. Outside a process group (a single process), nothing."""
    import atexit

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    dist.destroy_process_group()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
