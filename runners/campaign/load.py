"""A campaign file read and checked (``load_campaign``: one ``CampaignError`` line naming the fix,
before anything runs) into a ``runners.campaign.spec.Campaign``, and its expansion into runs
(``expand``: a ``RunSpec`` per variant x seed, and x build with ``builds: N``, each with its resolved
recipe and identity).

Running one is ``runners.campaign.runs`` (MLflow bookkeeping) with the backend its ``backend:`` key
names (``runners.campaign.backends``: local processes, Ray tasks, SLURM jobs), whose settings it
carries, parsed, as ``backend_settings``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from runners.campaign.backends import campaign_keys, parse_backend
from runners.campaign.spec import (
    BUILD_STRIDE,
    CAMPAIGN_KEYS,
    CAMPAIGNS_DIR,
    Adaptive,
    Axis,
    BackendSettings,
    Campaign,
    CampaignError,
    RunSpec,
    build_seeds,
    fit_settings,
    fmt_value,
    same_value,
    whole_numbers,
)
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

Variant = tuple[str, str | None, Any, dict[str, Any]]  # name, axis, value, the recipe keys it changes


def load_campaign(ref: str | Path) -> Campaign:
    """A campaign file (a path, or a name in experiments/campaigns) read and checked."""
    p = _find(ref)
    try:
        data = read_yaml(p, "campaign")
    except RecipeError as e:
        raise CampaignError(str(e)) from None
    _check_keys(p, data)
    _check_types(p, data)
    empty_axes = "axes" in data and not data["axes"]  # written, with nothing in it (`axes: {}`)
    axes = _axes(p, data.pop("axes", None) or {})
    controls = data.pop("controls", None) or {}
    _check_controls(p, controls)
    if "sizes" in data:
        data["sizes"] = _sizes(p, data["sizes"])
    adaptive = data.pop("adaptive", None)
    adaptive, settings = _sections(p, data, adaptive)
    data = {k: v for k, v in data.items() if k in CAMPAIGN_KEYS}
    camp = Campaign(path=p, axes=axes, controls=controls, adaptive=adaptive, backend_settings=settings, **data)
    if camp.kind not in ("loo", "forward", "scale"):
        raise CampaignError(f"{p}: kind = {camp.kind!r}; choose loo, forward or scale")
    _check_scale(p, camp, data)
    if camp.kind == "loo" and empty_axes and not controls:
        raise CampaignError(
            f"{p}: axes is empty and there are no controls, so the campaign would run its baseline alone and "
            "compare nothing: name an axis to leave out (axes: {loss: {key: algorithm.loss, values: [dapo]}}) "
            "or a control; to fit the baseline's curve alone, remove the axes key"
        )
    _check_builds(p, camp)
    if camp.kind == "forward" and len(axes) != 1:
        raise CampaignError(f"{p}: a forward ablation sweeps exactly one axis, got {len(axes)}")
    return camp


def _find(ref: str | Path) -> Path:
    """The campaign file ``ref`` names: a path, else a name in experiments/campaigns."""
    p = Path(ref)
    if p.is_file():
        return p
    cand = CAMPAIGNS_DIR / (p.name if p.suffix else f"{p.name}.yaml")
    if not cand.is_file():
        known = ", ".join(sorted(x.stem for x in CAMPAIGNS_DIR.glob("*.yaml")))
        raise CampaignError(f"campaign {ref!r} not found (known campaigns: {known})")
    return cand


def _check_keys(p: Path, data: dict[str, Any]) -> None:
    """Every key is a campaign's or a backend's (a typo is named, with the nearest key); the required ones are there."""
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


def _axes(p: Path, spec: dict[str, Any]) -> dict[str, Axis]:
    """The campaign's ``axes:``: each a recipe key and the values to try, named as a path segment."""
    axes = {}
    for name, axis in spec.items():
        if not isinstance(axis, dict) or set(axis) != {"key", "values"} or not isinstance(axis["values"], list):
            raise CampaignError(f"{p}: axis {name!r} needs {{key: dotted.recipe.key, values: [...]}}, got {axis!r}")
        _named(p, f"axis {name!r}", name, "an axis", "loss")
        if not axis["values"]:
            raise CampaignError(f"{p}: axis {name!r} has no values: list the value(s) to try, or remove the axis")
        _no_repeats(p, f"axis {name!r} values", axis["values"])
        axes[name] = Axis(axis["key"], axis["values"])
    return axes


def _check_controls(p: Path, controls: dict[str, Any]) -> None:
    """The campaign's ``controls:``: each a name and the recipe keys it changes."""
    for name, over in controls.items():
        _named(p, f"control {name!r}", name, "a control", "lr_half")
        if not isinstance(over, dict) or not over:
            raise CampaignError(f"{p}: control {name!r} needs {{dotted.recipe.key: value, ...}}, got {over!r}")


