"""Load a campaign's curves, the first part of ``analysis fit``: every evaluation of every run from
MLflow (``load_curves``) or a published ``curves.csv`` (``read_curves``), where the campaign's runs
stand (``progress``: unfinished, missing, trained twice), and which points a fit may hold
(``bad_points``, ``steady_points``, ``spliced``, ``unfinished``)."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from runners.contract import COMPUTE_METRICS, MEAN_AT_16, PASS_AT_16
from scalefit.data.unstable import MAD_SD, Flag, flag_runs
from scalefit.forecasts.settings import FitSettings

CURVE_METRICS = (MEAN_AT_16, PASS_AT_16, *COMPUTE_METRICS)


def load_curves(
    campaign: str, tracking_uri: str | None = None, current: set[str] | None = None, log=print
) -> pd.DataFrame:
    """Every validation point of every run of a campaign (full metric history, not the last value).

    ``current``: the run identities the campaign file expands to now. When the store holds some of
    them, runs of other versions of the campaign (an edited recipe, budget or seeds; other code)
    are left out and counted, never pooled with these; a store with none of them (a study
    recorded by older code) is read whole.
    """
    from runners.tracking import store  # MLflow: imported where a store is read, not by a fit of a curves.csv

    client = store.read_client(tracking_uri)
    exp_id = store.experiment_id(client, campaign)
    if exp_id is None:
        raise ValueError(f"no MLflow experiment named {campaign!r} at {client.tracking_uri}; run the campaign first")
    runs = store.identified_runs(client, exp_id)
    if current and current & set(runs):
        others = set(runs) - current
        if others:
            log(
                f"{len(others)} run(s) of another version of campaign {campaign} (another recipe, budget, seeds or"
                " code) left out of the fit; they stay in MLflow"
            )
        runs = {k: r for k, r in runs.items() if k in current}
    frames = []
    for run in runs.values():
        cols = {key: store.history(client, run.info.run_id, key) for key in CURVE_METRICS}
        df = pd.DataFrame(cols).rename_axis("step").reset_index()
        if df["compute/samples"].isna().all():  # runs logged before compute/samples existed
            df["compute/samples"] = _samples_by_step(df["step"], run.data.params)
        if df.empty:
            continue
        tags = run.data.tags
        df.insert(0, "run", run.info.run_name)
        df.insert(1, "variant", tags.get(store.VARIANT, ""))
        df.insert(2, "axis", tags.get(store.AXIS, ""))
        df.insert(3, "seed", int(tags.get(store.SEED, 0)))
        df["run_id"] = run.info.run_id
        df["build"] = tags.get(store.BASE_WEIGHTS, "")[:12]  # the weights it started from (analysis.builds)
        df["done"] = store.is_done(run)
        df["stopped"] = tags.get(store.STOP_DECISION, "") if store.is_stopped(run) else ""
        frames.append(df[df["step"].isin(cols[MEAN_AT_16].index)])  # a logged NaN stays, to be named (bad_points)
    if not frames:
        raise ValueError(f"campaign {campaign!r} has no validation curves yet")
    cols = ["run", "variant", "axis", "seed", "step", *CURVE_METRICS, "run_id", "build", "done", "stopped"]
    curves = pd.concat(frames, ignore_index=True)[cols].sort_values(["variant", "seed", "step"], ignore_index=True)
    _one_run_per_seed(curves, f"campaign {campaign!r} at {client.tracking_uri}", "run_id")
    return curves


@dataclass(frozen=True)
class Progress:
    """Where a campaign's runs stand in its store, each run named (``variant/seedN``): those neither
    finished nor stopped by a decision, with their MLflow status (``unfinished``), those with no run
    yet (``missing``), and those with more than one finished run (``twice``: two campaigns trained
    them into one store; the fit keeps the newest, ``store.chosen_run``)."""

    runs: int
    unfinished: list[str]
    missing: list[str]
    twice: list[str]

    @property
    def complete(self) -> bool:
        return not (self.unfinished or self.missing)

    def text(self) -> str:
        """The runs the fit lacks, counted and named: "2 of 6 runs unfinished (A running, B failed), 1 never
        started (C)"."""
        parts = [f"{len(self.unfinished)} of {self.runs} runs unfinished ({_names(self.unfinished)})"]
        parts += [f"{len(self.missing)} never started ({_names(self.missing)})"] if self.missing else []
        return ", ".join(parts[0 if self.unfinished else 1 :])


