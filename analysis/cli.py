"""Command line: ``python -m analysis fit CAMPAIGN`` and ``python -m analysis report RUN``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from runners.campaign.spec import Campaign


def cmd_fit(args: argparse.Namespace) -> int:
    from analysis.curves import progress
    from analysis.loo import read_curves, write_fit, write_report
    from analysis.outputs import written_whole
    from analysis.summary import summary
    from runners.campaign.load import expand, load_campaign

    camp = load_campaign(args.campaign)  # its fit: section parsed once, here (camp.fit, a FitSettings)
    complete = Path(f"artifacts/campaigns/{camp.name}/fit")
    out = Path(args.out) if args.out else complete
    ui, told = None, False
    if args.curves:
        curves = read_curves(Path(args.curves), camp.fit)
        with written_whole(out) as stage:  # a fit killed mid-write leaves the previous one whole
            table = write_fit(curves, stage, camp.fit, title=camp.name)
            sizes = _write_sizes(camp, curves, stage, out)
    else:
        # MLflow, imported for a store only: a curves.csv is fitted without it
        from runners.tracking.store import check_store, default_tracking_uri, existing_store

        uri = args.tracking_uri or default_tracking_uri()
        check_store(uri)  # a damaged store: one line, before a folder is made or a tag written, as `campaign` does
        uri = existing_store(uri)  # a missing one: likewise
        specs = expand(camp)
        runs = progress(camp.name, uri, specs)
        if runs.twice:
            print(
                f"warning: {len(runs.twice)} run(s) finished more than once in this store (two campaigns trained them"
                f" into it): {', '.join(runs.twice)}; the fit keeps the newest finished run of each",
                file=sys.stderr,
            )
        if not runs.complete:
            if not args.partial:
                raise ValueError(
                    f"campaign {camp.name} has not finished: {runs.text()}; fit it once they end (`python -m runners"
                    f" campaign {camp.name}` runs and resumes them), or pass --partial to fit what there is into"
                    f" {Path(args.out) if args.out else complete.with_name('fit-partial')} (the complete fit stays)"
                )
            out = Path(args.out) if args.out else complete.with_name("fit-partial")
            print(
                f"warning: a partial fit of campaign {camp.name}: {runs.text()}; fitted on the curves so far into"
                f" {out}, not logged to the campaign's parent run nor tagged on its runs (the complete fit, {complete},"
                " is left as it is)",
                file=sys.stderr,
            )
            told = True
        with written_whole(out, keep=("reports",)) as stage:
            current = {s.run_key for s in specs}
            table = write_report(camp.name, stage, camp.fit, tracking_uri=uri, current=current, partial=told)
            sizes = _write_sizes(camp, None, stage, out)
        ui = ui_address(camp.name, uri)
    print(summary(table, out, margin=camp.fit.margin, title=camp.name, ui=ui), end="")
    if sizes:
        print("\n".join(sizes))
    unfinished = int(table["unfinished"].sum()) if "unfinished" in table else 0
    if unfinished and not told:
        print(
            f"warning: {unfinished} run(s) have not finished (still running, or failed): fitted on their curves so far",
            file=sys.stderr,
        )
    for variant, said in zip(table["variant"], table.get("dropped", [""] * len(table)), strict=True):
        if isinstance(said, str) and said:  # bad points (analysis.loo.bad_points), each named in the table's note
            print(f"warning: {variant}: {said}", file=sys.stderr)
    return 0


def _write_sizes(camp: Campaign, curves: pd.DataFrame | None, stage: Path, out: Path) -> list[str]:
    """A scale campaign's fit across sizes (``analysis.sizes``) into ``stage``, its lines naming ``out``,
    where the folder will be; none for another campaign."""
    if camp.kind != "scale":
        return []
    import pandas as pd

    from analysis.sizes import write_sizes

    lines = write_sizes(pd.read_csv(stage / "curves.csv") if curves is None else curves, stage, camp.fit.x)
    return [line.replace(str(stage), str(out)) for line in lines]


def ui_address(campaign: str, uri: str) -> tuple[str, str]:
    """How to reach a campaign's curves in MLflow's UI and their address (``runners.campaign.ui``): on the
    tracking server, or on ``make ui``'s default port over a local store."""
    from runners.campaign import ui
    from runners.tracking import store

    exp_id = store.experiment_id(store.read_client(uri), campaign)
    if uri.startswith(("http://", "https://")):
        return "on the tracking server", ui.campaign_url(uri, exp_id)
    return "make ui, then open", ui.campaign_url("http://127.0.0.1:5000", exp_id)


