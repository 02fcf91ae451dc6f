"""``analysis fit`` in parts (issue 43): load → fit → table → render → log, each testable alone, each
importing only the parts before it."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

from analysis.curves import bad_points, read_curves, spliced
from analysis.fits import Model, campaign_model
from analysis.render import to_markdown
from analysis.table import variant_row
from runners.campaign.spec import fit_settings
from tests.test_analysis import X, curves

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("curves", "fits", "table", "render", "loo")  # load, fit, table, render, log: each imports only earlier ones
RECORDED = ROOT / "results" / "loo-cpu" / "curves.csv"


def test_each_part_imports_only_the_parts_before_it():
    for i, part in enumerate(PARTS):
        tree = ast.parse((ROOT / "analysis" / f"{part}.py").read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        used = {n.module.removeprefix("analysis.") for n in imports if n.module.startswith("analysis.")}
        used |= {a.name for n in imports if n.module == "analysis" for a in n.names}
        later = used & set(PARTS[i + 1 :])
        assert not later, (part, later)


def test_load_alone_reads_a_published_file_and_names_what_no_fit_may_hold():
    settings = fit_settings({"x": "compute/samples"})
    df = read_curves(RECORDED, settings)
    assert {"run", "variant", "seed", "step", settings.x} <= set(df.columns) and len(df)
    bad = df.copy()
    bad.loc[bad.index[0], settings.x] = -1.0
    kept, dropped = bad_points(bad, settings.x)
    assert len(kept) == len(df) - 1 and "is negative" in dropped["why"].iloc[0]
    g = df[df["variant"] == "baseline"]
    assert spliced(g, settings.x) is None


def test_table_alone_makes_a_row_for_a_variant_without_a_fit():
    df = curves({"lr=nan": (2542, 1.92, 0.61)})
    model = Model({}, {}, {"lr=nan": "no fit: flat"}, "pooling none: each variant fitted on its own")
    row = variant_row("lr=nan", df, model, fit_settings({"x": X}), [])
    assert row.note == "no fit: flat" and row.seeds == 2 and row.fit_model.startswith("pooling none")


def test_fit_alone_fits_every_variant_with_the_settings_it_is_given():
    df = curves({"baseline": (2542, 1.92, 0.61), "lr=low": (2542, 1.92, 0.55)})
    settings = fit_settings({"x": X, "a_grid": "0.30:0.90:0.005", "pooling": "none", "margin": 0.03})
    model = campaign_model(df, settings, n_boot=40)
    assert set(model.fits) == {"baseline", "lr=low"} and not model.failed
    assert all(fc.margin == 0.03 for fc in model.forecasts.values())


def test_render_alone_writes_a_table_it_is_given():
    table = pd.DataFrame([{"variant": "baseline", "final_mean_at_16": 0.6, "note": "no fit: flat", "seeds": 2}])
    md = to_markdown(table)
    assert "| baseline | no fit: flat |" in md and "0.600" in md