def _names(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def progress(campaign: str, tracking_uri: str | None, specs: Iterable[Any]) -> Progress:
    """Where the runs a campaign file expands to (``specs``: RunSpecs, by identity) stand in its
    store. A store that holds none of them (a study recorded by older code, read whole by
    ``load_curves``) is matched by variant and seed instead."""
    from runners.tracking import store

    client = store.read_client(tracking_uri)
    exp_id = store.experiment_id(client, campaign)
    if exp_id is None:
        raise ValueError(f"no MLflow experiment named {campaign!r} at {client.tracking_uri}; run the campaign first")
    groups = store.runs_by_identity(client, exp_id)
    specs = list(specs)
    if not {s.run_key for s in specs} & set(groups):
        by_seed: dict[tuple[str, int], list] = {}
        for runs in groups.values():
            for r in runs:
                tags = r.data.tags
                by_seed.setdefault((tags.get(store.VARIANT, ""), int(tags.get(store.SEED, 0))), []).append(r)
        groups = {s.run_key: by_seed.get((s.variant, s.seed), []) for s in specs}
    unfinished, missing, twice = [], [], []
    for s in specs:
        name, runs = f"{s.variant}/seed{s.seed}", groups.get(s.run_key, [])
        run = store.chosen_run(runs) if runs else None
        done = [r.info.run_id for r in runs if store.is_done(r)]
        if run is None:
            missing.append(name)
        elif not (store.is_done(run) or store.is_stopped(run)):
            unfinished.append(f"{name} {run.info.status.lower()}")
        if len(done) > 1:
            twice.append(f"{name} ({len(done)} finished runs: {', '.join(done)})")
    return Progress(len(specs), unfinished, missing, twice)


def _one_run_per_seed(curves: pd.DataFrame, source: str, run_col: str = "run") -> None:
    """Refuse curves where two runs share a variant and seed number: pooled, the bootstrap would
    resample them as one series (two studies joined, or two versions of one campaign)."""
    runs = curves.groupby(["variant", "seed"])[run_col].unique()
    shared = runs[runs.map(len) > 1]
    if len(shared):
        (variant, seed), ids = shared.index[0], shared.iloc[0]
        names = curves.loc[curves[run_col].isin(ids), "run"].unique()
        raise ValueError(
            f"{source}: {len(ids)} runs ({', '.join(map(str, names))}) are all {variant!r} seed {seed}: runs of"
            " different studies or campaign versions need distinct seed numbers, or fit one version (the"
            " campaign file as it is now picks its own runs)"
        )


def read_curves(path: Path, settings: FitSettings) -> pd.DataFrame:
    """A published ``curves.csv`` (what ``load_curves`` returned, saved), checked for the columns the
    campaign's fit ``settings`` need; empty text cells read back as "" as they were written, not NaN."""
    x = settings.x
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    _whole_rows(path)
    try:
        curves = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: an empty file; a curves.csv has a header and a row per evaluation") from None
    missing = [c for c in ("run", "variant", "axis", "seed", "step", MEAN_AT_16, x) if c not in curves]
    if missing:
        raise ValueError(
            f"{path}: missing column(s) {', '.join(map(repr, missing))} (a curves.csv as `analysis fit` writes it has"
            f" {', '.join(['run', 'variant', 'axis', 'seed', 'step', *CURVE_METRICS])})"
        )
    if curves.empty:
        raise ValueError(
            f"{path}: a header and no rows: no evaluation to fit; write it again from the campaign's store "
            "(`python -m analysis fit CAMPAIGN` writes artifacts/campaigns/CAMPAIGN/fit/curves.csv)"
        )
    run_col = "run_id" if "run_id" in curves else "run"  # names repeat across versions of a campaign; ids do not
    rep = curves[curves.duplicated([run_col, "step"])]
    if len(rep):
        raise ValueError(
            f"{path}: run {rep['run'].iloc[0]!r} has step {rep['step'].iloc[0]} more than once (a file joined twice?)"
        )
    _one_run_per_seed(curves, str(path), run_col)
    text = [c for c in ("axis", "stopped", "build") if c in curves]
    return curves.astype({c: object for c in text}).fillna({c: "" for c in text})


def _whole_rows(path: Path) -> None:
    """Refuse a file cut short (a copy or a write interrupted): every row a CSV writer writes ends
    with a line end, and a last row without one lost its end, so its cells would read as a bad point,
    a run of another study or a wrong number."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        if size == 0:
            return
        fh.seek(max(0, size - 65536))
        tail = fh.read()
    if tail.endswith(b"\n"):
        return
    with path.open("rb") as fh:
        line = sum(1 for _ in fh)
    cut = tail.rsplit(b"\n", 1)[-1].decode(errors="replace")
    raise ValueError(
        f"{path}: the file ends mid-row (line {line}, {cut[-40:]!r}, has no line end): it was cut short (a copy or a"
        " write interrupted); copy it again, or write it again from the campaign's store (`python -m analysis fit"
        " CAMPAIGN` writes artifacts/campaigns/CAMPAIGN/fit/curves.csv)"
    )


def _samples_by_step(steps: pd.Series, params: dict[str, str]) -> pd.Series:
    """Completions generated before each step, from a run's logged recipe: one batch of rollouts per
    step, or (PPO-off-policy-k) one per k steps."""
    rollouts = int(params.get("batch.prompts", 0)) * int(params.get("batch.generations", 0))
    k = int(params.get("algorithm.off_policy_k", 1)) if params.get("algorithm.off_policy") == "ppo" else 1
    return np.ceil(steps / k) * rollouts


def steady_points(curves: pd.DataFrame) -> tuple[pd.DataFrame, list[Flag]]:
    """The evaluations a fit should hold, and the runs flagged unstable (``scalefit.data.unstable``: a
    seed that leaves its siblings by a robust margin at a step). The flagged evaluations are left out
    of the fit, as one collapse would otherwise move its variant's curve and every verdict; they stay
    in curves.csv and the plot (red crosses), and each run is named in its variant's row. Runs on
    several base-model builds are flagged only where they also leave their build's other runs
    (``_left_their_build``)."""
    hit, flags = unstable_points(curves)
    return curves[~hit], flags


def unstable_points(curves: pd.DataFrame) -> tuple[np.ndarray, list[Flag]]:
    """Which rows of ``curves`` are flagged evaluations (a boolean mask), and the flagged runs."""
    if "step" not in curves or curves.empty:
        return np.zeros(len(curves), dtype=bool), []
    flags = flag_runs(curves, MEAN_AT_16)
    if "build" in curves and curves["build"].fillna("").nunique() > 1:
        flags = _left_their_build(curves, flags)
    out = {(f.variant, f.seed, s) for f in flags for s in f.steps}
    keys = zip(curves["variant"], curves["seed"], curves["step"], strict=True)
    return np.array([(v, int(s), int(t)) in out for v, s, t in keys], dtype=bool), flags


WITHIN_BUILD_Z = 5.0  # a flagged run also leaves its build-mates by this many of their typical distances


def _left_their_build(curves: pd.DataFrame, flags: list[Flag]) -> list[Flag]:
    """Of runs on several base-model builds, the flagged evaluations where a run also leaves its
    build-mates (its variant's other runs of its build) by ``WITHIN_BUILD_Z`` times their typical distance
    from one another: a run that moves with them shows its build's level (builds differ ~10x more
    than seeds, results/builds-gpu), not an unstable run. A run alone on its build keeps its flags."""
    frame = curves.assign(build=curves["build"].fillna("").astype(str))
    wide = frame.pivot_table(index=["variant", "build", "seed"], columns="step", values=MEAN_AT_16, aggfunc="mean")
    mates, dist = {}, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step no mate reached: NaN, and no distance
        for (variant, _), g in wide.groupby(level=[0, 1], sort=False):
            m = g.to_numpy(float)
            for i, seed in enumerate(g.index.get_level_values("seed")):
                if len(m) > 1:
                    mates[(variant, int(seed))] = med = np.nanmedian(np.delete(m, i, axis=0), axis=0)
                    dist.append(np.abs(m[i] - med))
    d = np.concatenate(dist) if dist else np.array([])
    floor = MAD_SD * float(np.median(d[np.isfinite(d)])) if np.isfinite(d).any() else 0.0
    steps = list(wide.columns)
    out = []
    for f in flags:
        med = mates.get((f.variant, f.seed))
        if med is None:
            out.append(f)
            continue
        keep = [
            i
            for i, (step, v) in enumerate(zip(f.steps, f.values, strict=True))
            if not np.isfinite(med[steps.index(step)]) or abs(v - med[steps.index(step)]) > WITHIN_BUILD_Z * floor
        ]
        if keep:
            mine = (frame["variant"] == f.variant) & (frame["seed"] == f.seed) & frame[MEAN_AT_16].notna()
            last = int(frame.loc[mine, "step"].max())
            kept = [f.steps[i] for i in keep]
            out.append(
                replace(
                    f,
                    steps=kept,
                    values=[f.values[i] for i in keep],
                    siblings=[f.siblings[i] for i in keep],
                    recovered=last not in kept,
                )
            )
    return out


def bad_points(curves: pd.DataFrame, x: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The points a curve can hold, and those it cannot (``variant``, ``why``: run, step, column and
    value): a mean@16 that is not a pass rate in [0, 1] (NaN included), or compute (``x``) that is not
    a finite number >= 0. Left out by name, one bad point spoils neither its variant nor, through the
    campaign's shared R0, every other one."""
    y = pd.to_numeric(curves[MEAN_AT_16], errors="coerce")
    c = pd.to_numeric(curves[x], errors="coerce")
    bad_y, bad_c = (~y.between(0, 1)).to_numpy(), (~(np.isfinite(c) & (c >= 0))).to_numpy()
    rows = []
    for i in np.flatnonzero(bad_y | bad_c):  # by position: an index may repeat (frames joined in a notebook)
        col = MEAN_AT_16 if bad_y[i] else x
        rows.append({"variant": curves["variant"].iloc[i], "why": _bad_point(curves.iloc[i], col, float(c.iloc[i]))})
    good = ~(bad_y | bad_c)
    clean = curves[good].assign(**{MEAN_AT_16: y.to_numpy()[good], x: c.to_numpy()[good]})
    return clean, pd.DataFrame(rows, columns=["variant", "why"])


def _bad_point(r: pd.Series, col: str, c: float) -> str:
    """A bad point named (run, step, column, value) with what is wrong with it: its mean@16, or its compute ``c``."""
    run = r["run"] if "run" in r else f"{r['variant']}/seed{r['seed']}"
    if col == MEAN_AT_16:
        why = "is not a pass rate in [0, 1]"
    else:
        why = "is negative: compute spent starts at 0 and only grows" if c < 0 else "is not a finite number"
    v = r[col]
    return f"{run} step {r['step']}: {col} = {f'{v:g}' if isinstance(v, float) else repr(v)} {why}"


def spliced(g: pd.DataFrame, x: str) -> str | None:
    """Why a variant's curves cannot be fitted because a seed's compute falls as its step rises
    (two runs spliced into one history), or None."""
    for seed, gs in g.sort_values("step").groupby("seed"):
        values = gs[x].to_numpy()
        drop = np.flatnonzero(np.diff(values) < 0)
        if len(drop):
            i = drop[0]
            steps = gs["step"].to_numpy()
            return (
                f"seed {seed}: {x} goes backwards ({values[i]:.4g} at step {steps[i]}, {values[i + 1]:.4g} at step "
                f"{steps[i + 1]}): two runs spliced into one history"
            )
    return None


def unfinished(g: pd.DataFrame) -> int:
    """How many of a variant's runs neither finished nor were stopped by a decision (still running,
    or failed): their curves end where they stopped logging."""
    if "done" not in g:
        return 0
    ended = g["done"].astype(bool)
    if "stopped" in g:
        ended |= g["stopped"].fillna("") != ""
    return int(g.loc[~ended, "seed"].nunique())  # one run per seed (``_one_run_per_seed``)
