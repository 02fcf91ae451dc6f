"""Synthetic validation curves from the paper's published fits (App. Table 1).

Used by the demo, the tests and the benchmark: known parameters, realistic mean@16 noise.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scalefit.models.curve import sigmoid

# run: (C_mid, B, A) — ScaleRL App. Table 1.
TABLE1: dict[str, tuple[float, float, float]] = {
    "ScaleRL": (2542, 1.92, 0.610),
    "ScaleRL-32k": (11272, 1.89, 0.645),
    "ScaleRL-bs512": (2818, 1.77, 0.605),
    "ScaleRL-bs2048": (10909, 1.70, 0.645),
    "ScaleRL-8gen": (2542, 2.44, 0.585),
    "ScaleRL-24gen": (3054, 2.22, 0.590),
    "ScaleRL-32gen": (2936, 2.07, 0.595),
    "ScaleRL-Scout": (4242, 1.65, 0.710),
    "math+code/math": (2896, 2.05, 0.595),
    "math+code/code": (1675, 1.09, 0.615),
}


def mean_at_16_noise(p: np.ndarray, n_prompts: int, rng: np.random.Generator) -> np.ndarray:
    """Observed mean@16: per-prompt pass rates spread around p, then 16 Bernoulli samples each."""
    spread = rng.beta(4 * p[:, None] + 1e-3, 4 * (1 - p[:, None]) + 1e-3, size=(len(p), n_prompts))
    return rng.binomial(16, spread).mean(axis=1) / 16.0


def synthetic_curve(
    C_mid: float,
    B: float,
    A: float,
    *,
    R0: float = 0.30,
    c_max: float = 50_000.0,
    n_points: int = 101,
    n_prompts: int | None = 1000,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation points every c_max/(n_points-1) from 0; ``n_prompts=None`` gives the exact curve."""
    compute = np.linspace(0.0, c_max, n_points)
    p = sigmoid(compute, A, B, C_mid, R0)
    if n_prompts is None:
        return compute, p
    rng = np.random.default_rng(seed)
    return compute, mean_at_16_noise(p, n_prompts, rng)


def table1_frame(seeds: int = 1, **kwargs) -> pd.DataFrame:
    """Long table (run, seed, gpu_hours, mean_at_16) of every Table 1 curve."""
    rows = []
    for i, (run, (cm, b, a)) in enumerate(TABLE1.items()):
        for s in range(seeds):
            c, v = synthetic_curve(cm, b, a, seed=1000 * i + s, **kwargs)
            rows.append(pd.DataFrame({"run": run, "seed": s, "gpu_hours": c, "mean_at_16": v}))
    return pd.concat(rows, ignore_index=True)


def realistic_runs(
    C_mid: float,
    B: float,
    A: float,
    *,
    R0: float = 0.30,
    c_max: float = 16_000.0,
    n_points: int = 41,
    n_prompts: int = 1000,
    drift_sd: float = 0.01,
    drift_phi: float = 0.8,
    seed_sd: float = 0.01,
    seeds: int = 1,
    seed: int = 0,
) -> pd.DataFrame:
    """Runs of one recipe as a real campaign would log them: long table (seed, compute, value).

    Each run adds to the true curve a fixed offset (seed-to-seed, sd ``seed_sd``), a slowly
    drifting deviation (AR(1) over evaluations, stationary sd ``drift_sd``, lag-1 correlation
    ``drift_phi``: the policy wanders and successive evaluations share it) and the
    evaluation's own noise: ``n_prompts`` fixed validation prompts of different difficulty,
    16 samples each.
    """
    rng = np.random.default_rng(seed)
    compute = np.linspace(0.0, c_max, n_points)
    truth = sigmoid(compute, A, B, C_mid, R0)
    prompt_shift = rng.normal(0.0, 1.0, size=n_prompts)  # fixed validation set: easy and hard prompts
    frames = []
    for s in range(seeds):
        drift = np.empty(n_points)
        drift[0] = 0.0  # every run starts from the same base model
        innov = np.sqrt(1.0 - drift_phi**2) * drift_sd
        for t in range(1, n_points):
            drift[t] = drift_phi * drift[t - 1] + innov * rng.standard_normal()
        offset = rng.normal(0.0, seed_sd) * (compute > 0)
        p = np.clip(truth + drift + offset, 1e-4, 1 - 1e-4)
        logit = np.log(p / (1 - p))[:, None] + prompt_shift[None, :]
        per_prompt = 1.0 / (1.0 + np.exp(-logit))
        per_prompt *= (p / per_prompt.mean(axis=1))[:, None]  # keep the set's mean pass rate at p
        value = rng.binomial(16, np.clip(per_prompt, 0, 1)).mean(axis=1) / 16.0
        frames.append(pd.DataFrame({"seed": s, "compute": compute, "value": value, "truth": truth}))
    return pd.concat(frames, ignore_index=True)


