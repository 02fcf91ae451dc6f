"""What a campaign is: its file (a baseline recipe, overrides, seeds, axes, controls, a scale
campaign's sizes, fit settings), its expansion into runs, and each run's identity.

Running one is ``runners.ops.campaign_runs`` (MLflow bookkeeping) with the backend its ``backend:``
key names (``runners.ops.backends``: local processes, Ray tasks, SLURM jobs), whose settings it
carries, parsed, as ``backend_settings``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

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
from runners.task.sizes import SIZES, parameter_count
from scalefit.errors import FitError
from scalefit.settings import FitSettings

if TYPE_CHECKING:
    from runners.ops.backends import BackendSettings

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
class Axis:
    key: str  # dotted recipe key, e.g. algorithm.loss
    values: list[Any]


@dataclass
class Campaign:
    name: str
    baseline: str
    path: Path
    kind: str = "loo"  # loo | forward | scale
    seeds: list[int] = field(default_factory=lambda: [0])
    baseline_seeds: list[int] | None = None  # extra seeds for the baseline only
    overrides: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, Axis] = field(default_factory=dict)
    controls: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {dotted key: value, ...}
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)  # scale: embedded size -> its own overrides
    fit: FitSettings = field(default_factory=FitSettings)
    adaptive: Adaptive | None = None  # decision points at which variants the scaling law rules out stop
    backend: str = "local"  # a registered backend (``runners.ops.backends``): local, ray, slurm
    backend_settings: BackendSettings | None = None  # its keys (parallel, ray_address, slurm, ...), parsed


@dataclass
class RunSpec:
    variant: str
    axis: str | None
    value: Any
    seed: int
    recipe: Recipe
    run_key: str


CAMPAIGN_KEYS = {f for f in Campaign.__dataclass_fields__ if f not in ("path", "backend_settings")}  # + backends'


def load_campaign(ref: str | Path) -> Campaign:
    from runners.ops.backends import campaign_keys, parse_backend

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
    known = CAMPAIGN_KEYS | campaign_keys()
    unknown = sorted(set(data) - known)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        valid = ", ".join(sorted(known))
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
    if "sizes" in data:
        data["sizes"] = _sizes(p, data["sizes"])
    adaptive = data.pop("adaptive", None)
    try:
        data["fit"] = fit_settings(data.get("fit"))  # parsed once, here: the campaign carries the result
        if adaptive is not None:
            adaptive = Adaptive.parse(adaptive, data["fit"])
        settings = parse_backend(data.get("backend", "local"), data)  # its keys: the backend's, typed
    except CampaignError as e:
        raise CampaignError(f"{p}: {e}") from None
    data = {k: v for k, v in data.items() if k in CAMPAIGN_KEYS}
    camp = Campaign(path=p, axes=axes, controls=controls, adaptive=adaptive, backend_settings=settings, **data)
    if camp.kind not in ("loo", "forward", "scale"):
        raise CampaignError(f"{p}: kind = {camp.kind!r}; choose loo, forward or scale")
    _check_scale(p, camp, data)
    if camp.kind == "forward" and len(axes) != 1:
        raise CampaignError(f"{p}: a forward ablation sweeps exactly one axis, got {len(axes)}")
    return camp


def _check_types(p: Path, data: dict[str, Any]) -> None:
    """Types of the campaign's keys, before anything runs: one line naming the key and the fix."""
    for key in ("name", "baseline", "kind", "backend"):
        if key in data and not isinstance(data[key], str):
            raise CampaignError(f"{p}: {key} = {data[key]!r}: expected a string")
    _named(p, f"name = {data['name']!r}", data["name"], "a campaign", "my-campaign")
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


SIZES_EXAMPLE = "sizes: [nano, micro, mini], or each with its budget: {nano: {train.steps: 200}, mini: {}}"