def _sections(p: Path, data: dict[str, Any], adaptive: Any) -> tuple[Adaptive | None, BackendSettings]:
    """The typed sections, parsed once, here (the campaign carries them): ``fit:`` (into ``data``),
    ``adaptive:`` and the backend's keys."""
    try:
        data["fit"] = fit_settings(data.get("fit"))
        if adaptive is not None:
            adaptive = Adaptive.parse(adaptive, data["fit"])
        return adaptive, parse_backend(data.get("backend", "local"), data)
    except CampaignError as e:
        raise CampaignError(f"{p}: {e}") from None


def _check_types(p: Path, data: dict[str, Any]) -> None:
    """Types of the campaign's keys, before anything runs: one line naming the key and the fix."""
    for key in ("name", "baseline", "kind", "backend"):
        if key in data and not isinstance(data[key], str):
            raise CampaignError(f"{p}: {key} = {data[key]!r}: expected a string")
    _named(p, f"name = {data['name']!r}", data["name"], "a campaign", "my-campaign")
    try:
        whole_numbers(data, ["builds"])
    except CampaignError as e:
        raise CampaignError(f"{p}: {e}, e.g. builds: 3 (each run on 3 independent base-model builds)") from None
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


def _check_builds(p: Path, camp: Campaign) -> None:
    """``builds: N >= 2`` sets each run's ``model.build_seed`` (1..N) and offsets its seeds by the
    build (``spec.build_seeds``): no other part of the campaign may set the build seed, and seeds stay
    below the offset."""
    if camp.builds < 2:
        return
    where = ["overrides"] if "model.build_seed" in camp.overrides else []
    where += [f"sizes: {n!r}" for n, over in camp.sizes.items() if "model.build_seed" in over]
    where += [f"axis {n!r}" for n, axis in camp.axes.items() if axis.key == "model.build_seed"]
    where += [f"control {n!r}" for n, over in camp.controls.items() if "model.build_seed" in over]
    if where:
        raise CampaignError(
            f"{p}: {where[0]} sets model.build_seed and builds = {camp.builds} sets it too (1..{camp.builds} for "
            "every run): remove one (builds: N for N independent builds, or model.build_seed for one chosen build)"
        )
    for key in ("seeds", "baseline_seeds"):
        big = [s for s in getattr(camp, key) or [] if s >= BUILD_STRIDE]
        if big:
            raise CampaignError(
                f"{p}: {key} lists {big[0]}, but with builds = {camp.builds} seed S runs on build B as train.seed "
                f"B*{BUILD_STRIDE}+S: use seeds in [0, {BUILD_STRIDE - 1}]"
            )


SIZES_EXAMPLE = "sizes: [nano, micro, mini], or each with its budget: {nano: {train.steps: 200}, mini: {}}"


def _sizes(p: Path, spec: Any) -> dict[str, dict[str, Any]]:
    """A scale campaign's ``sizes:``: embedded sizes as a list, or a mapping of each to its own recipe
    overrides (its budget, ``{train.steps: 300}``): two or more, each known, none twice."""
    if isinstance(spec, list):
        _no_repeats(p, "sizes", spec)
        spec = {name: {} for name in spec} if all(isinstance(n, str) for n in spec) else spec
    if not isinstance(spec, dict):
        raise CampaignError(f"{p}: sizes = {spec!r}: expected {SIZES_EXAMPLE}")
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
        if any(same_value(v, s) for s in seen):
            raise CampaignError(f"{p}: {what} lists {v!r} twice; each value names one run")
        seen.append(v)


def expand(camp: Campaign, only_axis: str | None = None, only_sizes: tuple[str, ...] = ()) -> list[RunSpec]:
    """Baseline + one variant per non-baseline value of each axis (LOO), or every value (forward); x seeds
    (x builds: ``spec.build_seeds``).
    ``only_sizes``: of a scale campaign, those sizes' runs alone (the smaller sizes first, the largest
    after its forecast is committed)."""
    if only_axis is not None and only_axis not in camp.axes:
        raise CampaignError(f"AXIS={only_axis!r} is not an axis of {camp.name}; axes: {', '.join(camp.axes)}")
    if only_sizes and camp.kind != "scale":
        raise CampaignError(
            f"--size picks sizes of a scale campaign; {camp.name} is a {camp.kind} campaign: leave --size out"
        )
    if unknown := [s for s in only_sizes if s not in camp.sizes]:
        raise CampaignError(f"--size {unknown[0]!r} is not a size of {camp.name}; sizes: {', '.join(camp.sizes)}")
    try:
        base_raw = apply_overrides(raw_recipe(camp.baseline), camp.overrides)
        base_flat = recipe_from_dict(base_raw).flat()
    except RecipeError as e:
        raise CampaignError(f"{camp.path}: baseline {camp.baseline!r} with the campaign's overrides: {e}") from None
    if camp.builds > 1 and (base_flat.get("model.path") or base_flat.get("model.build_seed") is not None):
        what = "loads model.path" if base_flat.get("model.path") else "sets model.build_seed"
        raise CampaignError(
            f"{camp.path}: builds = {camp.builds} builds each embedded size {camp.builds} times, but baseline "
            f"{camp.baseline!r} {what}: use a recipe with model.size and no build seed, or remove builds"
        )
    variants = _size_variants(camp, base_flat) if camp.kind == "scale" else []
    if camp.kind == "loo":
        variants.append(("baseline", None, None, {}))
    variants += _axis_variants(camp, base_flat, only_axis)
    if only_axis is None:  # controls: named variants that change several keys (e.g. known-worse positive controls)
        variants += _control_variants(camp, base_flat)
    specs = [spec for variant in variants for spec in _runs(camp, base_raw, variant)]
    # every size is checked, chosen or not: a bad budget of the size run last is found before the first runs
    return [spec for spec in specs if not only_sizes or spec.value in only_sizes]


