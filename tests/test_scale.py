"""Across model size (issue 44): a scale campaign's file, expansion and bad input, and one real tiny
scale campaign on CPU whose runs MLflow groups by size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runners.campaign.load import expand, load_campaign, size_budgets
from runners.campaign.spec import CampaignError
from runners.task.sizes import parameter_count
from tests.campaigns import assert_ran_together, write_campaign
from tests.scale_cases import size_curves


def scale_campaign(path: Path, sizes, steps: int = 4, **extra) -> Path:
    """A scale campaign of the tiny runs of ``tests.campaigns`` at ``sizes``."""
    path = write_campaign(path, "scale", steps, {}, **{"kind": "scale", "sizes": sizes, **extra})
    doc = json.loads(path.read_text())
    doc["overrides"].pop("model.size")
    path.write_text(json.dumps(doc))
    return path


def test_a_scale_campaign_runs_one_recipe_at_every_size_each_with_its_budget(tmp_path):
    camp = load_campaign(scale_campaign(tmp_path / "s.yaml", {"pico": {"train.steps": 6}, "tiny": None}, seeds=[0, 1]))
    specs = expand(camp)
    assert [(s.variant, s.axis, s.value, s.seed) for s in specs] == [
        (f"size={n}", "size", n, seed) for n in ("pico", "tiny") for seed in (0, 1)
    ]
    assert [s.recipe.model.size for s in specs] == ["pico", "pico", "tiny", "tiny"]
    assert [s.recipe.train.steps for s in specs] == [6, 6, 4, 4]
    base = specs[0].recipe.flat()
    diff = {k for k, v in specs[2].recipe.flat().items() if base[k] != v} - {"name", "train.seed"}
    assert diff == {"model.size", "train.steps"}  # the size and its own budget, nothing else
    assert len({s.run_key for s in specs}) == 4
    lines = size_budgets(specs)
    assert len(lines) == 2 and "pico" in lines[0] and "6 steps = 48 completions" in lines[0]  # 2 prompts x 4
    assert f"{parameter_count('tiny') / 1e6:.2f}M parameters" in lines[1]
    listed = load_campaign(scale_campaign(tmp_path / "l.yaml", ["tiny", "pico"]))
    assert [s.variant for s in expand(listed)] == ["size=tiny", "size=pico"]  # a list: one budget for all


def test_size_runs_the_chosen_sizes_alone_and_refuses_one_it_lacks(tmp_path, cli):
    """The study's order (issue 44): the smaller sizes first, the largest after its forecast is
    committed, from the one campaign file; a size it lacks, or --size on a LOO campaign, is one line."""
    path = scale_campaign(tmp_path / "s.yaml", ["pico", "tiny", "small"], seeds=[0, 1])
    camp = load_campaign(path)
    assert [(s.value, s.seed) for s in expand(camp, only_sizes=("small", "pico"))] == [
        ("pico", 0),
        ("pico", 1),
        ("small", 0),
        ("small", 1),  # the file's order
    ]
    assert {s.run_key for s in expand(camp, only_sizes=("tiny",))} <= {s.run_key for s in expand(camp)}
    r = cli("runners", "campaign", str(path), "--size", "tiny", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "size=tiny" in r.stdout and "size=pico" not in r.stdout and "size=small" not in r.stdout
    r = cli("runners", "campaign", str(path), "--size", "large", "--dry-run")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "--size 'large' is not a size of scale; sizes: pico, tiny, small" in r.stderr
    bad = scale_campaign(tmp_path / "b.yaml", {"pico": {}, "tiny": {"train.stpes": 6}})
    with pytest.raises(CampaignError, match="'tiny': 'train.stpes' is not a recipe key"):
        expand(load_campaign(bad), only_sizes=("pico",))  # the size run later is checked now, not after a forecast
    zvf = {"zvf": {"key": "algorithm.zero_variance_filter", "values": [False]}}
    loo = write_campaign(tmp_path / "l.yaml", "l", 4, zvf)
    with pytest.raises(CampaignError, match="l is a loo campaign: leave --size out"):
        expand(load_campaign(loo), only_sizes=("tiny",))


@pytest.mark.parametrize(
    ("sizes", "extra", "message"),
    [
        (["pico", "huge"], {}, "sizes: 'huge' is not an embedded model size; choose from tiny, small, medium"),
        (["pico", "tinny"], {}, "did you mean 'tiny'"),
        (["tiny"], {}, r"a scale campaign needs two or more, e\.g\. sizes: \[nano"),
        (["tiny", "pico", "tiny"], {}, "sizes lists 'tiny' twice"),
        ("tiny", {}, "sizes = 'tiny': expected sizes: "),
        ({"tiny": {"model.size": "small"}, "pico": {}}, {}, "'tiny' sets model.size, which the size itself sets"),
        ({"tiny": [1], "pico": {}}, {}, r"'tiny' needs \{dotted.recipe.key: value"),
        (["tiny", "pico"], {"kind": "loo"}, "sizes is for kind: scale"),
        (["tiny", "pico"], {"controls": {"x": {"optim.lr": 1e-5}}}, "takes no controls"),
        (["tiny", "pico"], {"baseline_seeds": [3]}, "takes no baseline_seeds"),
    ],
)
def test_bad_sizes_are_one_line_naming_the_fix_before_anything_runs(tmp_path, sizes, extra, message):
    with pytest.raises(CampaignError, match=message):
        expand(load_campaign(scale_campaign(tmp_path / "bad.yaml", sizes, **extra)))


def test_a_size_written_twice_in_the_mapping_is_refused_not_merged(tmp_path):
    """YAML keeps the last of two equal keys silently: the second 'tiny' budget would replace the first."""
    path = tmp_path / "twice.yaml"
    scale_campaign(path, {"tiny": {}, "pico": {}})
    text = path.read_text().replace('"pico": {}', '"pico": {}, "tiny": {"train.steps": 9}')
    path.write_text(text)
    with pytest.raises(CampaignError, match=r"twice.yaml:1: the key 'tiny' is given twice \(first on line 1\)"):
        load_campaign(path)


def test_a_scale_campaign_needs_sizes_and_an_embedded_recipe(tmp_path):
    path = scale_campaign(tmp_path / "none.yaml", ["tiny", "pico"])
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in doc.items() if k != "sizes"}))
    with pytest.raises(CampaignError, match="kind scale needs the sizes to run"):
        load_campaign(path)
    doc["overrides"]["model.size"] = "small"
    path.write_text(json.dumps(doc))
    with pytest.raises(CampaignError, match="overrides sets model.size or model.path, which each of the sizes sets"):
        load_campaign(path)
    doc["overrides"].pop("model.size")
    doc["sizes"] = {"tiny": {"optim.rate": 1}, "pico": {}}
    path.write_text(json.dumps(doc))
    with pytest.raises(CampaignError, match="sizes: 'tiny': 'optim.rate' is not a recipe key"):
        expand(load_campaign(path))


@pytest.mark.parametrize("name", ["scale-probe", "scale-gpu"])
def test_the_gpu_scale_campaigns_expand(name):
    camp = load_campaign(name)
    specs = expand(camp)
    sizes = list(camp.sizes)
    assert len(sizes) >= 5 and max(map(parameter_count, sizes)) / min(map(parameter_count, sizes)) >= 30
    assert len(camp.seeds) == (1 if name == "scale-probe" else 3) and len(specs) == len(sizes) * len(camp.seeds)
    assert {s.recipe.model.dtype for s in specs} == {"bfloat16"}


def test_every_shipped_campaign_loads_and_expands():
    """A campaign file under experiments/campaigns that does not load would fail on the GPU machine,
    after its set-up: each is loaded and expanded here, with its runs' recipes resolved."""
    names = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "experiments/campaigns").glob("*.yaml"))
    assert {"loo-cpu", "loo-gpu7", "scale-gpu", "scale-gpu-penalty"} <= set(names)
    for name in names:
        assert expand(load_campaign(name)), name


