"""What a campaign is: its file (a baseline recipe, overrides, seeds, axes, controls, fit
settings), its expansion into runs, and each run's identity.

Running one is ``runners.ops.campaign_runs`` (MLflow bookkeeping) with a scheduler beside it:
``runners.ops.local`` (processes on this machine), ``runners.ops.cluster`` (Ray tasks) or
``runners.ops.slurm`` (SLURM jobs).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.contract import COMPUTE_METRICS
from runners.identity import run_key
from runners.recipe import (
    SEED_MAX,
    Recipe,
    RecipeError,
    apply_overrides,
    name_problem,
    raw_recipe,
    read_yaml,
    recipe_from_dict,
)
from scalefit.errors import FitError
from scalefit.settings import FitSettings

CAMPAIGNS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "campaigns"


class CampaignError(ValueError):
    """A campaign file, its expansion or its launch is wrong; the message names the fix."""


X = "compute/samples"  # adaptive decisions compare budgets in completions generated, whatever the machine load


def fit_settings(fit: dict[str, Any] | FitSettings | None) -> FitSettings:
    """A campaign's ``fit:`` section (``scalefit.settings.FitSettings``), checked when the campaign is
    loaded (before any run starts, not when the fit finally reads it) against the compute axes runs
    log: one line naming the key and the fix."""
    try:
        return FitSettings.parse(fit, x_choices=COMPUTE_METRICS)
    except FitError as e:
        raise CampaignError(str(e)) from None


@dataclass
class Adaptive:
    """A campaign's ``adaptive:`` section: decision points (fractions of the budget), the
    comparison margin and the risk of a wrong stop (``runners.ops.adaptive`` acts on it), with the
    fit settings the decisions use from the campaign's ``fit:`` section (``fit_settings``)."""

    at: list[float]
    margin: float = FitSettings.margin
    risk: float = 0.05
    eval_prompts: int | None = FitSettings.eval_prompts
    a_grid: str = FitSettings.a_grid
    n_resamples: int = 400
    pooling: str = FitSettings.pooling  # partial: one joint fit of the campaign decides; none: one by one
    last_k: int = FitSettings.last_k
    level: float = FitSettings.level
    model: str = FitSettings.model  # fit.model

    @classmethod
    def parse(cls, spec: Any, fit: dict[str, Any] | FitSettings | None) -> Adaptive:
        if not isinstance(spec, dict) or "at" not in spec:
            raise CampaignError(f"adaptive = {spec!r}: expected {{at: [0.25, 0.5], margin: 0.02, risk: 0.05}}")
        unknown = set(spec) - {"at", "margin", "risk"}
        if unknown:
            raise CampaignError(f"adaptive: unknown key {sorted(unknown)[0]!r}; keys: at, margin, risk")
        at = spec["at"]
        if (
            not isinstance(at, list)
            or not at
            or any(isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f < 1 for f in at)
        ):
            raise CampaignError(f"adaptive.at = {at!r}: expected fractions of the budget in (0, 1), e.g. [0.25, 0.5]")
        cfg = fit_settings(fit)
        margin, risk = spec.get("margin", cfg.margin), spec.get("risk", 0.05)
        if not isinstance(risk, int | float) or not 0 < risk < 0.5:
            raise CampaignError(f"adaptive.risk = {risk!r}: expected a probability in (0, 0.5), e.g. 0.05")
        if not isinstance(margin, int | float) or margin < 0:
            raise CampaignError(f"adaptive.margin = {margin!r}: expected a number >= 0, e.g. 0.02")
        if cfg.x != X:
            raise CampaignError(f"adaptive campaigns decide on fit.x = {X}; this campaign fits {cfg.x}")
        return cls(
            sorted(float(f) for f in at),
            float(margin),
            float(risk),
            cfg.eval_prompts,
            cfg.a_grid,
            pooling=cfg.pooling,
            last_k=cfg.last_k,
            level=float(cfg.level),
            model=cfg.model,
        )


