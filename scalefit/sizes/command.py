"""``python -m scalefit sizes CURVES.csv`` and ``python -m scalefit judge FORECAST.json CURVES.csv``: the
across-size subcommands, which the command line (``scalefit.cli``) adds to its parser. ``sizes`` fits every
size but the held-out one, forecasts it, backtests, and writes the plot and the JSON; ``judge`` holds a
forecast committed earlier against the size's runs."""

from __future__ import annotations

import functools
import sys
import time

from scalefit.data.outputs import check_writable, write_json
from scalefit.errors import FitError
from scalefit.models.grids import parse_grid
from scalefit.sizes.backtest import backtest_sizes
from scalefit.sizes.data import FINISHED_AT, compute_reached, reach_text, read_sizes
from scalefit.sizes.fits import A_GRID, fit_size
from scalefit.sizes.forecast import forecast_size
from scalefit.sizes.judge import judge, read_committed
from scalefit.sizes.laws import MIN_SIZES
from scalefit.sizes.report import forecast_lines, judge_lines, plot_judged, plot_sizes


def cmd_sizes(args) -> int:
    """``python -m scalefit sizes CURVES.csv``: fit every size but the held-out one, forecast it, backtest."""
    if args.builds is not None and args.builds < 1:
        raise FitError(f"--builds {args.builds}: give how many base-model builds its mean will average (1 or more)")
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    say = functools.partial(print, file=sys.stderr if args.json == "-" else sys.stdout)
    data = read_sizes(args.csv, args.x, args.y, args.size_col, args.params_col, args.build_col)
    target = args.holdout or list(data)[-1]
    if target not in data and args.params is None:
        raise FitError(f"--holdout {target!r} is not a size of {args.csv} ({', '.join(data)}); give --params N to "
                       "forecast a size that has no runs")  # fmt: skip
    if args.backtest_all and (target not in data or (reached := compute_reached(data, target)) < FINISHED_AT):
        ran = f": its runs reach {reach_text(reached)} of the others' compute" if target in data else " has no runs"
        raise FitError(f"--backtest-all: the held-out size {target!r}{ran}; it joins the backtest once its runs "
                       "have ended: leave the flag out until then")  # fmt: skip
    for name in data:
        if name != target and (reached := compute_reached(data, name)) < FINISHED_AT:
            say(f"warning: size {name!r}'s runs reach {reach_text(reached)} of the other sizes' compute: its fitted A "
                f"extrapolates a part of its curve; fit it once its runs end, or hold it out (--holdout {name}) to "
                "compare its runs so far with the forecast")  # fmt: skip
    kw = {"level": args.level, "tolerance": args.tolerance, "a_grid": args.a_grid}
    t0 = time.perf_counter()
    fits = {k: fit_size(k, d, a_grid=args.a_grid) for k, d in data.items() if k != target}
    fc = forecast_size(
        data, target, params=args.params, r0=args.r0, n_seeds=args.seeds, n_builds=args.builds, fits=fits, **kw
    )
    seconds = time.perf_counter() - t0
    say("\n".join(forecast_lines(fc)))
    say(f"(across-size fits and forecast: {seconds:.2f} s)")
    folds = data if args.backtest_all else {k: d for k, d in data.items() if k != target}
    if len(folds) > MIN_SIZES + 1:
        say("\n".join(backtest_sizes(folds, fits=fits, **kw).lines()))
    if args.plot:
        path = plot_sizes(data, fc, args.plot)
        say(f"plot: {path}")
    write_json(fc.to_dict(), args.json)
    return 0


def cmd_judge(args) -> int:
    """``python -m scalefit judge FORECAST.json CURVES.csv``: a committed forecast against the size's runs."""
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    say = functools.partial(print, file=sys.stderr if args.json == "-" else sys.stdout)
    committed = read_committed(args.forecast)
    parse_grid(args.a_grid, name="--a-grid", kind="step")
    data = read_sizes(args.csv, args.x, args.y, args.size_col, args.params_col, args.build_col)
    j = judge(committed, data, args.size, a_grid=args.a_grid)
    say("\n".join(judge_lines(j)))
    if args.plot:
        say(f"plot: {plot_judged(committed, data[j['size']], j, args.plot)}")
    write_json(j, args.json)
    return 0