@pytest.mark.slow
def test_a_tiny_scale_campaign_runs_end_to_end_and_mlflow_groups_its_runs_by_size(store, tmp_path):
    """Two sizes (pico built here, tiny the session's) on CPU, packed two at once: each run tagged with its
    size and parameter count and named by it; the sizes' base models built once before the runs; a re-run
    runs nothing."""
    from mlflow.tracking import MlflowClient

    from runners.campaign.runs import run_campaign

    path = scale_campaign(tmp_path / "s.yaml", {"pico": {"train.steps": 4}, "tiny": {}}, steps=2, parallel=2)
    lines: list[str] = []
    summary = run_campaign(path, log=lines.append)
    assert not summary["failures"] and summary["ran"] == 2, lines
    assert any(x.startswith("  size pico ") and "budget 4 steps = 32 completions" in x for x in lines), lines
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("scale")
    runs = client.search_runs([exp.experiment_id], "tags.`prl.run_id` != ''")
    assert_ran_together(lines, client, runs, interleaved=False)  # packed: both started before either ended
    got = {r.info.run_name: (r.data.tags["prl.size"], int(r.data.tags["prl.parameters"])) for r in runs}
    assert got == {"size=pico/seed0": ("pico", parameter_count("pico")), "size=tiny/seed0": ("tiny", 95552)}
    by_size = client.search_runs([exp.experiment_id], "tags.`prl.size` = 'pico'")
    assert [r.data.params["train.steps"] for r in by_size] == ["4"] and by_size[0].data.tags["prl.done"] == "1"
    again: list[str] = []
    assert run_campaign(path, log=again.append)["ran"] == 0 and "2 done, 0 stopped, 0 to run" in again
    from analysis.loo import load_curves
    from analysis.sizes import write_sizes

    (tmp_path / "fit").mkdir()
    (tmp_path / "fit" / "sizes.json").write_text("{}")  # an earlier fit's forecast
    said = write_sizes(load_curves("scale", store), tmp_path / "fit", "compute/samples")
    assert not (tmp_path / "fit" / "sizes.json").exists()  # not left to pass for this fit's
    table = pd.read_csv(tmp_path / "fit" / "sizes.csv")
    assert dict(zip(table["size"], table["parameters"], strict=False)) == {"pico": 27296, "tiny": 95552}
    assert "no forecast: forecasting tiny needs 3 other sizes with fitted curves, this campaign has 1" in said[1]