def cmd_plan(args: argparse.Namespace) -> int:
    from analysis.loo import bad_points, load_curves, read_curves
    from analysis.planner import plan
    from runners.campaign.load import expand, load_campaign
    from runners.tracking.store import default_tracking_uri

    camp = load_campaign(args.campaign)
    cfg = camp.fit
    if args.margin is not None and not 0 < args.margin < 1:
        raise ValueError(f"--margin {args.margin}: expected a difference in pass rate in (0, 1), e.g. 0.02")
    if args.curves:
        curves = read_curves(Path(args.curves), camp.fit)
    else:
        uri = args.tracking_uri or default_tracking_uri()
        curves = load_curves(camp.name, uri, {s.run_key for s in expand(camp)})
    curves, dropped = bad_points(curves, cfg.x)
    for why in dropped["why"]:
        print(f"warning: left out: {why}", file=sys.stderr)
    print(plan(curves, cfg.x, args.margin if args.margin is not None else cfg.margin, cfg.last_k).text())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from analysis.report import write_run_report
    from runners.tracking.store import check_store, default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    check_store(uri)  # a damaged store: one line, before a report is written or logged, as `campaign` does
    out = Path(args.out) if args.out else None
    path = write_run_report(args.run, out, tracking_uri=uri, experiment=args.experiment)
    print(f"report → {path} (also logged to the run under report/)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis", description="Turn campaigns into tables and plots.")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser(
        "fit",
        help="fit every variant of a campaign from MLflow and write the LOO table",
        description="Pull every run's validation curve from MLflow (full history), fit each variant "
        "with scalefit (seeds pooled, bootstrap intervals), compare with the baseline by the paper's "
        "rule, write CSV + Markdown + plot, and log them to the campaign's parent run.",
    )
    f.add_argument("campaign", help="campaign file or name in experiments/campaigns")
    f.add_argument("--out", help="output folder (default artifacts/campaigns/NAME/fit)")
    f.add_argument(
        "--curves",
        metavar="CSV",
        help="fit a published curves.csv (e.g. results/loo-gpu/curves.csv) instead of reading MLflow",
    )
    f.add_argument(
        "--partial",
        action="store_true",
        help="fit a campaign whose runs have not all finished, on the curves so far, into "
        "artifacts/campaigns/NAME/fit-partial (the complete fit is left as it is; nothing is logged to MLflow)",
    )
    f.add_argument("--tracking-uri", help="MLflow tracking URI (default MLFLOW_TRACKING_URI or ./mlflow.db)")
    f.set_defaults(func=cmd_fit)
    pl = sub.add_parser(
        "plan",
        help="seed planner: seed spread, evaluation noise, the smallest difference the seeds resolve, seeds needed",
        description="Read a campaign's recorded curves (MLflow, or --curves) and print the seed-to-seed spread and "
        "evaluation noise, the smallest difference each comparison can resolve at the budget and at half of it "
        "(80%% power, two-sided 5%%), and how many seeds per arm a target margin needs.",
    )
    pl.add_argument("campaign", help="campaign file or name in experiments/campaigns")
    pl.add_argument("--curves", metavar="CSV", help="a published curves.csv instead of reading MLflow")
    pl.add_argument("--margin", type=float, help="target margin (default the campaign's fit.margin)")
    pl.add_argument("--tracking-uri", help="MLflow tracking URI (default MLFLOW_TRACKING_URI or ./mlflow.db)")
    pl.set_defaults(func=cmd_plan)
    r = sub.add_parser(
        "report",
        help="write a run's Markdown report with plots and anomalies, and log it to the run",
        description="Read one run from MLflow and write report.md + PNG plots (rewards, zero-std groups, loss, "
        "entropy, clip ratios, lengths and truncation, tokens, validation against compute, time and memory "
        "by phase) with the anomalies found and the numbers behind them; log them to the run under report/.",
    )
    r.add_argument("run", help="run id, run name such as baseline/seed0, or 'latest'")
    r.add_argument("--experiment", help="look the name up in this experiment (campaign) only")
    r.add_argument("--out", help="output folder (default artifacts/reports/NAME-ID)")
    r.add_argument("--tracking-uri", help="MLflow tracking URI (default MLFLOW_TRACKING_URI or ./mlflow.db)")
    r.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    from runners.permissions import restricted

    args = build_parser().parse_args(argv)
    try:
        with restricted():  # what it writes is private to its owner, or PRL_GROUP's, as a campaign's runs are
            return args.func(args)
    except ValueError as e:  # CampaignError, StoreError and GroupError are ValueErrors: each names the fix
        print(f"error: {e}", file=sys.stderr)
        return 2