def campaign_runs(
    variants: dict[str, tuple[float, float, float]], *, seeds: int = 2, seed: int = 0, **kwargs
) -> pd.DataFrame:
    """A campaign's runs: ``realistic_runs`` of each variant (name -> (C_mid, B, A)), every variant
    from one base model (R0 shared), as a long table (variant, seed, compute, value, truth)."""
    frames = []
    for i, (name, (cm, b, a)) in enumerate(variants.items()):
        df = realistic_runs(cm, b, a, seeds=seeds, seed=seed * 1000 + i, **kwargs)
        df.insert(0, "variant", name)
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    base = out["compute"] == 0
    out.loc[base, "value"] = out.loc[base, "value"].mean()  # one base model, one evaluation of it
    return out


def size_runs(
    sizes: dict[str, float],
    A_of,
    cmid_of,
    b_of,
    r0_of,
    *,
    seeds: int = 3,
    seed: int = 0,
    builds: int = 1,
    build_sd: float = 0.0,
    **kwargs,
) -> pd.DataFrame:
    """Runs of one recipe at several model sizes (name -> parameter count N), each size's curve from known
    laws (``A_of(N)``, ``cmid_of(N)``, ``b_of(N)``, ``r0_of(N)``): ``realistic_runs`` of each, as a long
    table (size, parameters, seed, compute, value, truth); each size's seeds start from one base model.

    ``builds`` > 1: each size has that many independent base-model builds, each moving the size's A by
    its own offset drawn with sd ``build_sd`` (the between-build spread, results/builds-gpu), ``seeds``
    seeds each (numbered build * 1000 + seed, as a campaign's ``builds: N`` numbers them), with columns
    ``build`` (b0, b1, ...) and ``build_A`` (that build's true A)."""
    frames = []
    for i, (name, n) in enumerate(sizes.items()):
        if builds <= 1:
            df = realistic_runs(cmid_of(n), b_of(n), A_of(n), R0=r0_of(n), seeds=seeds, seed=seed * 1000 + i, **kwargs)
            base = df["compute"] == 0
            df.loc[base, "value"] = df.loc[base, "value"].mean()
        else:
            offsets = np.random.default_rng([seed, i, 62]).normal(0.0, build_sd, builds)
            parts = []
            for b, off in enumerate(offsets):
                a = float(np.clip(A_of(n) + off, r0_of(n) + 0.05, 0.99))
                part = realistic_runs(cmid_of(n), b_of(n), a, R0=r0_of(n), seeds=seeds,
                                      seed=(seed * 1000 + i) * 100 + b + 1, **kwargs)  # fmt: skip
                base = part["compute"] == 0
                part.loc[base, "value"] = part.loc[base, "value"].mean()  # one base model a build
                part["seed"] += 1000 * b
                part["build"], part["build_A"] = f"b{b}", a
                parts.append(part)
            df = pd.concat(parts, ignore_index=True)
        df.insert(0, "size", name)
        df.insert(1, "parameters", float(n))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
