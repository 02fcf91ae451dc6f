"""Command line: ``python -m scalefit fit|compare|demo|sizes|judge``."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalefit.data.curves_csv import read_curves
from scalefit.data.outputs import check_writable, write_json
from scalefit.decide.compare import compare_fits
from scalefit.defaults import DEFAULT_MARGIN
from scalefit.errors import FitError
from scalefit.forecasts.single import MAX_RESAMPLES, Forecast, forecast
from scalefit.models.base import CurveFit, CurveModel
from scalefit.models.grids import parse_grid
from scalefit.models.registry import make_model, model_names
from scalefit.sizes.command import add_parser as add_sizes


def _model(args: argparse.Namespace) -> CurveModel:
    """The ``--model`` with the settings given on the command line; a setting the model does not
    take (the sigmoid's ``--r0`` or ``--cmid-grid`` for the power law) is refused, naming the option."""
    cmid: Any = args.cmid_grid
    if cmid not in (None, "paper", "auto"):  # the sigmoid takes the two names itself
        cmid = parse_grid(cmid, name="--cmid-grid", kind="count")
    a_grid = parse_grid(args.a_grid, name="--a-grid", kind="step") if args.a_grid else None
    given = dict(r0=args.r0, exclude_below=args.exclude_below, fit_upto=args.fit_upto, a_grid=a_grid, cmid_grid=cmid)
    takes = make_model(args.model).get_params()  # refused in the options' words before make_model's
    foreign = [_option(k) for k, v in given.items() if v is not None and k not in takes]
    if foreign:
        own = ", ".join(_option(k) for k in given if k in takes)
        raise FitError(
            f"{', '.join(foreign)}: not a setting of the {args.model} model (its options: {own}); "
            "leave it out, or fit another --model"
        )
    return make_model(args.model, **given)


def _option(setting: str) -> str:
    return "--" + setting.replace("_", "-")


def _summary(name: str, f: CurveFit, fc: Forecast | None, extra: dict[str, Any]) -> str:
    def iv(p: str) -> str:
        if fc is None:
            return ""
        lo, hi = fc.interval(p)
        return f"  [{lo:.4g}, {hi:.4g}] ({fc.level:.0%} interval, correlated bootstrap)"

    r0 = f", R0 = {f.start_level:.3f}" if f.start_level is not None else ""
    lines = [
        f"{name}: {f.name} model, {f.n_points} points fitted, compute {f.compute.min():.4g}..{f.compute.max():.4g}{r0}",
        *(f"  {p:<7}{v:{'.3f' if p in ('A', 'B') else '.4g'}}{iv(p)}" for p, v in f.params.items()),
        f"  SSE    {f.sse:.4g}",
    ]
    if fc is not None:
        n = fc.noise
        lines.append(
            f"  noise  one evaluation deviates {n.sigma:.4f} (sd) from the mean curve, lag-1 correlation {n.phi:.2f}"
            + (f", evaluation's own sd {n.sigma_eval:.4f}" if n.sigma_eval is not None else "")
        )
        if fc.refitted_points is not None and fc.refitted_points < f.n_points:
            lines.append(
                f"  thinned  bands and backtests refit {fc.refitted_points:,} of the {f.n_points:,} fitted points"
                " (every k-th evaluation of each run; the fit above uses all; docs/scalefit.md)"
            )
        err = fc.expected_error
        lines.append(
            f"  backtests {len(fc.backtests)} at {fc.ratio:.2g}x: expected extrapolation error "
            + (f"{err:.4f}" if err is not None else "unknown")
            + f"; {fc.calibration.text()}"
        )
        lines.append(f"  verdict {fc.verdict.text()}")
    ex = f.extrapolation()
    if ex:
        lines.append(
            f"  extrapolation beyond {f.fit_upto:g}: {ex['n_heldout']} held-out points, MAE {ex['mae']:.4f}; "
            f"at {ex['final_compute']:.4g} predicted {ex['final_predicted']:.3f} vs observed "
            f"{ex['final_observed']:.3f} (error {ex['final_error']:+.4f})"
        )
        if "heldout" in extra:
            rows = extra["heldout"]
            last = max(rows, key=lambda r: r["compute"])
            lo, hi = last["prediction_band"]
            inside = sum(r["in_prediction_band"] for r in rows)
            lines[-1] += (
                f", {fc.level:.0%} prediction band [{lo:.3f}, {hi:.3f}]; "
                f"{inside}/{len(rows)} held-out points inside their band"
            )
    lines += [f"  warning: {w}" for w in f.warnings]
    return "\n".join(lines)


def _fit_one(name: str, c, v, seeds, model: CurveModel) -> CurveFit:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fit carries its warnings; they are printed with it
            return model.clone().fit(c, v, runs=seeds).result_
    except FitError as e:
        raise FitError(f"{name}: {e}") from None


def _forecast(f: CurveFit, args: argparse.Namespace) -> Forecast | None:
    if args.bootstrap == 0:
        return None
    return forecast(
        f,
        level=args.level,
        target=args.target,
        eval_prompts=args.eval_prompts,
        eval_samples=args.eval_samples,
        margin=args.margin,
        n_resamples=args.bootstrap,
        seed=args.seed,
    )


def cmd_fit(args: argparse.Namespace) -> int:
    check_writable(args.json, "--json")
    check_writable(args.plot, "--plot")
    model = _model(args)
    curves = read_curves(args.csv, args.x, args.y, args.run_col, args.seed_col)
    fits, fcs, results, texts, failed = {}, {}, {}, [], {}
    for name, (c, v, seeds) in curves.items():
        print(f"fitting {name} ({len(c)} points, {model.name} model)...", file=sys.stderr)
        try:
            f = _fit_one(name, c, v, seeds, model)
        except FitError as e:  # one bad curve of many: the others are still fitted and reported
            if len(curves) == 1:
                raise
            failed[name] = str(e)
            continue
        out = f.to_dict()
        extra: dict[str, Any] = {}
        fc = _forecast(f, args)
        if fc is not None:
            out["forecast"] = fc.to_dict()
            out["verdict"] = fc.verdict.to_dict()
            if args.target is not None:
                out["forecast"]["target"] = fc.at([args.target])[0]
            if "heldout" in out["forecast"]:  # every held-out point's bands, computed once
                extra["heldout"] = out["forecast"]["heldout"]
                final = max(extra["heldout"], key=lambda r: r["compute"])
                out["extrapolation"]["final_interval"] = final["prediction_band"]
        fits[name], results[name] = f, out
        if fc is not None:
            fcs[name] = fc
        texts.append(_summary(name, f, fc, extra))
    summary_stream = sys.stderr if args.json == "-" else sys.stdout
    if texts:
        print("\n".join(texts), file=summary_stream)
    if len(curves) == 1:
        payload = next(iter(results.values()))
    else:
        payload = {"runs": results, **({"failed": failed} if failed else {})}
    write_json(payload, args.json)
    if args.plot and fits:
        from scalefit.forecasts.plot import plot_fits

        path = plot_fits(fits, args.plot, forecasts=fcs, xlabel=args.x, ylabel=args.y)
        print(f"plot written to {path}", file=summary_stream)
    for message in failed.values():
        print(f"error: {message}", file=sys.stderr)
    if failed:
        done = f"; the other {len(fits)} are above" if fits else ""
        print(f"error: {len(failed)} of {len(curves)} curves not fitted{done}", file=sys.stderr)
        return 2
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    check_writable(args.json, "--json")
    model = _model(args)
    curves = read_curves(args.csv, args.x, args.y, args.run_col, args.seed_col)
    if len(curves) < 2:
        raise FitError(
            f"{args.csv} holds one curve ({next(iter(curves))!r}); comparison needs a {args.run_col!r} column "
            "with several runs"
        )
    if args.baseline not in curves:
        raise FitError(f"--baseline {args.baseline!r} is not a run in {args.csv}; runs are {', '.join(curves)}")
    fits = {name: _fit_one(name, c, v, seeds, model) for name, (c, v, seeds) in curves.items()}
    fcs = {name: _forecast(f, args) for name, f in fits.items()}
    base = fits[args.baseline]
    results = {}
    for name, f in fits.items():
        if name == args.baseline:
            continue
        pair = (fcs[args.baseline], fcs[name]) if fcs[name] is not None else None
        cmp = compare_fits(base, f, margin=args.margin, names=(args.baseline, name), forecasts=pair)
        results[name] = cmp.to_dict()
        print(f"{name}: {cmp.verdict}", file=sys.stderr if args.json == "-" else sys.stdout)
    write_json({"baseline": args.baseline, "comparisons": results}, args.json)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Fit the bundled example: synthetic curves from the paper's Table 1, with the sigmoid and then
    the power law on the same points."""
    from scalefit.data.synthetic import table1_frame

    out = Path(args.out)
    check_writable(out / "fit.json", "--out")
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "table1_curves.csv"
    table1_frame(seeds=1, c_max=16_000.0, n_points=161).query(
        "run in ['ScaleRL', 'ScaleRL-32k', 'ScaleRL-8gen', 'math+code/code']"
    ).to_csv(csv, index=False)
    print(f"example curves (paper App. Table 1 parameters + mean@16 noise, to 16k GPU-hours) → {csv}")
    base = ["fit", str(csv), "--x", "gpu_hours", "--y", "mean_at_16", "--exclude-below", "1500", "--fit-upto", "8000"]
    runs = [
        [*base, "--cmid-grid", "paper", "--eval-prompts", "1000"]
        + ["--json", str(out / "fit.json"), "--plot", str(out / "fit.png")],
        [*base, "--model", "power_law", "--bootstrap", "0"],  # App. A.7: its A overshoots the ceiling
    ]
    code = 0
    for argv in runs:
        print("python -m scalefit " + " ".join(argv))
        code = max(code, main(argv))
    return code


def _add_fit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("csv", help="CSV with one row per evaluation")
    p.add_argument("--x", required=True, help="compute column (GPU-hours, tokens, FLOPs, ...)")
    p.add_argument("--y", required=True, help="pass-rate column in [0, 1] (mean@16)")
    p.add_argument("--run-col", default="run", help="column naming the curve of each row (default: run)")
    p.add_argument(
        "--r0", type=float, help="sigmoid's pass rate at zero compute (default: value at the smallest compute)"
    )
    p.add_argument("--exclude-below", type=float, metavar="C", help="drop points with compute < C (paper: 1.5k GPU-h)")
    p.add_argument("--fit-upto", type=float, metavar="C", help="fit only points with compute <= C; report error beyond")
    p.add_argument(
        "--model",
        choices=model_names(),
        default="sigmoid",
        help="the curve fitted: sigmoid (ScaleRL's, the default) or power_law (A - D/C^B, the paper's comparison "
        "form, App. A.7: compared on predicted values at the budget, its A being no identified ceiling)",
    )
    p.add_argument(
        "--a-grid",
        metavar="LO:HI:STEP",
        help="A grid (default: the sigmoid's 0.45:0.80:0.005, the paper's; the power law's 0.45:1.00:0.005)",
    )
    p.add_argument(
        "--cmid-grid",
        metavar="paper|auto|LO:HI:N",
        help="sigmoid's C_mid grid: 'paper' = 100 values in [100, 40000] (GPU-hours); "
        "'auto' (default) = 100 values in [C_max/100, 4 C_max]; or LO:HI:N linear",
    )
    p.add_argument("--seed-col", help="column naming the seed of each row, when one run's rows come from several seeds")
    p.add_argument("--json", metavar="PATH|-", help="write results as JSON (- = stdout, summary goes to stderr)")
    p.add_argument(
        "--bootstrap",
        type=_resamples,
        default=1000,
        metavar="N",
        help="resamples of the correlated bootstrap behind every interval and band (0 = no intervals; default 1000)",
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap random seed")
    p.add_argument("--level", type=_level, default=0.9, help="coverage of intervals and bands (default 0.9)")
    p.add_argument(
        "--target",
        type=float,
        metavar="C",
        help="compute to predict (default: the last held-out point, else 2x the fitted compute); "
        "sets the extrapolation ratio of the backtests",
    )
    p.add_argument(
        "--eval-prompts",
        type=int,
        metavar="N",
        help="prompts behind each evaluation (mean@16 over N prompts): its binomial noise floors the noise estimate",
    )
    p.add_argument("--eval-samples", type=int, default=16, metavar="K", help="samples per prompt (default 16)")
    p.add_argument(
        "--margin", type=float, default=DEFAULT_MARGIN, help="the A margin a prediction must be within (paper: ±0.02)"
    )


def _resamples(text: str) -> int:
    n = int(text)
    if n != 0 and not 20 <= n <= MAX_RESAMPLES:
        raise argparse.ArgumentTypeError(f"must be 0 (off) or 20 to {MAX_RESAMPLES:,} resamples, got {text}")
    return n


def _level(text: str) -> float:
    x = float(text)
    if not 0.0 < x < 1.0:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), e.g. 0.9; got {text}")
    return x


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scalefit",
        description="Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to compute→pass-rate curves "
        "with the ScaleRL paper's procedure (grid over A and C_mid, least squares for B, then a continuous "
        "polish), or another --model (power_law: A - D/C^B), with a confidence band (the mean curve), a "
        "prediction band calibrated by backtests (where an evaluation lands) and a predictable / not yet "
        "predictable verdict.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fit", help="fit each curve of a CSV", description="Fit each curve of a CSV.")
    _add_fit_options(p)
    p.add_argument("--plot", metavar="PATH.png", help="draw data, fits, extrapolation, confidence and prediction bands")
    p.set_defaults(func=cmd_fit)
    p = sub.add_parser(
        "compare",
        help="compare runs against a baseline with the paper's rule",
        description="Higher A wins unless |ΔA| <= margin; then refit at the shared A and compare B. "
        "A fit on a grid edge or not yet predictable gives 'cannot decide', never a winner.",
    )
    _add_fit_options(p)
    p.add_argument("--baseline", required=True, help="value of the run column that is the baseline")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("demo", help="fit the bundled example curves", description=cmd_demo.__doc__)
    p.add_argument("--out", default="artifacts/fit-demo", help="output folder")
    p.set_defaults(func=cmd_demo)
    add_sizes(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run_cli(entry: Callable[[], int]) -> int:
    """A command line's exit code (``python -m scalefit``, ``runners``, ``analysis``); when the reader
    closes the pipe early (``| head``) it stops quietly with 141, as ``cat`` does, not with a
    BrokenPipeError traceback."""
    try:
        code = entry()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141
    return code
