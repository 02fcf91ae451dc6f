"""What a campaign is, as typed data: the campaign (``Campaign``: a baseline recipe, overrides, seeds,
axes, controls, a scale campaign's sizes, its ``fit:`` and ``adaptive:`` sections, its backend and
that backend's settings, ``BackendSettings``), a run of it (``RunSpec``), and the error that names
a fix (``CampaignError``).

Reading and checking a campaign file into these, and its expansion into runs, is
``runners.campaign.load``; running it is ``runners.campaign.runs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from runners.contract import COMPUTE_METRICS
from runners.recipe import Recipe
from scalefit.errors import FitError
from scalefit.forecasts.settings import FitSettings

CAMPAIGNS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "campaigns"


class CampaignError(ValueError):
    """A campaign file, its expansion or its launch is wrong; the message names the fix."""


X = "compute/samples"  # adaptive decisions compare budgets in completions generated, whatever the machine load


def fit_settings(fit: dict[str, Any] | FitSettings | None) -> FitSettings:
    """A campaign's ``fit:`` section (``scalefit.forecasts.settings.FitSettings``), checked when the campaign is
    loaded (before any run starts, not when the fit finally reads it) against the compute axes runs
    log: one line naming the key and the fix."""
    try:
        return FitSettings.parse(fit, x_choices=COMPUTE_METRICS)
    except FitError as e:
        raise CampaignError(str(e)) from None


@dataclass
class Adaptive:
    """A campaign's ``adaptive:`` section: decision points (fractions of the budget), the
    comparison margin and the risk of a wrong stop (``runners.campaign.adaptive`` acts on it), with the
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
    """One of a campaign's ``axes:``: a recipe key and the values its variants try."""

    key: str  # dotted recipe key, e.g. algorithm.loss
    values: list[Any]


@dataclass(kw_only=True)
class BackendSettings:
    """A backend's settings, from the campaign's top-level keys ``keys``; every backend retries a run
    killed by a signal (preempted, segfault, OOM kill) at most ``max_retries`` times."""

    keys: ClassVar[tuple[str, ...]] = ("max_retries",)
    max_retries: int = 3

    @classmethod
    def parse(cls, data: dict[str, Any]) -> BackendSettings:
        """The settings from the campaign's mapping: one ``CampaignError`` line naming the key and the fix."""
        return cls(**whole_numbers(data, [f.name for f in fields(cls)]))


def whole_numbers(data: dict[str, Any], keys: list[str]) -> dict[str, int]:
    """The campaign's whole-number keys among ``keys`` (``max_retries`` >= 0, the others >= 1)."""
    out = {}
    for key in keys:
        if key not in data:
            continue
        v, low = data[key], 0 if key == "max_retries" else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise CampaignError(f"{key} = {v!r}: expected a whole number >= {low}")
        out[key] = v
    return out


@dataclass
class Campaign:
    """A campaign file, checked and typed (``runners.campaign.load.load_campaign``)."""

    name: str
    baseline: str
    path: Path
    kind: str = "loo"  # loo | forward | scale
    seeds: list[int] = field(default_factory=lambda: [0])
    builds: int = 1  # N >= 2: every run on each of N independent builds (model.build_seed 1..N; ``build_seeds``)
    baseline_seeds: list[int] | None = None  # extra seeds for the baseline only
    overrides: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, Axis] = field(default_factory=dict)
    controls: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {dotted key: value, ...}
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)  # scale: embedded size -> its own overrides
    fit: FitSettings = field(default_factory=FitSettings)
    adaptive: Adaptive | None = None  # decision points at which variants the scaling law rules out stop
    backend: str = "local"  # a registered backend (``runners.campaign.backends``): local, ray, slurm
    backend_settings: BackendSettings | None = None  # its keys (parallel, ray_address, slurm, ...), parsed


@dataclass
class RunSpec:
    """One run of a campaign: its variant, the axis and value it changes, its seed (the run's
    ``train.seed``), recipe and identity, and (a campaign of ``builds: N >= 2``) its build seed."""

    variant: str
    axis: str | None
    value: Any
    seed: int
    recipe: Recipe
    run_key: str
    build: int | None = None  # model.build_seed, set by the campaign's ``builds`` (None: the size's one build)

    @property
    def name(self) -> str:
        """The run's name (its MLflow run name, the ``run`` column of curves.csv): variant/seedS[/buildB]."""
        return f"{self.variant}/seed{self.seed}" + (f"/build{self.build}" if self.build is not None else "")


BUILD_STRIDE = 1000  # builds: N >= 2: seed S of the campaign runs on build B with train.seed B * 1000 + S


def build_seeds(camp: Campaign) -> list[tuple[int | None, int]]:
    """Each of the campaign's builds with the offset of its runs' seeds: [(None, 0)] (the size's one
    build, seeds as listed) or, for ``builds: N >= 2``, [(1, 1000), ..., (N, N * 1000)]. Distinct
    seeds across builds keep one run per (variant, seed), the unit every seed-wise analysis resamples,
    so a builds campaign's runs fit like any other's; the thousands say the build."""
    if camp.builds < 2:
        return [(None, 0)]
    return [(b, b * BUILD_STRIDE) for b in range(1, camp.builds + 1)]


CAMPAIGN_KEYS = {f for f in Campaign.__dataclass_fields__ if f not in ("path", "backend_settings")}  # + backends'


def same_value(a: Any, b: Any) -> bool:
    """Whether two values of a recipe key are the same (a list and a tuple alike)."""
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