@dataclass
class Slurm:
    """A campaign's ``slurm:`` section: what each run's SLURM job asks for (``runners.ops.slurm``)."""

    time: int  # minutes: the job's time limit (a run that reaches it is requeued and resumes)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus: int = 0  # per run (> 1: DDP through accelerate, as gpus_per_run does locally)
    cpus: int = 1  # per run
    mem_gb: float | None = None  # per run; None: the partition's default
    constraint: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines run before each run (module load, venv)
    sbatch: dict[str, Any] = field(default_factory=dict)  # any other sbatch option, e.g. {reservation: x}

    @classmethod
    def parse(cls, spec: Any) -> Slurm:
        example = "{time: '4:00:00', partition: gpu, account: lab, gpus: 1, cpus: 8, mem_gb: 64}"
        if not isinstance(spec, dict):
            raise CampaignError(f"slurm = {spec!r}: expected a mapping, e.g. {example}")
        keys = list(cls.__dataclass_fields__)
        unknown = sorted(set(spec) - set(keys))
        if unknown:
            near = difflib.get_close_matches(str(unknown[0]), keys, n=1)
            hint = f"; did you mean 'slurm.{near[0]}'?" if near else f"; known keys: {', '.join(keys)}"
            raise CampaignError(f"unknown key 'slurm.{unknown[0]}' in the campaign's slurm section{hint}")
        if "time" not in spec:
            raise CampaignError(f"slurm.time missing: each job's time limit, minutes or '[D-]HH:MM:SS', e.g. {example}")
        out = dict(spec, time=_minutes(spec["time"]))
        for key in ("partition", "account", "qos", "constraint"):
            if out.get(key) is not None and (not isinstance(out[key], str) or not out[key].strip()):
                raise CampaignError(f"slurm.{key} = {out[key]!r}: expected a name, e.g. {key}: my-{key}")
        for key, low in (("gpus", 0), ("cpus", 1)):
            v = out.get(key, low)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise CampaignError(f"slurm.{key} = {v!r}: expected a whole number >= {low} per run")
        v = out.get("mem_gb")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v <= 0):
            raise CampaignError(f"slurm.mem_gb = {v!r}: expected the memory of each run in GB, e.g. 32")
        v = out.get("setup", [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise CampaignError(f"slurm.setup = {v!r}: expected a list of shell lines, e.g. ['module load cuda']")
        v = out.get("sbatch", {})
        if not isinstance(v, dict) or not all(isinstance(x, str | int | float | bool) for x in v.values()):
            raise CampaignError(f"slurm.sbatch = {v!r}: expected sbatch options as a mapping, e.g. {{exclude: node7}}")
        return cls(**out)


def _minutes(v: Any) -> int:
    """A SLURM time limit as whole minutes: a number of minutes, 'HH:MM:SS' or 'D-HH[:MM[:SS]]'
    (SLURM reads 'A:B' as minutes:seconds, so that ambiguous form is refused)."""
    bad = CampaignError(f"slurm.time = {v!r}: expected minutes (e.g. 240), 'HH:MM:SS' or 'D-HH:MM:SS' ('1-12:00:00')")
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise bad
        return v
    if not isinstance(v, str):
        raise bad
    days, dash, clock = v.strip().rpartition("-")
    parts = clock.split(":")
    if not all(x.isdigit() for x in parts) or (dash and not days.isdigit()) or len(parts) > 3:
        raise bad
    if not dash and len(parts) != 3:
        raise bad
    h, m, s = (int(x) for x in (parts + ["0", "0"])[:3])
    total = (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)
    if total < 1 or m >= 60 or s >= 60:
        raise bad
    return total


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
    fit: FitSettings = field(default_factory=FitSettings)
    adaptive: Adaptive | None = None  # decision points at which variants the scaling law rules out stop
    parallel: int = 1  # concurrent runs on CPU
    runs_per_gpu: int = 1
    gpus_per_run: int = 1  # > 1: each run spans this many GPUs through accelerate (DDP)
    backend: str = "local"  # local (processes on this machine) | ray (tasks on a Ray cluster) | slurm (jobs)
    ray_address: str | None = None  # None: start a local Ray instance; "auto" or ray://host:port: join a cluster
    slurm: Slurm | None = None  # backend slurm: each run's job (time limit, partition, account, resources)
    max_retries: int = 3  # re-runs of a run killed by a signal (preempted, segfault, OOM kill); it resumes


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
            raise CampaignError(f"campaign {ref!r} not found (known campaigns: {known})")
        p = cand
    try:
        data = read_yaml(p, "campaign")
    except RecipeError as e:
        raise CampaignError(str(e)) from None
    unknown = sorted(set(data) - CAMPAIGN_KEYS)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), CAMPAIGN_KEYS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        valid = ", ".join(sorted(CAMPAIGN_KEYS))
        raise CampaignError(f"{p}: unknown campaign key {unknown[0]!r}{hint} Valid keys: {valid}")
    for req in ("name", "baseline"):
        if req not in data:
            raise CampaignError(f"{p}: missing required key {req!r}")
    _check_types(p, data)
    axes = {}
    for name, spec in (data.pop("axes", None) or {}).items():
        if not isinstance(spec, dict) or set(spec) != {"key", "values"} or not isinstance(spec["values"], list):
            raise CampaignError(f"{p}: axis {name!r} needs {{key: dotted.recipe.key, values: [...]}}, got {spec!r}")
        _named(p, f"axis {name!r}", name, "an axis", "loss")
        if not spec["values"]:
            raise CampaignError(f"{p}: axis {name!r} has no values: list the value(s) to try, or remove the axis")
        _no_repeats(p, f"axis {name!r} values", spec["values"])
        axes[name] = Axis(spec["key"], spec["values"])
    controls = data.pop("controls", None) or {}
    for name, over in controls.items():
        _named(p, f"control {name!r}", name, "a control", "lr_half")
        if not isinstance(over, dict) or not over:
            raise CampaignError(f"{p}: control {name!r} needs {{dotted.recipe.key: value, ...}}, got {over!r}")
    adaptive = data.pop("adaptive", None)
    slurm = data.pop("slurm", None)
    try:
        data["fit"] = fit_settings(data.get("fit"))  # parsed once, here: the campaign carries the result
        if adaptive is not None:
            adaptive = Adaptive.parse(adaptive, data["fit"])
        if slurm is not None:
            slurm = Slurm.parse(slurm)
    except CampaignError as e:
        raise CampaignError(f"{p}: {e}") from None
    camp = Campaign(path=p, axes=axes, controls=controls, adaptive=adaptive, slurm=slurm, **data)
    if camp.kind not in ("loo", "forward"):
        raise CampaignError(f"{p}: kind = {camp.kind!r}; choose loo or forward")
    if camp.backend not in ("local", "ray", "slurm"):
        raise CampaignError(f"{p}: backend = {camp.backend!r}; choose local, ray or slurm")
    if camp.backend == "slurm" and camp.slurm is None:
        raise CampaignError(f"{p}: backend slurm needs a slurm section with the jobs' time limit: slurm: {{time: 240}}")
    if camp.backend == "slurm" and "gpus_per_run" in data:
        raise CampaignError(f"{p}: on SLURM each job's GPUs are slurm.gpus; remove gpus_per_run")
    if camp.kind == "forward" and len(axes) != 1:
        raise CampaignError(f"{p}: a forward ablation sweeps exactly one axis, got {len(axes)}")
    return camp


def _check_types(p: Path, data: dict[str, Any]) -> None:
    """Types of the campaign's keys, before anything runs: one line naming the key and the fix."""
    for key in ("name", "baseline", "kind", "backend"):
        if key in data and not isinstance(data[key], str):
            raise CampaignError(f"{p}: {key} = {data[key]!r}: expected a string")
    _named(p, f"name = {data['name']!r}", data["name"], "a campaign", "my-campaign")
    for key in ("parallel", "runs_per_gpu", "gpus_per_run", "max_retries"):
        v = data.get(key)
        if key in data and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "max_retries" else 1)):
            raise CampaignError(f"{p}: {key} = {v!r}: expected a whole number >= {0 if key == 'max_retries' else 1}")
    for key in ("seeds", "baseline_seeds"):
        v = data.get(key)
        if v is None and key == "baseline_seeds":
            continue
        if key in data and (
            not isinstance(v, list) or not v or any(isinstance(s, bool) or not isinstance(s, int) for s in v)
        ):
            raise CampaignError(f"{p}: {key} = {v!r}: expected a list of integers, e.g. [0, 1]")
        if key in data:
            bad = [s for s in v if not 0 <= s <= SEED_MAX]
            if bad:
                raise CampaignError(
                    f"{p}: {key} = {v!r}: seed {bad[0]} is not in [0, {SEED_MAX}] (numpy's range), e.g. [0, 1]"
                )
            _no_repeats(p, key, v)
    for key in ("overrides", "fit", "axes", "controls"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise CampaignError(f"{p}: {key} = {data[key]!r}: expected a mapping")


def _named(p: Path, what: str, name: Any, kind: str, example: str) -> None:
    """A campaign's, axis's or control's name names folders: one path segment (``name_problem``)."""
    problem = name_problem(name, kind, example)
    if problem:
        raise CampaignError(f"{p}: {what}: {problem}")


def _no_repeats(p: Path, what: str, values: list[Any]) -> None:
    """A repeated seed or axis value would name the same run twice."""
    seen: list[Any] = []
    for v in values:
        if any(_same(v, s) for s in seen):
            raise CampaignError(f"{p}: {what} lists {v!r} twice; each value names one run")
        seen.append(v)


def expand(camp: Campaign, only_axis: str | None = None) -> list[RunSpec]:
    """Baseline + one variant per non-baseline value of each axis (LOO), or every value (forward); x seeds."""
    if only_axis is not None and only_axis not in camp.axes:
        raise CampaignError(f"AXIS={only_axis!r} is not an axis of {camp.name}; axes: {', '.join(camp.axes)}")
    try:
        base_raw = apply_overrides(raw_recipe(camp.baseline), camp.overrides)
        base_flat = recipe_from_dict(base_raw).flat()
    except RecipeError as e:
        raise CampaignError(f"{camp.path}: baseline {camp.baseline!r} with the campaign's overrides: {e}") from None
    variants: list[tuple[str, str | None, Any, dict[str, Any]]] = []
    if camp.kind == "loo":
        variants.append(("baseline", None, None, {}))
    for axis_name, axis in camp.axes.items():
        if only_axis is not None and axis_name != only_axis:
            continue
        try:
            current = base_flat[axis.key]
        except KeyError:
            raise CampaignError(f"{camp.path}: axis {axis_name!r}: {axis.key!r} is not a recipe key") from None
        if camp.kind == "loo" and all(_same(value, current) for value in axis.values):
            raise CampaignError(
                f"{camp.path}: axis {axis_name!r} lists only the baseline's {axis.key} = {current!r}, so it runs "
                "nothing: add a value to leave out, or remove the axis"
            )
        for value in axis.values:
            if camp.kind == "loo" and _same(value, current):
                continue
            variant = f"{axis_name}={fmt_value(value)}"
            if ".." in Path(variant.replace("=", "-")).parts:  # its folder (``local.run_folder``) would be elsewhere
                raise CampaignError(
                    f"{camp.path}: axis {axis_name!r} value {value!r} would put its run folder outside the campaign's"
                    " folder: write it without '..' (an absolute path stays inside)"
                )
            variants.append((variant, axis_name, value, {axis.key: value}))
    if only_axis is None:  # controls: named variants that change several keys (e.g. known-worse positive controls)
        for name, over in camp.controls.items():
            for key in over:
                if key not in base_flat:
                    raise CampaignError(f"{camp.path}: control {name!r}: {key!r} is not a recipe key")
            if all(_same(v, base_flat[k]) for k, v in over.items()):
                raise CampaignError(f"{camp.path}: control {name!r} changes nothing: each key has the baseline's value")
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
                raise CampaignError(f"{camp.path}: variant {variant} seed {seed}: {e}") from None
            specs.append(RunSpec(variant, axis_name, value, seed, recipe, run_key(recipe)))
    return specs


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return list(a) == list(b)
    return a == b


def fmt_value(v: Any) -> str:
    """An axis value as it appears in a variant's name: booleans as on/off, a section as key+value pairs
    (``model.lora: {r: 8}`` → ``lora=r8``)."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, dict):
        return "-".join(f"{k}{fmt_value(x)}" for k, x in v.items()) or "default"
    return str(v)