def _size_variants(camp: Campaign, base_flat: dict[str, Any]) -> list[Variant]:
    """A scale campaign's variants: the baseline at each size, with that size's own overrides."""
    if base_flat.get("model.path"):
        raise CampaignError(
            f"{camp.path}: baseline {camp.baseline!r} loads model.path {base_flat['model.path']!r}; a scale "
            "campaign builds each embedded size: use a recipe with model.size"
        )
    variants: list[Variant] = []
    for name, over in camp.sizes.items():
        bad = next((k for k in over if k not in base_flat), None)
        if bad is not None:
            raise CampaignError(f"{camp.path}: sizes: {name!r}: {bad!r} is not a recipe key")
        variants.append((f"size={name}", "size", name, {**over, "model.size": name}))
    return variants


def _axis_variants(camp: Campaign, base_flat: dict[str, Any], only_axis: str | None) -> list[Variant]:
    """A variant per value of each axis (``only_axis``: that one), the baseline's own value left out in a LOO."""
    variants: list[Variant] = []
    for axis_name, axis in camp.axes.items():
        if only_axis is not None and axis_name != only_axis:
            continue
        try:
            current = base_flat[axis.key]
        except KeyError:
            raise CampaignError(f"{camp.path}: axis {axis_name!r}: {axis.key!r} is not a recipe key") from None
        if camp.kind == "loo" and all(same_value(value, current) for value in axis.values):
            raise CampaignError(
                f"{camp.path}: axis {axis_name!r} lists only the baseline's {axis.key} = {current!r}, so it runs "
                "nothing: add a value to leave out, or remove the axis"
            )
        for value in axis.values:
            if camp.kind == "loo" and same_value(value, current):
                continue
            variant = f"{axis_name}={fmt_value(value)}"
            if ".." in Path(variant.replace("=", "-")).parts:  # its folder (``local.run_folder``) would be elsewhere
                raise CampaignError(
                    f"{camp.path}: axis {axis_name!r} value {value!r} would put its run folder outside the campaign's"
                    " folder: write it without '..' (an absolute path stays inside)"
                )
            variants.append((variant, axis_name, value, {axis.key: value}))
    return variants


def _control_variants(camp: Campaign, base_flat: dict[str, Any]) -> list[Variant]:
    """A variant per control, each changing a key of the baseline at least."""
    variants: list[Variant] = []
    for name, over in camp.controls.items():
        for key in over:
            if key not in base_flat:
                raise CampaignError(f"{camp.path}: control {name!r}: {key!r} is not a recipe key")
        if all(same_value(v, base_flat[k]) for k, v in over.items()):
            raise CampaignError(f"{camp.path}: control {name!r} changes nothing: each key has the baseline's value")
        variants.append((f"control={name}", "control", name, dict(over)))
    return variants


def _runs(camp: Campaign, base_raw: dict[str, Any], variant: Variant) -> list[RunSpec]:
    """A variant's runs, one per seed (the baseline's extra seeds too) and build (``builds``: each
    build's seeds offset, ``spec.build_seeds``), each with its recipe and identity."""
    name, axis_name, value, over = variant
    seeds = camp.seeds
    if name == "baseline" and camp.baseline_seeds:
        seeds = sorted(set(camp.seeds) | set(camp.baseline_seeds))
    specs = []
    for build, offset in build_seeds(camp):
        built = {} if build is None else {"model.build_seed": build}
        for seed in (s + offset for s in seeds):
            raw = apply_overrides(base_raw, {**over, **built, "train.seed": seed, "name": f"{camp.name}/{name}"})
            try:
                recipe = recipe_from_dict(raw)
            except RecipeError as e:
                raise CampaignError(f"{camp.path}: variant {name} seed {seed}: {e}") from None
            specs.append(RunSpec(name, axis_name, value, seed, recipe, run_key(recipe), build))
    return specs


def campaign_baseline(ref: str, sets: dict[str, Any]) -> tuple[Recipe, str]:
    """A campaign's baseline run as it runs (its recipe with the campaign's overrides, and ``sets``),
    and a line saying what that is."""
    camp = load_campaign(ref)
    specs = expand(camp)
    base = next((s for s in specs if s.variant == "baseline"), specs[0])
    recipe = base.recipe
    if sets:
        built = {} if base.build is None else {"model.build_seed": base.build}
        over = {**camp.overrides, **built, "train.seed": base.seed, "name": recipe.name, **sets}
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
