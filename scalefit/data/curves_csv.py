"""Reading compute->value curves from a CSV, every row checked, for every command that reads one
(``python -m scalefit fit|compare|sizes``): an error names the row's line in the file and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from scalefit.errors import FitError

Curves = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def read_curves(path: str, x: str, y: str, run_col: str, seed_col: str | None = None) -> Curves:
    """Read a CSV into {run: (compute, value, seed of each row or None)}; one curve when there is
    no run column. With ``seed_col``, the rows of one run come from several seeds (runs of the
    same recipe), which the uncertainty treats as separate correlated series.

    Every error about a row names its line in the file, counting the header as line 1 (the
    first data row is line 2; blank lines count, as an editor shows them)."""
    p = Path(path)
    if not p.is_file():
        raise FitError(f"{path}: no such file")
    try:
        df = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise FitError(f"{path}: not a readable CSV ({e})") from None
    missing = [c for c in (x, y, *([seed_col] if seed_col else [])) if c not in df.columns]
    if missing:
        raise FitError(f"{path}: no column {', '.join(map(repr, missing))}; columns are {', '.join(df.columns)}")
    for col in (x, y):
        num = pd.to_numeric(df[col], errors="coerce")
        bad = num.isna() & df[col].notna()
        if bad.any():
            row = int(np.argmax(bad.to_numpy()))
            raise FitError(f"{path}: line {_line_of(p, row)}: column {col!r} is not a number: {df[col].iloc[row]!r}")
        df[col] = num
    keys = [c for c in (run_col, seed_col) if c and c in df.columns]
    for col, bad, what in (
        *((c, df[c].isna(), "is empty") for c in (x, y, *keys)),
        *((c, ~np.isfinite(df[c]) & df[c].notna(), "is not finite") for c in (x, y)),
        (x, df[x] < 0, "is negative: compute must be >= 0"),
        (y, (df[y] < 0) | (df[y] > 1), "lies outside [0, 1]: values are pass rates"),
    ):
        if bad.any():
            row = int(np.argmax(bad.to_numpy()))
            value = "" if what == "is empty" else f" ({df[col].iloc[row]:g})"
            raise FitError(f"{path}: line {_line_of(p, row)}: column {col!r}{value} {what}")
    groups = {str(k): g for k, g in df.groupby(run_col, sort=False)} if run_col in df.columns else {p.stem: df}
    for name, g in groups.items():  # each x of a series repeated: seeds pooled unnamed, or a file joined twice
        for _, series in g.groupby(seed_col) if seed_col else [(None, g)]:
            if len(series) > 1 and series[x].duplicated(keep=False).all():
                seeds = "" if seed_col else "several seeds under one run name (pass --seed-col) or "
                raise FitError(
                    f"{path}: {name}: every {x} value appears more than once in one series ({len(series)} rows,"
                    f" {series[x].nunique()} distinct): {seeds}a file joined twice; a curve has one row per evaluation"
                )
    return {
        k: (g[x].to_numpy(float), g[y].to_numpy(float), g[seed_col].to_numpy() if seed_col else None)
        for k, g in groups.items()
    }


def _line_of(path: Path, row: int) -> int:
    """The file line of data row ``row`` (0-based, as pandas read it): the header is line 1 and
    blank lines, which pandas skips, still count."""
    with path.open(encoding="utf-8", errors="replace") as f:
        seen = -1  # the header
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                if seen == row:
                    return line_no
                seen += 1
    return row + 2