def _add_columns(p) -> None:
    """The curves CSV's columns, as both subcommands read it."""
    p.add_argument("--x", default="compute/samples", help="compute column (default: compute/samples)")
    p.add_argument("--y", default="val/mean_at_16", help="pass-rate column (default: val/mean_at_16)")
    p.add_argument("--size-col", default="size", help="column naming each row's model size (default: size)")
    p.add_argument("--params-col", default="parameters", help="column of its parameter count (default: parameters)")
    p.add_argument("--build-col", default="build", help="column of each run's base-model build, where the CSV has "
                   "one (default: build); a size of several builds is fitted build by build")  # fmt: skip


def add_parser(sub) -> None:
    """The ``sizes`` and ``judge`` subcommands of ``python -m scalefit``."""
    p = sub.add_parser(
        "sizes",
        help="fit curves across model sizes and forecast a held-out size",
        description="Per size the sigmoid; across sizes A, C_mid and B as functions of parameter count N, their "
        "forms chosen by leave-one-size-out error; the held-out size's curve with a calibrated band, A with its "
        "interval, the compute at which it passes the largest fitted size's ceiling, and a verdict; then a "
        "leave-one-size-out backtest of the fitted sizes with its coverage.",
    )
    p.add_argument("csv", help="CSV with one row per evaluation, a size and a parameters column (and seed)")
    _add_columns(p)
    p.add_argument("--holdout", metavar="SIZE", help="the size to forecast (default: the largest); its runs, if any, "
                   "are compared with the forecast, never fitted")  # fmt: skip
    p.add_argument("--params", type=float, metavar="N", help="the held-out size's parameter count, when it has no runs")
    p.add_argument("--r0", type=float, help="the held-out size's base-model value (default: its compute-0 rows, "
                   "else the sizes' R0 law)")  # fmt: skip
    p.add_argument("--seeds", type=int, help="seeds its measured mean will average (default: its own, else the median)")
    p.add_argument("--builds", type=int, help="base-model builds it will average (default: its own, else the median)")
    p.add_argument("--level", type=float, default=0.9, help="band and interval level (default: 0.9)")
    p.add_argument("--tolerance", type=float, default=0.03, help="held-out error and A half-width a predictable "
                   "forecast stays within (default: 0.03)")  # fmt: skip
    p.add_argument("--a-grid", default=A_GRID, metavar="LO:HI:STEP", help=f"per-size A grid (default: {A_GRID})")
    p.add_argument("--backtest-all", action="store_true", help="once the held-out size's runs have ended, "
                   "backtest every size, it too, each from all the others (default: the fitted sizes alone, as "
                   "before it ran)")  # fmt: skip
    p.add_argument("--plot", metavar="PATH.png", help="every size's points and fits, the forecast band, the actual")
    p.add_argument("--json", metavar="PATH|-", help="the forecast as JSON (its curve and band, A and its "
                   "interval, where it passes the largest fitted A, the verdict): commit it before the size "
                   "runs")  # fmt: skip
    p.set_defaults(func=cmd_sizes)
    p = sub.add_parser(
        "judge",
        help="judge a size's forecast committed before it ran against its runs",
        description="Read a forecast `sizes --json` wrote before the size ran, as written, and hold the size's "
        "runs against it: the band's coverage of its mean curve's evaluations and of each build's, the median's "
        "RMSE, and, once its runs have ended, its own A (fitted on its runs) against the committed A and "
        "interval. Runs short of the forecast's compute are judged so far; evaluations past it are not judged.",
    )
    p.add_argument("forecast", help="the committed forecast's JSON (python -m scalefit sizes --holdout SIZE --json)")
    p.add_argument("csv", help="CSV with the size's runs (and any other sizes'), as `sizes` reads it")
    _add_columns(p)
    p.add_argument("--size", help="the size to judge (default: the forecast's)")
    p.add_argument("--a-grid", default=A_GRID, metavar="LO:HI:STEP", help=f"its own A's grid (default: {A_GRID})")
    p.add_argument("--plot", metavar="PATH.png", help="the committed band and median with its runs over them")
    p.add_argument("--json", metavar="PATH|-", help="the judgment as JSON")
    p.set_defaults(func=cmd_judge)
