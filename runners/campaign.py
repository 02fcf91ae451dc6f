"""Campaigns: a baseline recipe, the axes to ablate and the seeds, expanded into runs,
scheduled as separate processes and tracked in MLflow (experiment per campaign, a
parent run per campaign, a child run per variant x seed).

Re-running is safe: a finished run (same identity) is skipped, an interrupted one
resumes from its checkpoint into the same MLflow run.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.basemodel import BUILD_VERSION
from runners.recipe import Recipe, RecipeError, apply_overrides, raw_recipe, read_yaml, recipe_from_dict

CAMPAIGNS_DIR = Path(__file__).resolve().parent.parent / "experiments" / "campaigns"
ID_TAG = "prl.run_id"


@dataclass
class Axis:
    key: str  # dotted recipe key, e.g. algorithm.loss
    values: list[Any]


@dataclass
class Campaign:
    name: str
    baseline: str
    path: Path
    kind: str = "loo"  # loo | forward
    seeds: list[int] = field(default_factory=lambda: [0])
    baseline_seeds: list[int] | None = None  # extra seeds for the baseline only
    overrides: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, Axis] = field(default_factory=dict)
    controls: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {dotted key: value, ...}
    fit: dict[str, Any] = field(default_factory=dict)
    parallel: int = 1  # concurrent runs on CPU
    runs_per_gpu: int = 1
    gpus_per_run: int = 1  # > 1: each run spans this many GPUs through accelerate (DDP)
    backend: str = "local"  # local (processes on this machine) | ray (tasks on a Ray cluster)
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or ray://host:port: join a cluster
    max_retries: int = 3  # ray: re-runs of a preempted run (it resumes from its checkpoint)


@dataclass
class RunSpec:
    variant: str
    axis: str | None
    value: Any
    seed: int
    recipe: Recipe
    run_key: str


CAMPAIGN_KEYS = {f for f in Campaign.__dataclass_fields__ if f != "path"}


def load_campaign(ref: str | Path) -> Campaign:
    p = Path(ref)
    if not p.is_file():
        cand = CAMPAIGNS_DIR / (p.name if p.suffix else f"{p.name}.yaml")
        if not cand.is_file():
            known = ", ".join(sorted(x.stem for x in CAMPAIGNS_DIR.glob("*.yaml")))
            raise RecipeError(f"campaign {ref!r} not found (known campaigns: {known})")
        p = cand
    data = read_yaml(p, "campaign")
    unknown = sorted(set(data) - CAMPAIGN_KEYS)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), CAMPAIGN_KEYS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        valid = ", ".join(sorted(CAMPAIGN_KEYS))
        raise RecipeError(f"{p}: unknown campaign key {unknown[0]!r}{hint} Valid keys: {valid}")
    for req in ("name", "baseline"):
        if req not in data:
            raise RecipeError(f"{p}: missing required key {req!r}")
    _check_types(p, data)
    axes = {}
    for name, spec in (data.pop("axes", None) or {}).items():
        if not isinstance(spec, dict) or set(spec) != {"key", "values"} or not isinstance(spec["values"], list):
            raise RecipeError(f"{p}: axis {name!r} needs {{key: dotted.recipe.key, values: [...]}}, got {spec!r}")
        _no_repeats(p, f"axis {name!r} values", spec["values"])
        axes[name] = Axis(spec["key"], spec["values"])
    controls = data.pop("controls", None) or {}
    for name, over in controls.items():
        if not isinstance(over, dict) or not over:
            raise RecipeError(f"{p}: control {name!r} needs {{dotted.recipe.key: value, ...}}, got {over!r}")
    camp = Campaign(path=p, axes=axes, controls=controls, **data)
    if camp.kind not in ("loo", "forward"):
        raise RecipeError(f"{p}: kind = {camp.kind!r}; choose loo or forward")
    if camp.backend not in ("local", "ray"):
        raise RecipeError(f"{p}: backend = {camp.backend!r}; choose local or ray")
    if camp.kind == "forward" and len(axes) != 1:
        raise RecipeError(f"{p}: a forward ablation sweeps exactly one axis, got {len(axes)}")
    return camp


def _check_types(p: Path, data: dict[str, Any]) -> None:
    """Types of the campaign's keys, before anything runs: one line naming the key and the fix."""
    for key in ("name", "baseline", "kind", "backend"):
        if key in data and not isinstance(data[key], str):
            raise RecipeError(f"{p}: {key} = {data[key]!r}: expected a string")
    for key in ("parallel", "runs_per_gpu", "gpus_per_run", "max_retries"):
        v = data.get(key)
        if key in data and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "max_retries" else 1)):
            raise RecipeError(f"{p}: {key} = {v!r}: expected a whole number >= {0 if key == 'max_retries' else 1}")
    for key in ("seeds", "baseline_seeds"):
        v = data.get(key)
        if v is None and key == "baseline_seeds":
            continue
        if key in data and (
            not isinstance(v, list) or not v or any(isinstance(s, bool) or not isinstance(s, int) for s in v)
        ):
            raise RecipeError(f"{p}: {key} = {v!r}: expected a list of integers, e.g. [0, 1]")
        if key in data:
            _no_repeats(p, key, v)
    for key in ("overrides", "fit", "axes", "controls"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise RecipeError(f"{p}: {key} = {data[key]!r}: expected a mapping")


def _no_repeats(p: Path, what: str, values: list[Any]) -> None:
    """A repeated seed or axis value would name the same run twice."""
    seen: list[Any] = []
    for v in values:
        if any(_same(v, s) for s in seen):
            raise RecipeError(f"{p}: {what} lists {v!r} twice; each value names one run")
        seen.append(v)


def code_version() -> str:
    return f"build{BUILD_VERSION}"


def run_key(recipe: Recipe) -> str:
    """Identity of a run: hash of the fully resolved recipe (seed included) and the code version."""
    blob = json.dumps({"recipe": recipe.to_dict(), "code": code_version()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def expand(camp: Campaign, only_axis: str | None = None) -> list[RunSpec]:
    """Baseline + one variant per non-baseline value of each axis (LOO), or every value (forward); x seeds."""
    if only_axis is not None and only_axis not in camp.axes:
        raise RecipeError(f"AXIS={only_axis!r} is not an axis of {camp.name}; axes: {', '.join(camp.axes)}")
    base_raw = apply_overrides(raw_recipe(camp.baseline), camp.overrides)
    base_flat = recipe_from_dict(base_raw).flat()
    variants: list[tuple[str, str | None, Any, dict[str, Any]]] = []
    if camp.kind == "loo":
        variants.append(("baseline", None, None, {}))
    for axis_name, axis in camp.axes.items():
        if only_axis is not None and axis_name != only_axis:
            continue
        try:
            current = base_flat[axis.key]
        except KeyError:
            raise RecipeError(f"{camp.path}: axis {axis_name!r}: {axis.key!r} is not a recipe key") from None
        for value in axis.values:
            if camp.kind == "loo" and _same(value, current):
                continue
            variants.append((f"{axis_name}={_fmt(value)}", axis_name, value, {axis.key: value}))
    if only_axis is None:  # controls: named variants that change several keys (e.g. known-worse positive controls)
        for name, over in camp.controls.items():
            for key in over:
                if key not in base_flat:
                    raise RecipeError(f"{camp.path}: control {name!r}: {key!r} is not a recipe key")
            if all(_same(v, base_flat[k]) for k, v in over.items()):
                raise RecipeError(f"{camp.path}: control {name!r} changes nothing: every key has the baseline's value")
            variants.append((f"control={name}", "control", name, dict(over)))
    specs = []
    for variant, axis_name, value, over in variants:
        seeds = camp.seeds
        if variant == "baseline" and camp.baseline_seeds:
            seeds = sorted(set(camp.seeds) | set(camp.baseline_seeds))
        for seed in seeds:
            raw = apply_overrides(base_raw, {**over, "train.seed": seed, "name": f"{camp.name}/{variant}"})
            try:
                recipe = recipe_from_dict(raw)
            except RecipeError as e:
                raise RecipeError(f"{camp.path}: variant {variant} seed {seed}: {e}") from None
            specs.append(RunSpec(variant, axis_name, value, seed, recipe, run_key(recipe)))
    return specs


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) == list(b)
    return a == b


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


# --- execution -----------------------------------------------------------------


def _experiment(client, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    return exp.experiment_id if exp else client.create_experiment(name)


def _find_runs(client, exp_id: str) -> dict[str, Any]:
    runs = client.search_runs([exp_id], filter_string=f"tags.`{ID_TAG}` != ''", max_results=5000)
    return {r.data.tags[ID_TAG]: r for r in runs}


def _parent(client, exp_id: str, camp: Campaign):
    found = client.search_runs([exp_id], filter_string="tags.`prl.kind` = 'campaign'", max_results=1)
    if found:
        return found[0]
    run = client.create_run(exp_id, run_name=camp.name, tags={"prl.kind": "campaign", "prl.campaign": camp.name})
    client.log_text(run.info.run_id, camp.path.read_text(), "campaign.yaml")
    return run


def status_of(run) -> str:
    if run is None:
        return "to do"
    if run.data.tags.get("prl.done") == "1":
        return "done"
    return {"RUNNING": "running", "FAILED": "failed", "KILLED": "failed"}.get(run.info.status, "interrupted")


def _devices() -> list[str | None]:
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch CUDA: CPU
        n = 0
    return [str(i) for i in range(n)] or [None]


def run_campaign(
    ref: str | Path,
    *,
    only_axis: str | None = None,
    dry_run: bool = False,
    runs_root: Path = Path("artifacts/campaigns"),
    tracking_uri: str | None = None,
    log=print,
) -> dict[str, Any]:
    """Run every to-do run of a campaign; returns a summary with failures."""
    from mlflow.tracking import MlflowClient

    from runners.tracking import default_tracking_uri, local_server

    camp = load_campaign(ref)
    specs = expand(camp, only_axis)
    uri = tracking_uri or default_tracking_uri()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(camp.name)
    existing = _find_runs(client, exp.experiment_id) if exp else {}
    log(f"campaign {camp.name}: {len(specs)} runs ({camp.kind}, seeds {camp.seeds}), tracking {uri}")
    for s in specs:
        log(f"  {s.variant:<28} seed {s.seed}  id {s.run_key}  {status_of(existing.get(s.run_key))}")
    if dry_run:
        return {"runs": len(specs), "dry_run": True}

    exp_id = _experiment(client, camp.name)
    parent = _parent(client, exp_id, camp)
    todo = [s for s in specs if status_of(existing.get(s.run_key)) != "done"]
    log(f"{len(specs) - len(todo)} done, {len(todo)} to run")
    t0 = time.perf_counter()
    use_server = uri.startswith("sqlite:")
    server = local_server(uri, runs_root / camp.name / "mlartifacts", log=log) if use_server else None
    with server if server is not None else contextlib.nullcontext(uri) as worker_uri:
        worker_client = MlflowClient(worker_uri)

        def run_id(spec: RunSpec) -> str:  # the run's MLflow run: resumed if it exists, else a new child
            run = existing.get(spec.run_key) or _create_child(worker_client, exp_id, parent, camp, spec)
            return run.info.run_id

        root = runs_root / camp.name
        if camp.backend == "ray":
            from runners.cluster import run_on_ray

            launches = [(spec, *_command(spec, run_id(spec), worker_uri, root)) for spec in todo]
            failures = run_on_ray(
                launches,
                address=camp.ray_address,
                gpus_per_run=camp.gpus_per_run,
                max_retries=camp.max_retries,
                log=log,
            )
        else:
            failures = _run_local(camp, todo, run_id, worker_uri, root, log)
    wall = time.perf_counter() - t0
    client.set_terminated(parent.info.run_id, "FAILED" if failures else "FINISHED")
    return {
        "runs": len(specs),
        "ran": len(todo),
        "failures": failures,
        "seconds": wall,
        "experiment_id": exp_id,
        "parent_run_id": parent.info.run_id,
        "tracking_uri": uri,
        "campaign": camp,
    }


def _run_local(camp: Campaign, todo: list[RunSpec], run_id, uri: str, root: Path, log) -> list[tuple[RunSpec, str]]:
    """Run ``todo`` as local processes, as many at once as there are slots; returns the failures."""
    slots = _slots(camp) if todo else []
    if todo:
        _build_base_models(todo, root, slots[0], log)
    running: list[tuple[subprocess.Popen, RunSpec, Path, Any]] = []
    queue, failures, done_count, t0 = list(todo), [], 0, time.perf_counter()
    while queue or running:
        while queue and len(running) < len(slots):
            spec = queue.pop(0)
            device = _free_slot(slots, running)
            threads = max(1, (os.cpu_count() or 1) // len(slots))
            proc, rdir, logf = _launch(spec, run_id(spec), uri, root, device, threads)
            running.append((proc, spec, rdir, (logf, device)))
            log(
                f"[{done_count + len(running)}/{len(todo)}] start {spec.variant} seed {spec.seed}"
                + (f" on cuda:{device}" if device is not None else "")
            )
        time.sleep(1.0)
        for item in list(running):
            proc, spec, rdir, (logf, _) = item
            if proc.poll() is None:
                continue
            running.remove(item)
            logf.close()
            done_count += 1
            elapsed = time.perf_counter() - t0
            if proc.returncode == 0:
                log(f"[{done_count}/{len(todo)}] done  {spec.variant} seed {spec.seed}  ({elapsed:.0f} s so far)")
            else:
                tail = _tail(rdir / "run.log")
                failures.append((spec, tail))
                last = tail.splitlines()[-1] if tail else ""
                log(f"[{done_count}/{len(todo)}] FAILED {spec.variant} seed {spec.seed}: {last}")
    return failures


def _build_base_models(todo: list[RunSpec], root: Path, device: str | None, log) -> None:
    """Build each distinct embedded base model once, before runs that share it start.

    Packed runs that each found the cache empty would all build it at once (measured on an H200:
    416-550 s each for 4 concurrent builds against 118-146 s for one alone).
    """
    from runners.basemodel import base_model_path

    needed: dict[Path, RunSpec] = {}
    for spec in todo:
        if spec.recipe.model.size is not None:
            needed.setdefault(base_model_path(spec.recipe.model.size, spec.recipe.data.task), spec)
    for path, spec in needed.items():
        if (path / "build_info.json").is_file():
            continue
        users = sum(
            1
            for s in todo
            if s.recipe.model.size and base_model_path(s.recipe.model.size, s.recipe.data.task) == path
        )
        log(f"building base model {path.name} once for {users} run(s)" + (f" on cuda:{device}" if device else ""))
        root.mkdir(parents=True, exist_ok=True)
        recipe_file = root / f"base-{path.name}.yaml"
        recipe_file.write_text(spec.recipe.to_yaml())
        env = {**os.environ}
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device.split(",")[0]
        r = subprocess.run(
            [sys.executable, "-m", "runners", "base-model", str(recipe_file)],
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:  # the runs would each fail (or build it themselves); say why once
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise RecipeError(f"building base model {path.name} failed: {last}")
        log("  " + (r.stdout.strip().splitlines() or [""])[-1])


def _slots(camp: Campaign) -> list[str | None]:
    """One slot per concurrent run: GPUs x runs_per_gpu, or ``parallel`` CPU slots."""
    devices = _devices()
    if devices == [None]:
        return [None] * max(1, camp.parallel)
    n = max(1, camp.gpus_per_run)
    if n > len(devices):
        raise RecipeError(f"{camp.path}: gpus_per_run = {n}, but only {len(devices)} GPU(s) are visible")
    groups = [",".join(devices[i : i + n]) for i in range(0, len(devices) - n + 1, n)]  # "0,1", "2,3", ...
    return [g for g in groups for _ in range(max(1, camp.runs_per_gpu))]


def _free_slot(slots: list[str | None], running: list) -> str | None:
    busy = [dev for *_, (_, dev) in running]
    for dev in dict.fromkeys(slots):
        if busy.count(dev) < slots.count(dev):
            return dev
    return None  # pragma: no cover - callers only ask when a slot is free


def _create_child(client, exp_id: str, parent, camp: Campaign, spec: RunSpec):
    import mlflow

    tags = {
        "mlflow.parentRunId": parent.info.run_id,
        ID_TAG: spec.run_key,
        "prl.campaign": camp.name,
        "prl.variant": spec.variant,
        "prl.axis": spec.axis or "",
        "prl.value": _fmt(spec.value) if spec.axis else "",
        "prl.seed": str(spec.seed),
        "prl.code_version": code_version(),
        "prl.git_commit": _git_commit(),
        "prl.versions": _versions(),
    }
    run = client.create_run(exp_id, run_name=f"{spec.variant}/seed{spec.seed}", tags=tags)
    params = spec.recipe.flat()
    batch = [mlflow.entities.Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(batch), 100):
        client.log_batch(run.info.run_id, params=batch[i : i + 100])
    return run


def _command(spec: RunSpec, run_id: str, uri: str, root: Path) -> tuple[list[str], dict[str, str], Path]:
    """The run's folder (recipe written), its ``python -m runners train`` command and MLflow environment."""
    rdir = (root / f"{spec.variant.replace('=', '-')}-seed{spec.seed}-{spec.run_key}").resolve()
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "recipe.yaml").write_text(spec.recipe.to_yaml())
    cmd = [sys.executable, "-m", "runners", "train", str(rdir / "recipe.yaml"), "--run-dir", str(rdir)]
    return cmd, {"MLFLOW_TRACKING_URI": uri, "MLFLOW_RUN_ID": run_id}, rdir


def _launch(spec: RunSpec, run_id: str, uri: str, root: Path, device: str | None, threads: int | None = None):
    cmd, run_env, rdir = _command(spec, run_id, uri, root)
    env = {**os.environ, **run_env}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # packed runs fragment less
    if threads is not None:
        env.setdefault("OMP_NUM_THREADS", str(threads))  # concurrent runs share the cores instead of oversubscribing
    logf = (rdir / "run.log").open("a")
    if device is not None and "," in device:
        cmd += ["--gpus", str(device.count(",") + 1)]
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    return proc, rdir, logf


def _tail(path: Path, n: int = 5) -> str:
    if not path.is_file():
        return ""
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return "\n".join(lines[-n:])


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _versions() -> str:
    from importlib.metadata import version

    return ",".join(f"{p}={version(p)}" for p in ("torch", "transformers", "trl", "mlflow"))
