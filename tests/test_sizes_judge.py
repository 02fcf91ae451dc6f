"""``python -m scalefit judge``: a size's forecast committed before it ran (``sizes --json``), held against
the runs that came after as it was written (issue 62's targets are the committed forecast's): the band's
coverage of the mean curve and of each build's, its own A against the committed interval once its runs
end, so far before, and nothing judged past the committed curve."""

from __future__ import annotations

import json
import warnings

import pytest

from scalefit.cli import main
from tests.test_sizes_builds import A_of, N, runs


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _csv(df, path):
    df.rename(columns={"compute": "compute/samples", "value": "val/mean_at_16"}).to_csv(path, index=False)
    return str(path)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A study of 5 sizes x 3 builds x 2 seeds, and size e's forecast committed before its rows exist."""
    tmp = tmp_path_factory.mktemp("judge")
    df = runs()
    before = _csv(df.query("size != 'e'"), tmp / "before.csv")
    assert main(["sizes", before, "--holdout", "e", "--params", str(N["e"]), "--builds", "3",
                 "--json", str(tmp / "forecast.json")]) == 0  # fmt: skip
    return tmp, df, json.loads((tmp / "forecast.json").read_text())


def test_a_committed_forecast_is_judged_as_written_on_the_runs_that_came_after(study, capsys):
    tmp, df, record = study
    capsys.readouterr()
    after = _csv(df, tmp / "after.csv")
    assert main(["judge", str(tmp / "forecast.json"), after, "--json", str(tmp / "j.json"),
                 "--plot", str(tmp / "j.png")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    j = json.loads((tmp / "j.json").read_text())
    assert record["curve"]["one_build"]["runs"] == 2 and j["one_build_band"]  # one build's band is committed
    assert j["finished"] and j["points"] == 30 and j["beyond_forecast"] == 0, j
    assert j["A_error"] == pytest.approx(record["A"] - j["A"]) and j["committed"]["A"] == record["A"]
    lo, hi = record["A_interval"]
    assert j["A_inside"] == (lo <= j["A"] <= hi) and j["A_inside"], j  # the laws hold exactly here
    assert j["band_coverage"] >= 0.8 and sorted(j["band_coverage_by_build"]) == ["b0", "b1", "b2"], j
    assert f"committed forecast of e ({tmp / 'forecast.json'}): A {record['A']:.3f}" in out
    assert "by build (each against one build's band)" in out and (tmp / "j.png").stat().st_size > 10_000
    # the band judged is the committed one, not a forecast made again: a band moved up holds none of it
    moved = {**record, "curve": {**record["curve"], "lo": [v + 0.5 for v in record["curve"]["lo"]],
                                 "hi": [v + 0.6 for v in record["curve"]["hi"]]}}  # fmt: skip
    del moved["curve"]["one_build"]  # an older record: builds are held against the mean's band, and it says so
    (tmp / "moved.json").write_text(json.dumps(moved))
    assert main(["judge", str(tmp / "moved.json"), after, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    j = json.loads(out)
    assert j["band_coverage"] == 0 and j["band_coverage_builds_mean"] == 0 and not j["one_build_band"]
    assert "by build (each against the mean's band: the record holds no one-build band)" in err


def test_runs_short_of_the_forecast_are_judged_so_far_and_runs_past_it_are_not_judged(study, tmp_path, capsys):
    tmp, df, record = study
    early = _csv(df.query("size != 'e' or compute <= 0.4 * 153_600"), tmp_path / "early.csv")
    assert main(["judge", str(tmp / "forecast.json"), early, "--json", str(tmp_path / "j.json")]) == 0
    j = json.loads((tmp_path / "j.json").read_text())
    assert not j["finished"] and j["compute_reached"] == pytest.approx(0.4, abs=0.02) and j["A"] is None, j
    assert "actual so far: its runs reach 40%" in capsys.readouterr().out
    # one run stopped early: the curves are compared where every run has reached, not on means of the rest
    one = _csv(df.query("size != 'e' or seed != seed.max() or compute <= 0.4 * 153_600"), tmp_path / "one.csv")
    assert main(["judge", str(tmp / "forecast.json"), one, "--json", str(tmp_path / "one.json")]) == 0
    assert json.loads((tmp_path / "one.json").read_text())["points"] == j["points"] == 12
    # a forecast whose curve ends at half the budget judges e's evaluations up to there, and says what it left
    half = _csv(df.query("size != 'e' and compute <= 0.5 * 153_600"), tmp_path / "half.csv")
    assert main(["sizes", half, "--holdout", "e", "--params", str(N["e"]), "--json", str(tmp_path / "h.json")]) == 0
    capsys.readouterr()
    assert main(["judge", str(tmp_path / "h.json"), _csv(df, tmp_path / "all.csv")]) == 0
    out = capsys.readouterr().out
    assert "not judged: 90 evaluations past the forecast's curve" in out and "actual:" in out, out
    # its A is fitted on all of e's runs, which reach the other sizes' budget, not on the half the band covers
    own_a = float(out.split("its own A ")[1].split()[0])
    assert own_a == pytest.approx(A_of(N["e"]), abs=0.04), out


def test_a_run_just_started_and_runs_unlike_the_committed_mean_are_said_not_silently_judged(study, tmp_path, capsys):
    """A run with nothing past its first evaluation (launched or retried) carries only its R0: the curves are
    compared where the runs that started have reached. A CSV holding other runs than the forecast was made for
    (one build of three) is judged against the committed mean's band and interval, with a warning."""
    tmp, df, _ = study
    e = df["size"] == "e"
    last = e & (df["seed"] == df.loc[e, "seed"].max())
    fresh = _csv(df[~last | (df["compute"] == 0)], tmp_path / "fresh.csv")
    assert main(["judge", str(tmp / "forecast.json"), fresh, "--json", str(tmp_path / "j.json")]) == 0
    j = json.loads((tmp_path / "j.json").read_text())
    assert j["points"] == 30 and not j["finished"] and j["band_coverage"] >= 0.8, j
    assert main(["sizes", fresh, "--holdout", "e"]) == 0  # the forecast made again compares them the same way
    assert "band holds " in capsys.readouterr().out
    one = _csv(df[~e | (df["build"] == "b0")], tmp_path / "one.csv")
    assert main(["judge", str(tmp / "forecast.json"), one]) == 0
    assert ("warning: the forecast was committed for a mean of 6 runs over 3 build(s); the curves hold 2 over 1"
            in capsys.readouterr().out)  # fmt: skip


def test_bad_input_is_one_line_naming_the_fix(study, tmp_path, capsys):
    tmp, df, _ = study
    after = _csv(df, tmp_path / "after.csv")
    cases = {
        str(tmp_path / "none.json"): "no such file; give the JSON `python -m scalefit sizes --json` wrote",
        "fit": "no size, A_interval, level, curve: not a size forecast",
        "other": "size 'z' has no runs in the curves (a, b, c, d, e)",
    }
    (tmp_path / "fit").write_text(json.dumps({"A": 0.8, "verdict": {}}))  # what `scalefit fit --json` has
    record = json.loads((tmp / "forecast.json").read_text())
    edits = {
        "A_interval": ({"A_interval": [None, None]}, "A_interval is [None, None], not [lo, hi]"),
        "level": ({"level": 90}, "level is 90, not a number in (0, 1)"),
        "lo": ({"curve": {**record["curve"], "lo": record["curve"]["lo"][:-1]}}, "curve.lo: not 101 numbers"),
        "start": ({"curve": {**record["curve"], "compute": [1.0, *record["curve"]["compute"][1:]]}},
                  "curve.compute must start at 0 and rise"),
        "one": ({"curve": {**record["curve"], "one_build": {}}},
                "curve.one_build.lo, curve.one_build.hi: not 101 numbers"),
    }  # fmt: skip
    for name, (edit, message) in edits.items():
        (tmp_path / name).write_text(json.dumps({**record, **edit}))
        cases[name] = message
    (tmp_path / "other").write_text((tmp / "forecast.json").read_text().replace('"size": "e"', '"size": "z"'))
    for name, message in cases.items():
        path = name if name.startswith("/") else str(tmp_path / name)
        assert main(["judge", path, after]) == 2
        out, err = capsys.readouterr()
        assert err.startswith("error: ") and message in err and out == "", err
