"""The across-size forecast in words (``forecast_lines``: per size, the laws, the forecast and its verdict,
its own runs against it, the size trend) and as a plot (``plot_sizes``); as data it is its ``to_dict``. A
committed forecast's judgment in words (``judge_lines``) and as a plot (``plot_judged``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from scalefit.models.curve import sigmoid
from scalefit.sizes.builds import builds_lines, trend_lines
from scalefit.sizes.data import SizeData, reach_text
from scalefit.sizes.forecast import SizeForecast
from scalefit.sizes.judge import Committed


def forecast_lines(fc: SizeForecast) -> list[str]:
    """The forecast in words and numbers."""
    lo, hi = fc.interval("A")
    p_lo, p_hi = fc.passes.interval
    how = "jointly, one B for every size" if fc.joint_b else "one by one"
    if any(f.n_builds >= 2 for f in fc.fits):
        out = [f"per size (each build's sigmoid on its own seeds, fitted {how}; the size's parameters the mean over"
               " its builds, ± the between-build standard error):"]  # fmt: skip
    else:
        out = [f"per size (the sigmoid on its seeds pooled, fitted {how}; ± from leaving out a seed):"]
    out += [
        f"  {f.name:<10} N {f.params / 1e6:8.3f}M  A {f.theta['A']:.3f} ±{f.sd['A']:.3f}  "
        f"C_mid {np.exp(f.theta['logC']):.3g}  B {np.exp(f.theta['logB']):.2f}  R0 {f.theta['R0']:.3f}"
        f"  seeds {f.n_seeds}" + (f"  builds {f.n_builds}" if f.n_builds >= 2 else "")
        for f in fc.fits
    ]
    out += builds_lines(fc.fits, fc.name, fc.n_builds, fc.build_sd, fc.build_source, fc.build_applied,
                        fc.A_interval_builds, fc.level)  # fmt: skip
    out.append("forms across sizes (chosen by held-out error; fit quality beside it):")
    for c in fc.choices[:6]:
        mark = "*" if c is fc.choice else " "
        out.append(f" {mark} held-out RMSE {c.loso_rmse:.4f}  fit RSS {c.fit_rss:9.3f}  {c.label}")
    misfit = ", ".join(f"{p} {m.sd:.3g} (t, {m.dof} df)" for p, m in fc.misfit.items())
    out.append(f"misfit added (held-out, beyond the sizes' spread, shrunk towards the prior): {misfit}")
    passing = (
        f"passes {fc.passes.level:.3f} (the largest fitted size's A) at {fc.passes.compute:.3g} "
        f"[{p_lo:.3g}, {p_hi:.3g}] ({fc.passes.share:.0%} of draws pass it)"
        if fc.passes.share >= 0.5
        else f"does not pass {fc.passes.level:.3f} (the largest fitted size's A) in {1 - fc.passes.share:.0%} of draws"
    )
    out += [
        f"forecast of {fc.name} (N {fc.params / 1e6:.3f}M): A {fc.A:.3f} [{lo:.3f}, {hi:.3f}] ({fc.level:.0%});"
        f" {passing}",
        f"  {'predictable' if fc.verdict.predictable else 'not predictable'}: " + "; ".join(fc.verdict.reasons),
    ]
    if fc.actual is not None:
        out += actual_lines(fc.actual)
    if fc.trend:
        out += trend_lines(fc.trend)
    return out


def actual_lines(a: dict, one_build_band: bool = True) -> list[str]:
    """A size's own runs against its forecast (``actual.against_actual``'s record) in words."""
    so_far = not a["finished"]
    if a.get("A") is not None:
        where = "inside" if a["A_inside"] else "outside"
        own = f"its own A {a['A']:.3f} (error {a['A_error']:+.3f}, {where} the interval)"
    else:
        own = a.get("note", "") if so_far else f"its own fit failed ({a.get('note', '')})"
    evals = f"{a['points']} evaluations" + (" so far" if so_far else "")
    out = [f"  actual{' so far' if so_far else ''}: {own}; band holds {a['band_coverage']:.0%} of its {evals}"]
    if "band_coverage_by_build" in a:
        each = ", ".join(f"{b} {v:.0%}" for b, v in a["band_coverage_by_build"].items())
        against = "one build's band" if one_build_band else "the mean's band: the record holds no one-build band"
        out.append(f"  by build (each against {against}): {each}; mean {a['band_coverage_builds_mean']:.0%}")
    return out


def judge_lines(j: dict) -> list[str]:
    """A committed forecast's judgment (``judge.judge``'s record) in words."""
    c = j["committed"]
    lo, hi = c["A_interval"]
    verdict = {True: "predictable", False: "not predictable", None: "no verdict recorded"}[c.get("predictable")]
    out = [f"committed forecast of {j['size']} ({j['forecast']}): A {c['A']:.3f} [{lo:.3f}, {hi:.3f}] "
           f"({c['level']:.0%}); {verdict}",
           f"  its median against the mean curve: RMSE {j['rmse']:.3f} over {j['points']} evaluations"]  # fmt: skip
    out += actual_lines(j, j["one_build_band"])
    if j["beyond_forecast"]:
        out.append(f"  not judged: {j['beyond_forecast']} evaluations past the forecast's curve")
    return out + [f"  warning: {w}" for w in j["warnings"]]


def plot_sizes(data: Mapping[str, SizeData], fc: SizeForecast, path: str | Path) -> Path:
    """Every size's mean curve (points) and fit (line), the forecast's median and band, and the forecast
    size's own curve drawn over it when it exists."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(data)))
    by_name = {f.name: f for f in fc.fits}
    for color, (name, d) in zip(colors, data.items(), strict=True):
        c, v, _ = d.mean_curve()
        label = f"{name} ({d.params / 1e6:.2g}M, {d.n_builds} build{'s' if d.n_builds > 1 else ''})"
        if name == fc.name:
            ax.plot(c, v, "o-", color="crimson", ms=4, lw=1, label=f"{label}: actual{_so_far(fc.actual)}", zorder=5)
            continue
        ax.plot(c, v, "o", color=color, ms=3, alpha=0.7)
        f = by_name.get(name)
        if f is not None:
            grid = np.linspace(0, c.max(), 200)
            t = f.theta
            ax.plot(grid, sigmoid(grid, t["A"], np.exp(t["logB"]), np.exp(t["logC"]), t["R0"]), "-", color=color,
                    label=label)  # fmt: skip
    band = f"{fc.name}: forecast {fc.level:.0%} band"
    ax.fill_between(fc.compute, fc.lo, fc.hi, color="crimson", alpha=0.15, label=band)
    ax.plot(fc.compute, fc.curve, "--", color="crimson", label=f"{fc.name}: forecast, A {fc.A:.3f}")
    ax.axhline(fc.passes.level, color="gray", lw=0.8, ls=":")
    return _save(fig, ax, f"across sizes: fits, and the forecast of {fc.name}", path)


