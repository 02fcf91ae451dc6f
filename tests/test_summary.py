"""What `analysis fit` prints (one line per variant within 100 columns, then where the full table,
the plot and the UI are) and the LOO table's estimates inside their own intervals: on the recorded
studies (results/*/) and on a real campaign fitted from MLflow."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.summary import WIDTH, summary

RESULTS = Path(__file__).resolve().parents[1] / "results"
TABLES = sorted(RESULTS.glob("*/loo_table.csv")) + sorted(RESULTS.glob("*/*/loo_table.csv"))
# an estimate and its interval as the Markdown table prints them: "0.910 [0.891, 0.962]",
# "ΔA -0.050, 90% interval [-0.048, +0.014]", "Δ -0.004 [-0.028, +0.016]"
ESTIMATE = re.compile(r"(?<![\w.])([+-]?\d+\.\d+)(?:, \d+% interval)? \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]")


def estimates(markdown: str) -> list[tuple[str, float, float, float]]:
    """(variant, estimate, lo, hi) of every estimate printed with its interval in a LOO table."""
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| variant")]
    return [(r.split("|")[1].strip(), *map(float, m)) for r in rows for m in ESTIMATE.findall(r)]


def variant_lines(printed: str, table: pd.DataFrame) -> dict[str, str]:
    """Each variant's line of a summary (the one line that starts with its name)."""
    lines = printed.splitlines()
    out = {}
    for v in table["variant"]:
        mine = [line for line in lines if line.startswith(f"{v} ")]
        assert len(mine) == 1, f"{v}: {len(mine)} lines in\n{printed}"
        out[v] = mine[0]
    return out


def check_lines(printed: str, table: pd.DataFrame) -> None:
    """What a user reads off a variant's line: its A, and its call with the Δ and interval it rests on."""
    for v, line in variant_lines(printed, table).items():
        r = table.set_index("variant").loc[v]
        assert (f" {r['A']:.3f} " if pd.notna(r.get("A")) else " — ") in line, line  # no A: nothing fitted
        if v == "baseline":
            assert "reference" in line
            continue
        call = r["call"] if pd.notna(r.get("call")) else "cannot tell yet"  # a table from before calls: none made
        assert f"  {call}  " in line, line
        if pd.notna(r.get("call_delta")):
            assert f"{r['call_delta']:+.3f} [{r['call_lo']:+.3f}, {r['call_hi']:+.3f}]" in line


@pytest.fixture(scope="module")
def loo_cpu(tmp_path_factory) -> tuple[str, Path]:
    """The default campaign's recorded curves fitted as `analysis fit --curves` fits them: what it
    printed, and the folder it wrote."""
    from tests.conftest import run_in_process

    out = tmp_path_factory.mktemp("loo-cpu") / "fit"
    curves = RESULTS / "loo-cpu100" / "curves.csv"  # the 100-step default: its control decides by measurement
    res = run_in_process("analysis", "fit", "loo-cpu", "--curves", str(curves), "--out", str(out))
    assert res.returncode == 0, res.stderr
    return res.stdout, out


def test_the_default_campaigns_fit_prints_one_short_line_per_variant(loo_cpu):
    """The terminal gets a summary a person reads in ten seconds, not the Markdown table (rows of
    400-1,160 characters): every line within 100 columns, one per variant with its A, Δ and call,
    then the full table's and the plot's paths; the Markdown file keeps every reason."""
    printed, out = loo_cpu
    table = pd.read_csv(out / "loo_table.csv")
    assert max(len(line) for line in printed.splitlines()) <= WIDTH, printed
    assert not [line for line in printed.splitlines() if line.startswith("|")]  # no Markdown row
    check_lines(printed, table)
    # what decides it: no fit, its data (issue 58: before, "no fit; measured: worse" and no call)
    assert "no fit; bounded by its data" in variant_lines(printed, table)["control=think_6"]
    assert f"full table, every reason: {out / 'loo_table.md'}" in printed and (out / "loo_table.md").is_file()
    assert f"plot: {out / 'loo_curves.png'}" in printed and (out / "loo_curves.png").is_file()
    assert "MLflow UI: none (fitted from a curves.csv" in printed
    md = (out / "loo_table.md").read_text()
    assert max(len(line) for line in md.splitlines()) > 400  # the reasons are all there, in full