def colours_drawn(png: Path, sizes: int) -> list[str]:
    """Which of ``scalefit.sizes.plot_sizes``'s colours the 960x600 plot holds as drawn lines (over 100 pixels
    of exactly that colour; its points are translucent): each size's, smallest first, then the forecast's
    crimson. "fit" or "forecast" where drawn, "none" where not (the forecast size is drawn in crimson)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    img = plt.imread(png)
    assert img.shape[:2] == (600, 960), img.shape
    pixels = np.round(img[..., :3] * 255).astype(int).reshape(-1, 3)
    palette = [*plt.cm.viridis(np.linspace(0, 0.9, sizes))[:, :3], to_rgb("crimson")]
    counts = [int((pixels == np.round(np.asarray(c) * 255).astype(int)).all(1).sum()) for c in palette]
    return [("forecast" if i == sizes else "fit") if n > 100 else "none" for i, n in enumerate(counts)]


def test_analysis_fit_of_a_scale_campaign_forecasts_its_largest_size_from_the_others(tmp_path, capsys):
    """``python -m analysis fit`` on a scale campaign's curves (as load_curves gives them: variant size=NAME):
    the per-size table, then sizes.csv with each size's parameter count, the forecast of the largest with
    the backtest (sizes.md) and the plot (sizes.png)."""
    from analysis.cli import main
    from scalefit.data.synthetic import size_runs

    names = list(load_campaign("scale-gpu").sizes)[::-1]
    df = size_runs(
        {n: parameter_count(n) for n in names},
        lambda n: 0.95 - 0.9 * (n / 1e5) ** -0.35,
        lambda n: 3e4 * (n / 1e6) ** 0.3,
        lambda n: 1.8,
        lambda n: 0.3 + 0.03 * np.log(n / 1e5),
        seeds=3,
        c_max=153_600,
        n_points=31,
        n_prompts=300,
    )
    curves = size_curves(df).assign(run_id="size=" + df["size"] + df["seed"].astype(str))
    curves.to_csv(tmp_path / "curves.csv", index=False)
    assert main(["fit", "scale-gpu", "--curves", str(tmp_path / "curves.csv"), "--out", str(tmp_path / "fit")]) == 0
    out = capsys.readouterr().out
    assert "size=large" in out and "across sizes: 5 size(s)" in out and "forecast of large (N 25.791M)" in out
    assert "leave-one-size-out backtest: 4 size(s)" in out
    rows = [line for line in out.splitlines() if line.startswith("size=")]  # fitted, just not against a baseline
    assert len(rows) == len(names) and not any("no fit" in r for r in rows), out
    assert all("no baseline arm" in r for r in rows), out
    sizes = pd.read_csv(tmp_path / "fit" / "sizes.csv")
    assert set(zip(sizes["size"], sizes["parameters"], strict=True)) == {(n, parameter_count(n)) for n in names}
    assert "forecast of large" in (tmp_path / "fit" / "sizes.md").read_text()
    drawn = colours_drawn(tmp_path / "fit" / "sizes.png", len(names))
    assert drawn == ["fit", "fit", "fit", "fit", "none", "forecast"], drawn  # each size fitted, the largest forecast
    record = json.loads((tmp_path / "fit" / "sizes.json").read_text())  # the same forecast, as data
    assert record["size"] == "large" and record["A_interval"][0] <= record["A"] <= record["A_interval"][1]
    # the published sizes.csv (size and parameter columns added) refits to the same table
    published = str(tmp_path / "fit" / "sizes.csv")
    assert main(["fit", "scale-gpu", "--curves", published, "--out", str(tmp_path / "re")]) == 0
    assert (tmp_path / "re" / "sizes.csv").read_text() == (tmp_path / "fit" / "sizes.csv").read_text()