def plot_judged(committed: Committed, own: SizeData, j: dict, path: str | Path) -> Path:
    """The committed forecast's median and band (and one build's band, where recorded) with the size's runs
    over them as judged: its mean curve and each build's, where every run has reached on the committed curve."""
    plt = _pyplot()
    rec, c = committed.record, committed.compute
    own = own.compared(c[-1])
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.fill_between(c, rec["curve"]["lo"], rec["curve"]["hi"], color="crimson", alpha=0.15,
                    label=f"committed {rec['level']:.0%} band (the mean)")  # fmt: skip
    if committed.one_build:
        ob = committed.one_build
        ax.plot(c, ob["lo"], ":", color="crimson", lw=0.8, label="committed band of one build")
        ax.plot(c, ob["hi"], ":", color="crimson", lw=0.8)
    ax.plot(c, rec["curve"]["median"], "--", color="crimson", label=f"committed median, A {rec['A']:.3f}")
    if own.n_builds >= 2:
        for b, sub in own.by_build().items():
            cb, vb, _ = sub.mean_curve()
            ax.plot(cb, vb, ".-", lw=0.6, ms=3, alpha=0.6, label=f"build {b}")
    cm, vm, _ = own.mean_curve()
    ax.plot(cm, vm, "o-", color="black", ms=4, lw=1, label=f"{j['size']}: actual{_so_far(j)}", zorder=5)
    return _save(fig, ax, f"{j['size']}: the committed forecast and its runs", path)


def _so_far(a: dict | None) -> str:
    """A plot label's note on runs compared before they ended (``against_actual``'s record), else nothing."""
    if not a or a.get("finished", True):
        return ""
    return f" so far ({reach_text(a['compute_reached'])} of the compute)"


def _pyplot():
    """matplotlib's pyplot on the file backend (only the plots need it)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def _save(fig, ax, title: str, path: str | Path) -> Path:
    """Axes labelled and titled, the figure written to ``path`` (its folder made) and closed."""
    ax.set_xlabel("compute")
    ax.set_ylabel("mean@16")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    _pyplot().close(fig)
    return out