@pytest.mark.parametrize("path", TABLES, ids=[str(p.parent.relative_to(RESULTS)) for p in TABLES])
def test_every_recorded_table_summarises_within_100_columns(path):
    """Each recorded study's table (the columns `analysis fit` wrote then) in the summary: no line
    wider than 100 columns, none left out, the call and its Δ as the table has them."""
    table = pd.read_csv(path)
    ui = ("make ui, then open", "http://127.0.0.1:5000/#/experiments/3/runs?workflowType=machine_learning")
    printed = summary(table, path.parent, margin=0.02, title=path.parent.name, ui=ui)
    lines = printed.splitlines()
    assert lines[-1] == ui[1]  # the address alone on its line (one link, whatever its length)
    assert max(len(line) for line in lines[:-1]) <= WIDTH, printed
    check_lines(printed, table)


def test_every_estimate_the_loo_table_prints_lies_in_its_interval(loo_cpu):
    """A, ΔA, the calls' Δ and the measured Δ, each inside the interval printed beside it: an
    interval is widened to reach the fit shown where its resamples centre elsewhere. Before, the joint model's resamples
    refitted curves already drawn towards the campaign's B with that prior again, and loo-cpu's
    table printed `ΔA -0.050, 90% interval [-0.048, +0.014]`."""
    _, out = loo_cpu
    found = estimates((out / "loo_table.md").read_text())
    assert len(found) >= 15  # A's, ΔA's, the calls' and the measured differences'
    outside = [f"{v}: {x} not in [{lo}, {hi}]" for v, x, lo, hi in found if not lo <= x <= hi]
    assert not outside, outside


@pytest.mark.xdist_group("concurrent-campaign")  # the worker that holds the campaign runs it
def test_a_campaign_fitted_from_mlflow_prints_its_summary_and_its_ui_address(
    concurrent_campaign, monkeypatch, tmp_path_factory, cli
):
    """`make fit` over a real campaign's store: all it prints within 100 columns (the run reports it
    wrote, the summary), and the address of the campaign's curves in MLflow's UI on a line of its own
    (one link; it is longer than 100)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", concurrent_campaign["store"])
    monkeypatch.chdir(concurrent_campaign["root"])
    out = tmp_path_factory.mktemp("fit")  # a path as short as artifacts/campaigns/NAME/fit
    res = cli("analysis", "fit", str(concurrent_campaign["path"]), "--out", str(out))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    exp_id = MlflowClient(concurrent_campaign["store"]).get_experiment_by_name("concurrent").experiment_id
    assert lines[-2:][0] == "curves in MLflow's UI: make ui, then open"
    assert lines[-1].startswith(f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs?")
    table = pd.read_csv(out / "loo_table.csv")
    assert set(table["variant"]) == {"baseline", "loss=dapo", "sampling=uniform"}
    check_lines(res.stdout, table)
    assert max(len(line) for line in lines[:-1]) <= WIDTH, res.stdout
    assert f"full table, every reason: {out / 'loo_table.md'}" in res.stdout
    again = tmp_path_factory.mktemp("fit")  # a re-fit copies the reports the first one logged: quietly
    res = cli("analysis", "fit", str(concurrent_campaign["path"]), "--out", str(again))
    assert res.returncode == 0 and "Downloading artifacts" not in res.stderr, res.stderr
    reports = sorted(p.parent.name for p in (out / "reports").glob("*/report.md"))
    assert reports and sorted(p.parent.name for p in (again / "reports").glob("*/report.md")) == reports


def test_an_interval_reaches_its_estimate_by_widening_never_by_moving():
    """Resamples centred off the estimate (the joint fit's prior applied twice) give an interval that
    reaches the estimate and keeps the resamples' own end: a difference whose resamples hold 0 stays
    undecided however far the estimate sits from them, and one they exclude stays decided."""
    from scalefit.forecasts.uncertainty import interval_holding

    draws = np.random.default_rng(0).normal(0.03, 0.01, 4000)  # 90%: about [+0.014, +0.046]
    lo, hi = interval_holding(draws, -0.010, 0.9)
    assert lo == -0.010 and 0.04 < hi < 0.05  # widened to the estimate, 0 inside: no call
    lo, hi = interval_holding(draws, 0.030, 0.9)
    assert 0.0 < lo < 0.02 and 0.04 < hi < 0.05  # the estimate inside already: the resamples' interval
    lo, hi = interval_holding(draws, 0.070, 0.9)
    assert 0.0 < lo < 0.02 and hi == 0.070  # beyond them: reached, and the lower end is not moved up