def _sizes(p: Path, spec: Any) -> dict[str, dict[str, Any]]:
    """A scale campaign's ``sizes:``: embedded sizes as a list, or a mapping of each to its own recipe
    overrides (its budget, ``{train.steps: 300}``): two or more, each known, none twice."""
    if isinstance(spec, list):
        _no_repeats(p, "sizes", spec)
        spec = {name: {} for name in spec} if all(isinstance(n, str) for n in spec) else spec
    if not isinstance(spec, dict):
        raise CampaignError(f"{p}: sizes = {spec!r}: expected {SIZES_EXAMPLE}")
    twice = _repeated_keys(p, "sizes")
    if twice:
        raise CampaignError(f"{p}: sizes lists {twice!r} twice; each size names its runs once: remove one")
    for name, over in spec.items():
        if not isinstance(name, str) or name not in SIZES:
            near = difflib.get_close_matches(str(name), SIZES, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise CampaignError(
                f"{p}: sizes: {name!r} is not an embedded model size; {hint}choose from {', '.join(SIZES)}"
            )
        if over is not None and (not isinstance(over, dict) or any(not isinstance(k, str) for k in over)):
            raise CampaignError(f"{p}: sizes: {name!r} needs {{dotted.recipe.key: value, ...}}, got {over!r}")
        fixed = sorted({"model.size", "model.path"} & set(over or {}))
        if fixed:
            raise CampaignError(f"{p}: sizes: {name!r} sets {fixed[0]}, which the size itself sets: remove it")
    if len(spec) < 2:
        raise CampaignError(f"{p}: sizes = {list(spec)}: a scale campaign needs two or more, e.g. {SIZES_EXAMPLE}")
    return {name: dict(over or {}) for name, over in spec.items()}


def _repeated_keys(p: Path, section: str) -> str | None:
    """A key written twice in a top-level mapping of the file (YAML keeps only the last, silently)."""
    try:
        root = yaml.compose(p.read_text())
    except yaml.YAMLError:
        return None
    for key, value in getattr(root, "value", []) if isinstance(root, yaml.MappingNode) else []:
        if key.value == section and isinstance(value, yaml.MappingNode):
            names = [k.value for k, _ in value.value]
            return next((n for i, n in enumerate(names) if n in names[:i]), None)
    return None


def _check_scale(p: Path, camp: Campaign, data: dict[str, Any]) -> None:
    """What a scale campaign (one recipe at every size) needs, and what only it takes."""
    if camp.kind != "scale":
        if camp.sizes:
            raise CampaignError(f"{p}: sizes is for kind: scale (one recipe at every size): remove it, or set the kind")
        return
    if not camp.sizes:
        raise CampaignError(f"{p}: kind scale needs the sizes to run, e.g. {SIZES_EXAMPLE}")
    for key in ("axes", "controls", "baseline_seeds", "adaptive"):
        if getattr(camp, key):
            raise CampaignError(
                f"{p}: a scale campaign runs one recipe at every size, so it takes no {key}: remove it "
                "(a LOO campaign with overrides: {model.size: NAME} ablates at one size)"
            )
    if "model.size" in camp.overrides or "model.path" in camp.overrides:
        raise CampaignError(f"{p}: overrides sets model.size or model.path, which each of the sizes sets: remove it")


def size_budgets(specs: list[RunSpec]) -> list[str]:
    """A scale campaign's sizes, one line each: parameters and budget in steps and completions (the
    fit's compute unit when it fits against compute/samples)."""
    lines = {}
    for s in specs:
        r = s.recipe
        lines.setdefault(
            s.value,
            f"  size {s.value:<8} {parameter_count(s.value) / 1e6:6.2f}M parameters, budget {r.train.steps} steps"
            f" = {r.planned_samples:,} completions",
        )
    return list(lines.values())


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
    if camp.kind == "scale":
        if base_flat.get("model.path"):
            raise CampaignError(
                f"{camp.path}: baseline {camp.baseline!r} loads model.path {base_flat['model.path']!r}; a scale "
                "campaign builds each embedded size: use a recipe with model.size"
            )
        for name, over in camp.sizes.items():
            bad = next((k for k in over if k not in base_flat), None)
            if bad is not None:
                raise CampaignError(f"{camp.path}: sizes: {name!r}: {bad!r} is not a recipe key")
            variants.append((f"size={name}", "size", name, {**over, "model.size": name}))
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
