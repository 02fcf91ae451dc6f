"""A forecast committed before its size ran, judged on the runs that came after (``judge``).

``python -m scalefit sizes --json`` writes a size's forecast (its curve and band, A and its interval, the
verdict) to commit before the size runs. Once it has run, ``judge`` reads that record as written and holds
the size's runs against it: the band's coverage of the mean curve's evaluations and of each build's, the
median's error, and, once the runs have ended, the size's own A (the one thing fitted) against the
committed A and interval. Nothing else is refitted, so the judgment is of the forecast that was
committed, not of what today's code would forecast. Evaluations past the committed curve's compute are
not judged; runs short of the other sizes' compute are judged so far, as ``actual`` says."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalefit.errors import FitError
from scalefit.sizes.actual import against_actual
from scalefit.sizes.data import SizeData, compute_reached
from scalefit.sizes.fits import A_GRID

REQUIRED = ("size", "A", "A_interval", "level", "curve")
CURVE = ("compute", "median", "lo", "hi")


@dataclass(frozen=True)
class Committed:
    """A size's forecast as committed (``SizeForecast.to_dict``), read from its JSON."""

    path: str
    record: dict[str, Any]

    @property
    def size(self) -> str:
        return str(self.record["size"])

    @property
    def compute(self) -> np.ndarray:
        return np.asarray(self.record["curve"]["compute"], float)

    @property
    def one_build(self) -> dict[str, Any] | None:
        """One build's band, which forecasts of several builds record (older records lack it)."""
        return self.record["curve"].get("one_build")

    def band(self, compute, n_runs=1, builds: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The committed band at ``compute`` (linear between its grid's computes), for the mean it was
        committed for; ``builds=1``: one build's band where recorded, else that mean's band (stricter for
        a build's curve, which varies more than the mean of several). ``n_runs`` is the record's."""
        curve = self.one_build if builds == 1 and self.one_build else self.record["curve"]
        c = np.atleast_1d(np.asarray(compute, float))
        return np.interp(c, self.compute, curve["lo"]), np.interp(c, self.compute, curve["hi"])


def read_committed(path: str | Path) -> Committed:
    """A committed size forecast, checked: one line naming what is missing or wrong."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FitError(f"{path}: no such file; give the JSON `python -m scalefit sizes --json` wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FitError(f"{path}: not a readable JSON file ({e})") from None
    missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
    if not missing and isinstance(record["curve"], dict):
        missing = [f"curve.{k}" for k in CURVE if k not in record["curve"]]
    if missing:
        raise FitError(f"{path}: no {', '.join(missing)}: not a size forecast; judge the JSON that "
                       "`python -m scalefit sizes --holdout SIZE --json` wrote")  # fmt: skip
    problem = _problem(record)
    if problem:
        raise FitError(f"{path}: {problem}; judge the JSON `python -m scalefit sizes --json` wrote, unedited")
    return Committed(str(path), record)


def _numbers(x: Any, n: int | None = None) -> bool:
    """Whether ``x`` is a list of finite numbers (of length ``n``)."""
    ok = isinstance(x, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in x)
    return ok and bool(np.isfinite(np.asarray(x, float)).all()) and (n is None or len(x) == n)


def _problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a record's fields, or None."""
    if not _numbers([record["A"]]):
        return f"A is {record['A']!r}, not a number"
    if not _numbers(record["A_interval"], 2) or record["A_interval"][0] > record["A_interval"][1]:
        return f"A_interval is {record['A_interval']!r}, not [lo, hi]"
    if not isinstance(record["level"], int | float) or not 0 < record["level"] < 1:
        return f"level is {record['level']!r}, not a number in (0, 1)"
    if record.get("predictable") not in (True, False, None):
        return f"predictable is {record['predictable']!r}, not true or false"
    curve = record["curve"]
    if not isinstance(curve, dict) or not _numbers(curve["compute"]) or len(curve["compute"]) < 2:
        return "curve.compute is not a list of finite computes"
    c = np.asarray(curve["compute"], float)
    if c[0] != 0 or np.any(np.diff(c) <= 0):
        return "curve.compute must start at 0 and rise"
    bad = [f"curve.{k}" for k in CURVE[1:] if not _numbers(curve[k], len(c))]
    one = curve.get("one_build")
    if one is not None:
        bad += [
            f"curve.one_build.{k}"
            for k in ("lo", "hi")
            if not isinstance(one, dict) or not _numbers(one.get(k), len(c))
        ]
    return f"{', '.join(bad)}: not {len(c)} numbers, one per compute of the curve" if bad else None


def judge(committed: Committed, data: Mapping[str, SizeData], size: str | None = None, a_grid=A_GRID) -> dict[str, Any]:
    """The committed forecast of ``size`` (default the record's) against that size's runs in ``data``: the
    record's verdict, how far the runs reach (against the other sizes' runs in ``data`` and the forecast's
    curve, whichever goes further), ``against_actual``'s comparison up to the forecast's last compute (its
    A fitted on all the size's runs), and warnings where the runs are not what the forecast was made for."""
    name = size or committed.size
    if name not in data:
        raise FitError(f"size {name!r} has no runs in the curves ({', '.join(data)}): judge the forecast once it "
                       "has run, or name its size with --size")  # fmt: skip
    own, end, rec = data[name], float(committed.compute[-1]), committed.record
    within = own.upto(end)
    if not (within.compute > 0).any():
        raise FitError(f"size {name!r} has no evaluation past compute 0 within the forecast's curve (to {end:g})")
    reached = min(1.0, compute_reached(data, name, at_least=end))
    median = (committed.compute, np.asarray(rec["curve"]["median"], float))
    actual, _ = against_actual(committed.band, name, own, median, float(rec["A"]), tuple(rec["A_interval"]), a_grid,
                               reached=reached, upto=end)  # fmt: skip
    return {
        "forecast": committed.path,
        "size": name,
        "committed": {k: rec.get(k) for k in ("A", "A_interval", "level", "predictable", "reasons")},
        "one_build_band": committed.one_build is not None,
        "beyond_forecast": len(own.compute) - len(within.compute),
        "warnings": _mismatches(rec, own),
        **actual,
    }


def _mismatches(rec: dict[str, Any], own: SizeData) -> list[str]:
    """Where the size's runs are not those the forecast was committed for: its band and A's interval are of
    the committed mean (of so many runs over so many builds), and of its parameter count."""
    out = []
    target = rec["builds"].get("target") if isinstance(rec.get("builds"), dict) else None
    runs, builds = rec["curve"].get("runs"), rec["curve"].get("builds", target)
    if runs is not None and own.n_seeds != runs or builds is not None and own.n_builds != builds:
        out.append(
            f"the forecast was committed for a mean of {runs or '?'} runs over {builds or '?'} build(s); "
            f"the curves hold {own.n_seeds} over {own.n_builds}: its band and A's interval are of that mean"
        )
    params = rec.get("parameters")
    if isinstance(params, int | float) and not np.isclose(params, own.params, rtol=1e-6):
        out.append(f"the forecast was made for {params:g} parameters; the curves' size has {own.params:g}")
    return out
