"""A forecast committed before its size ran, judged on the runs that came after (``judge``).

``python -m scalefit sizes --json`` writes a size's forecast (its curve and band, A and its interval, the
verdict) to commit before the size runs. Once it has run, ``judge`` reads that record as written and holds
the size's runs against it: the band's coverage of the mean curve's evaluations and of each build's, the
median's error, and, once the runs have ended, the size's own A (the one thing fitted) against the
committed A and interval. Nothing else is refitted, so the judgment is of the forecast that was
committed, not of what today's code would forecast. Runs past the committed curve's compute are not
judged; runs short of it are judged so far, as ``actual`` says."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalefit.errors import FitError
from scalefit.sizes.actual import against_actual
from scalefit.sizes.data import SizeData
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
    except (OSError, json.JSONDecodeError) as e:
        raise FitError(f"{path}: not a readable JSON file ({e})") from None
    missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
    missing += [f"curve.{k}" for k in CURVE if not missing and k not in record["curve"]]
    if missing:
        raise FitError(f"{path}: no {', '.join(missing)}: not a size forecast; judge the JSON that "
                       "`python -m scalefit sizes --holdout SIZE --json` wrote")  # fmt: skip
    c = np.asarray(record["curve"]["compute"], float)
    if len(c) < 2 or np.any(np.diff(c) <= 0) or any(len(record["curve"][k]) != len(c) for k in CURVE):
        raise FitError(f"{path}: its curve's computes must rise, with a median, lo and hi at each")
    return Committed(str(path), record)


def judge(committed: Committed, data: Mapping[str, SizeData], size: str | None = None, a_grid=A_GRID) -> dict[str, Any]:
    """The committed forecast of ``size`` (default the record's) against that size's runs in ``data``: the
    record's verdict, how far the runs reach along its curve, and ``against_actual``'s comparison."""
    name = size or committed.size
    if name not in data:
        raise FitError(f"size {name!r} has no runs in the curves ({', '.join(data)}): judge the forecast once it "
                       "has run, or name its size with --size")  # fmt: skip
    end = float(committed.compute[-1])
    own = data[name].upto(end)
    if not (own.compute > 0).any():
        raise FitError(f"size {name!r} has no evaluation past compute 0 within the forecast's curve (to {end:g})")
    rec = committed.record
    reached = min(1.0, own.shortest_run() / end)
    actual, _ = against_actual(committed.band, name, own, (committed.compute, np.asarray(rec["curve"]["median"])),
                               float(rec["A"]), tuple(rec["A_interval"]), a_grid, reached=reached)  # fmt: skip
    return {
        "forecast": committed.path,
        "size": name,
        "committed": {k: rec.get(k) for k in ("A", "A_interval", "level", "predictable", "reasons")},
        "one_build_band": committed.one_build is not None,
        "beyond_forecast": int(len(np.unique(data[name].compute[data[name].compute > end * (1 + 1e-9)]))),
        **actual,
    }
