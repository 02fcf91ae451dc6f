"""Reasons as data (``scalefit.reasons``): a verdict's and a call's reasons are a kind and its numbers,
their text and their short form rendered from them in one place, and the terminal summary prints the
short form the table carries, never parsing the prose (issue 61, item 5). The margin ladder is one
function (``scalefit.ladder``) that calls and the slower-or-lower reading both read (item 6)."""

from __future__ import annotations

import ast
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.summary import summary
from runners.campaign.spec import fit_settings
from scalefit.data.synthetic import campaign_runs
from scalefit.errors import FitError
from scalefit.forecasts.interface import call_difference
from scalefit.forecasts.pooled import forecast_variants
from scalefit.forecasts.slower_or_lower import LATER_FACTOR, Separation
from scalefit.ladder import against, against_margin
from scalefit.models.sigmoid import fit_sigmoid
from scalefit.reasons import KINDS, Reason

ROOT = Path(__file__).resolve().parents[1]
TRUTH = {"baseline": (3000, 1.9, 0.70), "slower": (6000, 1.9, 0.70)}
BUDGET = 30_000.0


@pytest.fixture(scope="module")
def campaign():
    """A synthetic campaign fitted jointly on its first half, with a margin no forecast meets."""
    df = campaign_runs(TRUTH, seeds=2, c_max=BUDGET, n_points=31, drift_sd=0.004, seed_sd=0.004, seed=5)
    data = {v: (g["compute"].to_numpy(), g["value"].to_numpy(), g["seed"].to_numpy()) for v, g in df.groupby("variant")}
    settings = replace(fit_settings({"a_grid": "0.30:0.95:0.005", "eval_prompts": 1000}), margin=1e-3)
    upto, target = dict.fromkeys(TRUTH, BUDGET / 2), dict.fromkeys(TRUTH, BUDGET)
    return forecast_variants(data, settings, fit_upto=upto, target=target, n_resamples=60)


def test_a_verdicts_reasons_are_a_kind_and_its_numbers_and_render_their_text_and_short_form(campaign):
    fc = campaign.forecasts["baseline"]
    assert not fc.verdict.predictable and fc.verdict.reasons
    for r in fc.verdict.reasons:
        assert isinstance(r, Reason) and r.kind in KINDS, r
        assert all(isinstance(v, int | float) for v in r.numbers.values()), r.numbers
        assert str(Reason(r.kind, r.numbers, r.words, r.parts)) == r  # the text is its data's, rendered once
        assert pickle.loads(pickle.dumps(r)).numbers == r.numbers  # it travels to worker processes whole
    p = next(r for r in fc.verdict.reasons if r.kind == "p_within")  # a margin of 0.001: P is far below the level
    assert p.numbers["p"] == pytest.approx(fc.p_within) and p.numbers["margin"] == 1e-3
    assert p.short() == f"2x forecast within ±0.001 with p {fc.p_within:.2f}"
    assert fc.verdict.short() == fc.verdict.reasons[0].short()
    assert fc.verdict.text() == "not yet predictable: " + "; ".join(fc.verdict.reasons)  # the table's words


def test_a_call_made_for_want_of_a_fit_carries_its_reasons_as_data(campaign):
    fcs = campaign.forecasts
    slower = replace(fcs["slower"], no_band=[Reason("grid_edge", {"value": 0.95}, {"param": "A"})])
    call = call_difference(slower, fcs["baseline"], BUDGET)
    assert call.label == "cannot tell yet" and [r.kind for r in call.reasons] == ["arm_no_band"]
    assert call.reasons[0].parts[0].numbers == {"value": 0.95}
    assert call.short() == "A = 0.950 on its grid edge"
    said = "variant has no band (A = 0.950 is on the edge of its grid (the asymptote is not identified))"
    assert call.text(0.02) == f"cannot tell yet: {said}"  # the table's words, as before


def test_a_flat_curves_fit_error_keeps_its_reason_as_data():
    c = np.linspace(0, 1000, 12)
    with pytest.raises(FitError) as e:
        fit_sigmoid(c, 0.5 - 1e-5 * c)
    assert e.value.why.kind == "flat" and e.value.why.short() == "flat or falling"
    assert str(e.value).startswith("no sigmoid gain is identifiable: the curve ends at")


def test_the_summary_prints_the_short_form_the_table_carries_and_parses_no_prose(tmp_path):
    """The summary's short reason is the table's ``*_short`` cell, rendered from the reason's data:
    reworded prose changes nothing in it. Before, ``shorten`` regex-parsed the prose and printed
    whatever the words said."""
    short = "2x forecast within ±0.02 with p 0.55"
    table = pd.DataFrame(
        [
            {
                "variant": "baseline", "A": 0.7, "predictable": False, "p_within": 0.55,
                "predictability": "not yet predictable: reworded, so that no pattern finds the numbers",
                "predictability_short": short,
            },
            {
                "variant": "flat", "A": np.nan, "call": "cannot tell yet",
                "note": "no fit: reworded too", "note_short": "flat or falling",
                "call_text": "cannot tell yet: no fit: reworded too",
            },
        ]
    )  # fmt: skip
    lines = summary(table, tmp_path, margin=0.02).splitlines()
    assert any(line.endswith(f"reference, not yet predictable: {short}") for line in lines), lines
    assert any(line.startswith("flat ") and line.endswith("no fit: flat or falling") for line in lines), lines
    source = ast.parse((ROOT / "analysis" / "summary.py").read_text())
    imported = {a.name for n in ast.walk(source) if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
    assert "re" not in imported  # nothing in the summary parses a reason's words


def test_calls_and_the_slower_or_lower_reading_read_one_ladder():
    edges = (-0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.03)
    pairs = [(lo, hi) for lo in edges for hi in edges if lo <= hi]
    for lo, hi in pairs:
        side = against_margin(lo, hi, 0.02)
        sep = Separation(0.0, (lo, hi), False, 0.5, 1.0, (1.0, 1.0), 0.0, (0.0, 0.0), None, 0.02, 1.0)
        assert sep.ceiling == {"worse": "lower", "better": "higher", "within": "same", None: "cannot tell"}[side]
        later = (LATER_FACTOR ** (lo / 0.02), LATER_FACTOR ** (hi / 0.02))  # the same intervals, as compute ratios
        eff = {"below": "faster", "above": "slower", "within": "same", None: "cannot tell"}
        assert replace(sep, later_interval=later).efficiency == eff[against(*later, 1 / LATER_FACTOR, LATER_FACTOR)]
    assert replace(sep, ceiling_open=True).ceiling == "cannot tell"
    source = (ROOT / "scalefit" / "forecasts" / "slower_or_lower.py").read_text()
    assert "self.margin <= lo" not in source and "hi < -self.margin" not in source  # not written a second time
