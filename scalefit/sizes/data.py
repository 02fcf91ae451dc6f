"""A scale study's curves: each size's parameter count and every evaluation (``SizeData``), from a mapping
(``size_data``) or a curves CSV (``read_sizes``), checked with one line naming the fix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from scalefit.data.curves_csv import read_curves
from scalefit.errors import FitError

FINISHED_AT = 0.95  # a size whose runs reach less of the other sizes' compute is read as unfinished


def reach_text(share: float) -> str:
    """A share of the compute as a whole percent, rounded down: a size short of ``FINISHED_AT`` never reads 95%."""
    return f"{int(share * 100 + 1e-9)}%"


@dataclass
class SizeData:
    """One size's runs: its parameter count and every evaluation (compute, value, seed, and the base-model
    build its run started from, where recorded)."""

    params: float
    compute: np.ndarray
    value: np.ndarray
    seed: np.ndarray
    build: np.ndarray | None = None

    def mean_curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The seeds' mean at each compute with how many seeds it averages (evaluations at one compute)."""
        df = pd.DataFrame({"c": self.compute, "v": self.value}).groupby("c")["v"].agg(["mean", "size"])
        return df.index.to_numpy(float), df["mean"].to_numpy(float), df["size"].to_numpy(float)

    @property
    def n_seeds(self) -> int:
        """Its runs: distinct seeds, of each build where there are several."""
        if self.n_builds < 2:
            return len(np.unique(self.seed))
        return len({(str(b), str(s)) for b, s in zip(self.build, self.seed, strict=True)})

    @property
    def n_builds(self) -> int:
        return 1 if self.build is None else len(np.unique(self.build))

    def by_build(self) -> dict[str, SizeData]:
        """Each build's runs alone, in the order of their labels."""
        if self.build is None:
            return {"": self}
        out = {}
        for b in np.unique(self.build):
            m = self.build == b
            out[str(b)] = SizeData(self.params, self.compute[m], self.value[m], self.seed[m])
        return out

    def run_ends(self) -> pd.Series:
        """Each run's last compute (a run: one seed of one build)."""
        runs = pd.DataFrame({"c": self.compute, "s": self.seed, "b": self.build if self.build is not None else ""})
        return runs.groupby(["b", "s"])["c"].max()

    def compared(self, upto: float = np.inf) -> SizeData:
        """Its evaluations where its curves are compared with a forecast: up to ``upto`` and to the end of its
        shortest run that has an evaluation past compute 0 (past it a mean would average fewer runs, a
        different set at each compute; a run with only its first evaluation gives its R0 and nothing else)."""
        ends = self.run_ends()
        return self.upto(min(upto, float(ends[ends > 0].min()) if (ends > 0).any() else 0.0))

    def upto(self, compute: float) -> SizeData:
        """Its evaluations at computes up to ``compute``."""
        keep = self.compute <= compute * (1 + 1e-9)
        build = self.build[keep] if self.build is not None else None
        return SizeData(self.params, self.compute[keep], self.value[keep], self.seed[keep], build)

    def r0(self) -> float | None:
        """The base model's value (evaluations at compute 0), or None when it has none."""
        at0 = self.compute == 0
        return float(self.value[at0].mean()) if at0.any() else None


def compute_reached(data: Mapping[str, SizeData], name: str, at_least: float = 0.0) -> float:
    """How far size ``name``'s runs reach: the last compute of its shortest run (a run: one seed of one
    build) over the furthest any other size reached, or ``at_least`` where that is further (1.0 where it
    reaches as far, or there is nothing to reach). A scale study gives every size one budget, so a share
    under ``FINISHED_AT`` is a size whose runs have not all finished: its fitted A extrapolates."""
    shortest = float(data[name].run_ends().min())
    full = max((float(o.compute.max()) for k, o in data.items() if k != name and len(o.compute)), default=0.0)
    full = max(full, at_least)
    return shortest / full if full > 0 else 1.0


def size_data(curves: Mapping[str, tuple]) -> dict[str, SizeData]:
    """{size: (parameters, compute, value, seed[, build])} as ``SizeData``, checked: one line naming the fix.
    A build of None (or one label) is one build."""
    if not curves:
        raise FitError("no sizes: the curves need a size and a parameters column, one size per model")
    out = {}
    for name, (n, c, v, s, *b) in curves.items():
        if not np.isfinite(n) or n <= 0:
            raise FitError(f"size {name!r}: parameters = {n!r}; give each size its parameter count (> 0)")
        c, v = np.asarray(c, float), np.asarray(v, float)
        build = None if not b or b[0] is None else pd.Series(b[0]).fillna("").astype(str).to_numpy()
        build = build if build is not None and len(np.unique(build)) > 1 else None
        out[name] = SizeData(float(n), c, v, np.asarray(s if s is not None else np.zeros(len(c))), build)
    by_n: dict[float, str] = {}
    for name, d in out.items():
        if d.params in by_n:
            raise FitError(
                f"sizes {by_n[d.params]!r} and {name!r} have the same parameter count {d.params:g}: one is a "
                "duplicate; give each size its own count, or join their runs under one name"
            )
        by_n[d.params] = name
    return dict(sorted(out.items(), key=lambda kv: kv[1].params))


def read_sizes(
    path: str, x: str, y: str, size_col: str = "size", params_col: str = "parameters", build_col: str = "build"
) -> dict[str, SizeData]:
    """A curves CSV with a size and a parameters column (as ``python -m analysis fit`` writes a scale
    campaign's), its seeds in ``seed`` and, where there, each run's base-model build in ``build_col``:
    every row checked as ``scalefit fit`` checks them."""
    df = pd.read_csv(path) if Path(path).is_file() else None
    if df is not None and params_col not in df.columns:
        raise FitError(f"{path}: no column {params_col!r}: each row needs its size's parameter count "
                       f"(`python -m analysis fit CAMPAIGN` writes it for a scale campaign)")  # fmt: skip
    if df is not None and {size_col, "seed", build_col} <= set(df.columns):
        spans = df.groupby([size_col, "seed"])[build_col].nunique()
        if (spans > 1).any():
            (size, seed), n = spans[spans > 1].index[0], int(spans[spans > 1].iloc[0])
            raise FitError(f"{path}: size {size!r}: seed {seed} appears under {n} builds; a run is one seed of one "
                           "build, so number each build's seeds apart (a scale campaign runs seed S of build B "
                           "as B·1000+S)")  # fmt: skip
    curves = read_curves(path, x, y, size_col, "seed" if df is not None and "seed" in df.columns else None)
    if size_col not in df.columns:
        raise FitError(f"{path}: no column {size_col!r}: each row needs the size of the model that made it")
    n = df.groupby(df[size_col].astype(str))[params_col].agg(["min", "max"])
    varies = n[n["min"] != n["max"]]
    if len(varies):
        raise FitError(f"{path}: size {varies.index[0]!r} has more than one parameter count; one per size")
    builds = (
        {str(k): g[build_col].fillna("").astype(str).to_numpy() for k, g in df.groupby(size_col, sort=False)}
        if build_col in df.columns
        else {}
    )
    return size_data({k: (float(n.loc[k, "min"]), c, v, s, builds.get(k)) for k, (c, v, s) in curves.items()})
